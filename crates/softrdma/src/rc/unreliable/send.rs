//! The UC and UD requester: packets built from send WQEs, each WQE complete once its last
//! packet is built.

use super::super::QpType;
use super::super::emit::emit_payload;
use super::super::gather::Gather;
use super::super::requester::{LocalErr, ReqOutput, Start};
use super::super::sq::SendSide;
use super::super::sq::SendWqe;
use super::super::wr::{SendFlags, WcStatus, WrOpcode};
use super::UdDest;
use crate::mem::{AccessCtx, MemoryAccess};
use crate::wire::{
    BthRepr, DethRepr, HeaderRepr, Headers, IcrcPrefix, OpKind, Opcode, Position, Transport,
};

/// What a UC or UD requester builds a packet with, besides its send queue.
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)] // holds the memory as a trait object
pub struct TxEnv<'a> {
    /// The service (UC or UD).
    pub qp_type: QpType,
    /// The clock.
    pub now: u64,
    /// The send queue drains: start no new WQE.
    pub sqd: bool,
    /// Who accesses memory.
    pub actx: AccessCtx,
    /// The memory.
    pub mem: &'a dyn MemoryAccess,
    /// UC: the QP's address vector (none: nothing is sent).
    pub icrc: Option<&'a IcrcPrefix>,
    /// UD: the QP's Q_Key, sent when a WQE's has its high bit set.
    pub qkey: u32,
}

impl SendSide {
    /// Produce the next UC or UD request packet into `buf`, or execute local WQEs. A WQE
    /// completes (successfully) once its last packet is built: nothing is acknowledged. UC
    /// packets go by the QP's address vector, UD packets each to their WQE's destination.
    /// With `gather`, payloads of memory that can be lent are (see [`Gather`]).
    pub fn poll_unreliable(
        &mut self,
        env: &TxEnv<'_>,
        buf: &mut [u8],
        mut gather: Option<&mut Gather>,
    ) -> ReqOutput {
        let TxEnv {
            qp_type: t,
            now,
            sqd,
            actx,
            mem,
            icrc,
            qkey: _,
        } = *env;
        if self.rnr_deadline.is_some() || self.halted {
            return ReqOutput::Idle;
        }
        loop {
            let Some(seq) = self.next_unfinished(sqd) else {
                return ReqOutput::Idle;
            };
            if !self.sq.get(seq).psn_assigned {
                match self.start_wqe(seq, now, actx, mem) {
                    Start::Started => {}
                    Start::Next => continue,
                    Start::Stop => return ReqOutput::Idle,
                }
            }
            let w = self.sq.get(seq);
            let idx = self.req_pkt;
            let built = match (t, w.ud) {
                (QpType::Ud, Some(d)) => build_ud((w, seq), d, env, (buf, gather.take())),
                (QpType::Uc, _) => match icrc {
                    Some(p) => {
                        let at = (idx, self.dest_qpn, self.mtu);
                        build_uc((w, seq), at, env, p, (buf, gather.take()))
                    }
                    None => return ReqOutput::Idle,
                },
                _ => Err(LocalErr::Fail(WcStatus::LocQpOpErr)),
            };
            match built {
                Ok(n) => {
                    let w = self.sq.get(seq);
                    let psn = w.first_psn.add(idx);
                    self.req_pkt += 1;
                    let end = psn.add(1);
                    // Nothing is outstanding: the packet is as good as acknowledged.
                    self.sent_end = end;
                    self.comp_psn = end;
                    if self.req_pkt >= w.npkts {
                        self.sq.get_mut(seq).done = Some(WcStatus::Success);
                        self.req_seq += 1;
                        self.req_pkt = 0;
                    }
                    return ReqOutput::Packet(n);
                }
                Err(LocalErr::Wait) => {
                    self.rnr_deadline = Some(now + super::super::requester::LOCAL_SUSPEND_WAIT_NS);
                    return ReqOutput::Idle;
                }
                Err(LocalErr::Fail(st)) => {
                    self.sq.get_mut(seq).done = Some(st);
                    self.halted = true;
                    return ReqOutput::Idle;
                }
            }
        }
    }
}

/// Packet `idx` of UC WQE `w` (SQ sequence number `seq`), to QP `dest_qpn` at path MTU `mtu`.
fn build_uc(
    (w, seq): (&SendWqe, u64),
    (idx, dest_qpn, mtu): (u32, u32, u32),
    env: &TxEnv<'_>,
    icrc: &IcrcPrefix,
    out: (&mut [u8], Option<&mut Gather>),
) -> Result<usize, LocalErr> {
    let (actx, mem) = (env.actx, env.mem);
    let pos = position(idx, w.npkts);
    let (kind, extra, reth) = match w.op {
        WrOpcode::Send => (OpKind::Send, Headers::NONE, None),
        WrOpcode::SendWithImm { .. } => (OpKind::Send, Headers::IMMDT, None),
        WrOpcode::RdmaWrite { remote_addr, rkey } => {
            (OpKind::Write, Headers::NONE, Some((remote_addr, rkey)))
        }
        WrOpcode::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } => (OpKind::Write, Headers::IMMDT, Some((remote_addr, rkey))),
        _ => return Err(LocalErr::Fail(WcStatus::LocQpOpErr)),
    };
    let extra = if pos.ends() { extra } else { Headers::NONE };
    let opcode = Opcode::find(Transport::Uc, kind, pos, extra)
        .ok_or(LocalErr::Fail(WcStatus::LocQpOpErr))?;
    let psn = w.first_psn.add(idx);
    let mut h = HeaderRepr::new(BthRepr::new(opcode, dest_qpn, psn));
    if pos.starts() {
        h.reth = reth.map(|(va, rkey)| crate::wire::RethRepr {
            va,
            rkey,
            dma_len: w.len,
        });
    }
    if pos.ends() {
        if let WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. } = w.op {
            h.immdt = Some(imm);
        }
        h.bth.se =
            w.flags.contains(SendFlags::SOLICITED) && (kind == OpKind::Send || h.immdt.is_some());
    }
    let off = u64::from(idx) * u64::from(mtu);
    let plen = (u64::from(w.len) - off).min(u64::from(mtu)) as usize;
    emit_payload(w, seq, &h, (off, plen), (actx, mem, icrc), out)
}

/// The one packet of UD WQE `w` (SQ sequence number `seq`) to `d`.
fn build_ud(
    (w, seq): (&SendWqe, u64),
    d: UdDest,
    env: &TxEnv<'_>,
    out: (&mut [u8], Option<&mut Gather>),
) -> Result<usize, LocalErr> {
    let (actx, mem, qp_qkey) = (env.actx, env.mem, env.qkey);
    let icrc = d.icrc();
    let (opcode, imm) = match w.op {
        WrOpcode::Send => (Opcode::UD_SEND_ONLY, None),
        WrOpcode::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_IMM, Some(imm)),
        _ => return Err(LocalErr::Fail(WcStatus::LocQpOpErr)),
    };
    let mut h = HeaderRepr::new(BthRepr::new(opcode, d.remote_qpn, w.first_psn));
    // IBTA 10.2.4: a Q_Key with the high bit set stands for the QP's own.
    let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
        qp_qkey
    } else {
        d.remote_qkey
    };
    h.deth = Some(DethRepr {
        qkey,
        src_qp: actx.qpn,
    });
    h.immdt = imm;
    h.bth.se = w.flags.contains(SendFlags::SOLICITED);
    emit_payload(w, seq, &h, (0, w.len as usize), (actx, mem, icrc), out)
}

fn position(idx: u32, n: u32) -> Position {
    match (idx == 0, idx + 1 >= n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}
