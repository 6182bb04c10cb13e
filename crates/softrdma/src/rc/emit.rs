//! Packet emission: a request packet built from its WQE (headers, payload copied behind them
//! or lent from the region to the gather, padding and ICRC), and the sealing of any packet
//! whose headers are known (shared with the responder's READ responses and with UC/UD).

use super::gather::{Gather, Piece};
use super::requester::{LocalErr, PacketAt, ReqEnv, local_err, position};
use super::sq::SendWqe;
use super::wr::{SendFlags, WcStatus, WrOpcode};
use crate::mem::{Access, AccessCtx, MemoryAccess};
pub use crate::params::{LEND_MAX_PIECES, LEND_MIN};
use crate::wire::packet::{pad_for, seal};
use crate::wire::{
    AtomicEthRepr, Bth, BthRepr, HeaderRepr, Headers, ICRC_LEN, Icrc, IcrcPrefix, OpKind, Opcode,
    Position, Psn, RethRepr, Transport,
};

/// Build packet `idx` of `w` at `psn` (a READ request asks for at most `limit` response
/// PSNs); AckReq is set on it with `force_ack`, on the message's last packet with
/// `end_ack`, and on every READ/atomic request. Returns (length in `buf`, AckReq set, PSNs
/// consumed). With `gather`, a payload of at least [`LEND_MIN`] bytes from memory that can be
/// lent is not copied: it goes to `gather` (see [`Gather`]).
pub(super) fn build_request(
    w: &SendWqe,
    at: PacketAt,
    env: ReqEnv<'_>,
) -> Result<(usize, bool, u32), LocalErr> {
    let ReqEnv {
        actx,
        mem,
        icrc,
        buf,
        mut gather,
    } = env;
    let off = u64::from(at.idx) * u64::from(at.mtu);
    let pos = position(at.idx, w.npkts);
    // The bulk of a large message: a middle packet (BTH only, AckReq only when forced), its
    // payload cut from the message's lend.
    if pos == Position::Middle
        && let Some(g) = gather.as_deref_mut()
    {
        let mid = Middle {
            seq: at.seq,
            off,
            psn: at.psn,
            dest_qpn: at.dest_qpn,
            mtu: at.mtu,
            ack_req: at.force_ack,
        };
        match build_middle_lent(w, mid, (actx, mem), icrc, buf, g)? {
            MiddleLent::Built(n) => return Ok((n, at.force_ack, 1)),
            // Copied below, without asking again.
            MiddleLent::NotLent => gather = None,
            MiddleLent::Other => {}
        }
    }
    if let Some((h, pkts)) = request_headers(w, &at, off)? {
        let n = emit_sealed(&h, 0, icrc, buf, |_| Ok::<(), LocalErr>(()))?;
        return Ok((n, true, pkts));
    }
    let h = data_headers(w, &at, pos)?;
    let ack_req = h.bth.ack_req;
    let plen = (u64::from(w.len) - off).min(u64::from(at.mtu)) as usize;
    let n = emit_payload(w, at.seq, &h, (off, plen), (actx, mem, icrc), (buf, gather))?;
    Ok((n, ack_req, 1))
}

/// The headers of a request without payload: a READ request (covering every remaining
/// response PSN, up to `at.limit`; a retry asks for the rest, or for a hole) or an atomic,
/// AckReq set, with the PSNs it consumes. `None` for a SEND or WRITE.
fn request_headers(
    w: &SendWqe,
    at: &PacketAt,
    off: u64,
) -> Result<Option<(HeaderRepr, u32)>, LocalErr> {
    let new = |op| HeaderRepr::new(BthRepr::new(op, at.dest_qpn, at.psn));
    let (mut h, pkts) = match w.op {
        WrOpcode::RdmaRead { remote_addr, rkey } => {
            let mut h = new(Opcode::RC_READ_REQUEST);
            let pkts = (w.npkts - at.idx).min(at.limit.max(1));
            let remaining = u64::from(w.len).saturating_sub(off);
            let len = remaining.min(u64::from(pkts) * u64::from(at.mtu));
            h.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(off),
                rkey,
                dma_len: len as u32,
            });
            (h, pkts)
        }
        WrOpcode::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            let mut h = new(Opcode::RC_COMPARE_SWAP);
            h.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
            (h, 1)
        }
        WrOpcode::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => {
            let mut h = new(Opcode::RC_FETCH_ADD);
            h.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
            (h, 1)
        }
        WrOpcode::LocalInv { .. } | WrOpcode::BindMw { .. } => {
            return Err(WcStatus::LocQpOpErr.into());
        }
        _ => return Ok(None),
    };
    h.bth.ack_req = true;
    Ok(Some((h, pkts)))
}

/// The headers of a SEND or WRITE packet at `pos` of its message: the RETH on a WRITE's
/// first, immediate data or the invalidated key and the solicited event on the last, AckReq
/// on the last with `at.end_ack` and on any with `at.force_ack`.
fn data_headers(w: &SendWqe, at: &PacketAt, pos: Position) -> Result<HeaderRepr, LocalErr> {
    let (kind, extra, reth) = match w.op {
        WrOpcode::Send => (OpKind::Send, Headers::NONE, None),
        WrOpcode::SendWithImm { .. } => (OpKind::Send, Headers::IMMDT, None),
        WrOpcode::SendWithInv { .. } => (OpKind::Send, Headers::IETH, None),
        WrOpcode::RdmaWrite { remote_addr, rkey } => {
            (OpKind::Write, Headers::NONE, Some((remote_addr, rkey)))
        }
        WrOpcode::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } => (OpKind::Write, Headers::IMMDT, Some((remote_addr, rkey))),
        _ => return Err(WcStatus::LocQpOpErr.into()),
    };
    let extra = if pos.ends() { extra } else { Headers::NONE };
    let opcode = Opcode::find(Transport::Rc, kind, pos, extra).ok_or(WcStatus::LocQpOpErr)?;
    let mut h = HeaderRepr::new(BthRepr::new(opcode, at.dest_qpn, at.psn));
    if pos.starts() {
        h.reth = reth.map(|(va, rkey)| RethRepr {
            va,
            rkey,
            dma_len: w.len,
        });
    }
    if pos.ends() {
        match w.op {
            WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. } => {
                h.immdt = Some(imm)
            }
            WrOpcode::SendWithInv { rkey } => h.ieth = Some(rkey),
            _ => {}
        }
        h.bth.se =
            w.flags.contains(SendFlags::SOLICITED) && (kind == OpKind::Send || h.immdt.is_some());
    }
    h.bth.ack_req = (pos.ends() && at.end_ack) || at.force_ack;
    Ok(h)
}

/// Emit headers `h` with the `plen` payload bytes of `w` (SQ sequence number `seq`) from
/// message offset `off`: lent into the gather when there is one and the bytes can be (at
/// least [`LEND_MIN`] of them, from memory that can be lent), else copied behind the headers.
/// Returns the packet's length in `buf`.
pub(super) fn emit_payload(
    w: &SendWqe,
    seq: u64,
    h: &HeaderRepr,
    (off, plen): (u64, usize),
    (actx, mem, icrc): (AccessCtx, &dyn MemoryAccess, &IcrcPrefix),
    (buf, gather): (&mut [u8], Option<&mut Gather>),
) -> Result<usize, LocalErr> {
    if let Some(g) = gather
        && !w.use_inline
        && plen >= LEND_MIN
        && lend_payload(w, (seq, off, plen), (actx, mem), g)?
    {
        return Ok(emit_lent(h, plen, icrc, buf, g)?);
    }
    emit_sealed(h, plen, icrc, buf, |dst| {
        copy_payload(w, off, dst, actx, mem)
    })
}

/// Copy `dst.len()` payload bytes of `w` from message offset `off` (inline data or the local
/// buffers) into `dst`.
pub(super) fn copy_payload(
    w: &SendWqe,
    off: u64,
    dst: &mut [u8],
    actx: AccessCtx,
    mem: &dyn MemoryAccess,
) -> Result<(), LocalErr> {
    let plen = dst.len();
    if w.use_inline {
        let s = off as usize;
        let src = w
            .inline
            .get(s..s + plen)
            .ok_or(LocalErr::Fail(WcStatus::LocLenErr))?;
        dst.copy_from_slice(src);
        return Ok(());
    }
    let ok = w.sges.for_each_piece(off, plen, |sge, soff, doff, n| {
        mem.read(
            actx,
            sge.lkey,
            sge.addr.wrapping_add(soff),
            &mut dst[doff..doff + n],
            Access::NONE,
        )
    });
    match ok {
        Ok(true) => Ok(()),
        Ok(false) => Err(LocalErr::Fail(WcStatus::LocProtErr)),
        Err(e) => Err(local_err(e)),
    }
}

/// Where a middle packet goes: its WQE's SQ sequence number, payload offset, PSN, the
/// destination QP, the path MTU and its AckReq bit.
#[derive(Clone, Copy)]
struct Middle {
    seq: u64,
    off: u64,
    psn: Psn,
    dest_qpn: u32,
    mtu: u32,
    ack_req: bool,
}

/// What [`build_middle_lent`] did.
enum MiddleLent {
    /// A packet of this many arena bytes (the payload is in the gather).
    Built(usize),
    /// The payload's memory is not lent: copy it.
    NotLent,
    /// Not a packet this path builds (the general one does).
    Other,
}

/// A middle packet of a WRITE or SEND from one scatter/gather entry, payload lent: the same
/// bytes as `build_request`'s general path, without its per-packet generality (the opcode
/// search, the header set, the piece walk). A middle packet carries exactly one MTU, so no
/// pad.
fn build_middle_lent(
    w: &SendWqe,
    at: Middle,
    (actx, mem): (AccessCtx, &dyn MemoryAccess),
    icrc: &IcrcPrefix,
    buf: &mut [u8],
    g: &mut Gather,
) -> Result<MiddleLent, LocalErr> {
    const BTH_LEN: usize = 12;
    let opcode = match w.op {
        WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
            Opcode::RC_SEND_MIDDLE
        }
        WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => Opcode::RC_WRITE_MIDDLE,
        _ => return Ok(MiddleLent::Other),
    };
    let plen = at.mtu as usize;
    let [sge] = w.sges.as_slice() else {
        return Ok(MiddleLent::Other);
    };
    let end = at.off.saturating_add(plen as u64);
    if w.use_inline
        || plen < LEND_MIN
        || pad_for(plen) != 0
        || end > u64::from(sge.length)
        || buf.len() < BTH_LEN + ICRC_LEN
    {
        return Ok(MiddleLent::Other);
    }
    g.clear();
    let ahead = u64::from(sge.length) - end;
    let addr = sge.addr.wrapping_add(at.off);
    let lent = g
        .lend(
            mem,
            Piece {
                tag: at.seq,
                actx,
                key: sge.lkey,
                iova: addr,
                len: plen,
                ahead,
                access: Access::NONE,
            },
        )
        .map_err(local_err)?;
    if !lent {
        return Ok(MiddleLent::NotLent);
    }
    let mut bth = BthRepr::new(opcode, at.dest_qpn, at.psn);
    bth.ack_req = at.ack_req;
    let (head, tail) = buf.split_at_mut(BTH_LEN);
    let sealed = bth
        .emit(&mut Bth::new_unchecked(&mut *head))
        .ok()
        .and_then(|()| {
            let gathered = &*g;
            icrc.compute_with(head, BTH_LEN + plen, |c| gathered.crc_update(c))
                .ok()
        });
    let Some(crc) = sealed else {
        g.clear();
        return Err(WcStatus::LocLenErr.into());
    };
    tail[..ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
    g.split = BTH_LEN;
    Ok(MiddleLent::Built(BTH_LEN + ICRC_LEN))
}

/// Lend the `plen` payload bytes at offset `off` of `w` (the WQE of SQ sequence number `seq`),
/// read as `actx` from `mem`, into `g`, each piece with the rest of its scatter/gather entry when that can be lent too
/// (the later packets of the message cut their payloads from it). Returns false (lending
/// nothing) when some piece must be copied instead.
fn lend_payload(
    w: &SendWqe,
    (seq, off, plen): (u64, u64, usize),
    (actx, mem): (AccessCtx, &dyn MemoryAccess),
    g: &mut Gather,
) -> Result<bool, LocalErr> {
    g.clear();
    let mut copy = false;
    let walked = w.sges.for_each_piece(off, plen, |sge, soff, _, n| {
        if copy || g.len() == LEND_MAX_PIECES {
            copy = true;
            return Ok(());
        }
        let ahead = u64::from(sge.length) - soff - n as u64;
        let addr = sge.addr.wrapping_add(soff);
        let piece = Piece {
            tag: seq,
            actx,
            key: sge.lkey,
            iova: addr,
            len: n,
            ahead,
            access: Access::NONE,
        };
        if !g.lend(mem, piece)? {
            copy = true;
        }
        Ok(())
    });
    let r = match walked {
        Ok(true) => Ok(!copy),
        Ok(false) => Err(LocalErr::Fail(WcStatus::LocProtErr)),
        Err(e) => Err(local_err(e)),
    };
    if r != Ok(true) {
        g.clear();
    }
    r
}

/// Emit headers, then pad and ICRC for a payload of `plen` bytes lent in `g.pieces`: the
/// packet on the wire is `buf[..g.split]`, the pieces, then the rest of the returned length.
/// On failure the pieces are given back.
pub(crate) fn emit_lent(
    h: &HeaderRepr,
    plen: usize,
    icrc: &IcrcPrefix,
    buf: &mut [u8],
    g: &mut Gather,
) -> Result<usize, WcStatus> {
    let pad = usize::from(pad_for(plen));
    let sealed = h.emit_padded(pad as u8, buf).ok().and_then(|hl| {
        if buf.len() < hl + pad + ICRC_LEN {
            return None;
        }
        buf[hl..hl + pad].fill(0);
        let (head, tail) = buf.split_at_mut(hl);
        let gathered = &*g;
        let crc = icrc.compute_with(head, hl + plen + pad, |c| {
            gathered.crc_update(c);
            c.update(&tail[..pad]);
        });
        tail[pad..pad + ICRC_LEN].copy_from_slice(&crc.ok()?.to_le_bytes());
        Some(hl)
    });
    match sealed {
        Some(hl) => {
            g.split = hl;
            Ok(hl + pad + ICRC_LEN)
        }
        None => {
            g.clear();
            Err(WcStatus::LocLenErr)
        }
    }
}

/// Emit headers, let `fill` write `plen` payload bytes behind them, then pad and seal.
pub(crate) fn emit_sealed<E: From<WcStatus>>(
    h: &HeaderRepr,
    plen: usize,
    icrc: &IcrcPrefix,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    let hl = h
        .emit_padded(pad_for(plen), buf)
        .map_err(|_| WcStatus::LocLenErr)?;
    if buf.len() < hl + plen {
        return Err(WcStatus::LocLenErr.into());
    }
    fill(&mut buf[hl..hl + plen])?;
    Ok(seal(icrc, buf, hl, plen).map_err(|_| WcStatus::LocLenErr)?)
}
