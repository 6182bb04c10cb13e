//! Unreliable Connected and Unreliable Datagram (IBTA 9.8, 9.8.3): the requester and the
//! receiver of the two services that send no acknowledgements and resend nothing.
//!
//! They share the QP's queues, state machine and completions with RC (as rxe shares them):
//! a send WQE completes when its last packet is built, a receive when its message is placed.
//!
//! * **UC** carries SEND and RDMA WRITE (with immediate) in PSN order from one peer. A PSN
//!   gap, or a packet out of the opcode sequence, drops the rest of the message in progress
//!   (a receive it had started goes back to the head of its queue, to be reused); the receiver
//!   resynchronises at the next first or only packet, whatever its PSN. A refused packet (no
//!   receive posted, a bad R_Key, a message longer than the receive) drops its message too.
//!   Nothing is NAKed and the QP survives, except for a local protection error on placement
//!   (the receive's own memory is gone), which ends the QP as on RC.
//! * **UD** carries one-packet SENDs (with immediate) to any QP named by the work request's
//!   [`UdDest`]; a DETH carries the Q_Key and the source QP. The receiver drops a datagram
//!   whose Q_Key differs from the QP's, that finds no receive posted or a full CQ, or whose
//!   receive is too short; every drop is counted ([`UnrelCounters`]). The receive buffer gets
//!   the 40-byte GRH area first ([`grh_area`]), then the payload.

use std::collections::VecDeque;
use std::net::IpAddr;

use super::requester::{
    LocalErr, ReqOutput, check_local, copy_payload, emit_sealed, execute_local, packets_for,
};
use super::responder::{InMsg, RecvSide, RespOutcome, scatter};
use super::rq::Srq;
use super::sq::SendSide;
use super::wr::{SendFlags, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode};
use super::{GRH_LEN, PostError, QpType};
use crate::mem::{Access, AccessCtx, AccessError, MemoryAccess};
use crate::wire::{
    BthRepr, DethRepr, HeaderRepr, Headers, IcrcContext, IcrcPrefix, IpHeader, OpKind, Opcode,
    Packet, Position, Transport,
};

/// A UD work request's destination (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The path: the address handle's IP/UDP context.
    pub av: IcrcContext,
    /// The destination QP (24 bits).
    pub remote_qpn: u32,
    /// The Q_Key to send with; with its high bit set, the QP's own Q_Key is sent instead.
    pub remote_qkey: u32,
}

/// Where a received datagram came from, as its IP header said: what a UD receive's GRH area
/// holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramSource {
    /// The IP header (source and destination, and for IPv4 the identification).
    pub ip: IpHeader,
    /// The packet's UDP payload length (BTH to ICRC).
    pub udp_payload_len: usize,
}

/// Hop limit written into a GRH area: a UDP socket does not see the received one, and Linux
/// sends with 64 unless told otherwise.
pub const GRH_TTL: u8 = 64;

/// The 40-byte GRH area of a UD receive for a packet from `src`, as rdma-core and rxe lay
/// it out for RoCEv2: for IPv4, 20 zero bytes and then the IPv4 header (version 4, no
/// options, the total length, the identification, Don't Fragment, TTL [`GRH_TTL`], UDP, a
/// valid header checksum, the addresses); for IPv6, the IPv6 header (payload length, next
/// header UDP, hop limit [`GRH_TTL`], the addresses). Traffic class and flow label are 0.
pub fn grh_area(src: &DatagramSource) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = (8 + src.udp_payload_len).min(usize::from(u16::MAX)) as u16;
    match src.ip {
        IpHeader::V4 {
            src: s,
            dst: d,
            id,
            dont_fragment,
        } => {
            let h = &mut g[20..];
            h[0] = 0x45;
            let total = udp_len.saturating_add(20);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
            if dont_fragment {
                h[6] = 0x40;
            }
            h[8] = GRH_TTL;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let csum = ipv4_checksum(h);
            h[10..12].copy_from_slice(&csum.to_be_bytes());
        }
        IpHeader::V6 { src: s, dst: d } => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17;
            g[7] = GRH_TTL;
            g[8..24].copy_from_slice(&s.octets());
            g[24..40].copy_from_slice(&d.octets());
        }
    }
    g
}

/// The Internet checksum of a 20-byte IPv4 header whose checksum field is zero.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The source address a GRH area names (what `ibv_init_ah_from_wc` reads), if it is a
/// well-formed IPv4 (version 4 in its last 20 bytes) or IPv6 area.
pub fn grh_source(g: &[u8; GRH_LEN]) -> Option<(IpAddr, IpAddr)> {
    if g[20] >> 4 == 4 && g[20] & 0xf == 5 {
        let s: [u8; 4] = g[32..36].try_into().ok()?;
        let d: [u8; 4] = g[36..40].try_into().ok()?;
        return Some((IpAddr::from(s), IpAddr::from(d)));
    }
    if g[0] >> 4 == 6 {
        let s: [u8; 16] = g[8..24].try_into().ok()?;
        let d: [u8; 16] = g[24..40].try_into().ok()?;
        return Some((IpAddr::from(s), IpAddr::from(d)));
    }
    None
}

/// What UC and UD receivers dropped, and why (each datagram or message counted once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnrelCounters {
    /// UD datagrams whose Q_Key was not the QP's.
    pub qkey_drops: u64,
    /// Messages dropped because no receive was posted (or the CQ was full).
    pub no_recv_drops: u64,
    /// Messages dropped because they were longer than the receive (UD: than the receive
    /// minus the GRH area).
    pub len_drops: u64,
    /// UC messages cut by a PSN gap or an opcode out of sequence (the rest of the message
    /// dropped).
    pub uc_gap_drops: u64,
    /// UC WRITEs refused (no remote-write right, a bad R_Key or range): dropped.
    pub access_drops: u64,
    /// Messages dropped because their memory was suspended (no RNR wait on UC and UD).
    pub suspended_drops: u64,
    /// Malformed packets (a UD datagram without a DETH or longer than the MTU, one whose
    /// origin the driver did not give, a UC packet of the wrong length).
    pub malformed: u64,
}

/// Check a work request against what a QP of type `t` accepts, before it is queued: UC
/// carries SEND and RDMA WRITE (with immediate) and local operations; UD carries SEND (with
/// immediate), needs a destination, and a message of at most the port's MTU (`mtu` bytes).
pub(super) fn check_post(t: QpType, wr: &SendWr<'_>, len: u64, mtu: u32) -> Result<(), PostError> {
    let ok = match t {
        QpType::Rc => return Ok(()),
        QpType::Uc => matches!(
            wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::RdmaWrite { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
                | WrOpcode::LocalInv { .. }
                | WrOpcode::BindMw { .. }
        ),
        QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }),
    };
    if !ok {
        return Err(PostError::InvalidArgument(match t {
            QpType::Ud => "a UD QP sends only SEND and SEND with immediate",
            _ => "a UC QP has no READ, atomic or SEND with Invalidate",
        }));
    }
    if t == QpType::Ud {
        let Some(d) = wr.ud else {
            return Err(PostError::InvalidArgument(
                "a UD work request needs a destination (address handle, QPN, Q_Key)",
            ));
        };
        if d.remote_qpn > 0x00ff_ffff {
            return Err(PostError::InvalidArgument("remote QPN wider than 24 bits"));
        }
        if len > u64::from(mtu) {
            return Err(PostError::MessageTooLong { len, max: mtu });
        }
    }
    Ok(())
}

impl SendSide {
    /// Produce the next UC or UD request packet into `buf`, or execute local WQEs. A WQE
    /// completes (successfully) once its last packet is built: nothing is acknowledged. UC
    /// packets use the QP's address vector `icrc` (none: nothing is sent); UD packets each
    /// their WQE's destination, with the Q_Key `qkey` when the WQE's has its high bit set.
    #[allow(clippy::too_many_arguments)]
    pub fn poll_unreliable(
        &mut self,
        t: QpType,
        now: u64,
        sqd: bool,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        icrc: Option<&IcrcPrefix>,
        qkey: u32,
        buf: &mut [u8],
    ) -> ReqOutput {
        if self.rnr_deadline.is_some() || self.halted {
            return ReqOutput::Idle;
        }
        loop {
            if self.req_seq < self.sq.head {
                self.req_seq = self.sq.head;
                self.req_pkt = 0;
            }
            if self.req_seq >= self.sq.tail {
                return ReqOutput::Idle;
            }
            let seq = self.req_seq;
            let w = self.sq.get(seq);
            if w.done.is_some() {
                self.req_seq += 1;
                self.req_pkt = 0;
                continue;
            }
            if !w.psn_assigned {
                if sqd {
                    return ReqOutput::Idle;
                }
                if w.op.is_local() {
                    let st = execute_local(w, actx, mem);
                    if let (WcStatus::Success, WrOpcode::LocalInv { rkey }) = (st, w.op) {
                        self.invalidated.push(rkey);
                    }
                    let w = self.sq.get_mut(seq);
                    w.done = Some(st);
                    w.psn_assigned = true;
                    if st != WcStatus::Success {
                        self.halted = true;
                        return ReqOutput::Idle;
                    }
                    continue;
                }
                match check_local(w, actx, mem) {
                    Ok(()) => {}
                    Err(LocalErr::Wait) => {
                        self.rnr_deadline = Some(now + super::requester::LOCAL_SUSPEND_WAIT_NS);
                        return ReqOutput::Idle;
                    }
                    Err(LocalErr::Fail(st)) => {
                        self.sq.get_mut(seq).done = Some(st);
                        self.halted = true;
                        return ReqOutput::Idle;
                    }
                }
                let (mtu, first) = (self.mtu, self.next_psn);
                let w = self.sq.get_mut(seq);
                w.first_psn = first;
                w.npkts = packets_for(u64::from(w.len), mtu);
                w.psn_assigned = true;
                self.next_psn = first.add(w.npkts);
                self.req_pkt = 0;
            }
            let w = self.sq.get(seq);
            let idx = self.req_pkt;
            let built = match (t, w.ud) {
                (QpType::Ud, Some(d)) => {
                    let prefix = IcrcPrefix::new(d.av);
                    build_ud(w, d, qkey, actx, mem, &prefix, buf)
                }
                (QpType::Uc, _) => match icrc {
                    Some(p) => build_uc(w, idx, self.dest_qpn, self.mtu, actx, mem, p, buf),
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
                    self.rnr_deadline = Some(now + super::requester::LOCAL_SUSPEND_WAIT_NS);
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

/// Packet `idx` of UC WQE `w`.
#[allow(clippy::too_many_arguments)]
fn build_uc(
    w: &super::sq::SendWqe,
    idx: u32,
    dest_qpn: u32,
    mtu: u32,
    actx: AccessCtx,
    mem: &dyn MemoryAccess,
    icrc: &IcrcPrefix,
    buf: &mut [u8],
) -> Result<usize, LocalErr> {
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
    emit_sealed(&h, plen, icrc, buf, |dst| {
        copy_payload(w, off, dst, actx, mem)
    })
}

/// The one packet of UD WQE `w` to `d`.
#[allow(clippy::too_many_arguments)]
fn build_ud(
    w: &super::sq::SendWqe,
    d: UdDest,
    qp_qkey: u32,
    actx: AccessCtx,
    mem: &dyn MemoryAccess,
    icrc: &IcrcPrefix,
    buf: &mut [u8],
) -> Result<usize, LocalErr> {
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
    emit_sealed(&h, w.len as usize, icrc, buf, |dst| {
        copy_payload(w, 0, dst, actx, mem)
    })
}

fn position(idx: u32, n: u32) -> Position {
    match (idx == 0, idx + 1 >= n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl RecvSide {
    /// Handle a UC or UD request packet addressed to this QP (see the module documentation
    /// for what is dropped). `cq` is the receive completion queue with its bound.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_unreliable(
        &mut self,
        t: QpType,
        pkt: &Packet<'_>,
        kind: OpKind,
        pos: Position,
        from: Option<&DatagramSource>,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        cq: (&mut VecDeque<WorkCompletion>, usize),
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        match t {
            QpType::Ud => self.receive_ud(pkt, kind, pos, from, actx, mem, srq, cq, c),
            QpType::Uc => self.receive_uc(pkt, kind, pos, actx, mem, srq, cq, c),
            QpType::Rc => RespOutcome::Ok,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn receive_ud(
        &mut self,
        pkt: &Packet<'_>,
        kind: OpKind,
        pos: Position,
        from: Option<&DatagramSource>,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        mut srq: Option<&mut Srq>,
        (cq, cq_cap): (&mut VecDeque<WorkCompletion>, usize),
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        let (Some(deth), Some(from)) = (pkt.hdr.deth, from) else {
            c.malformed += 1;
            return RespOutcome::Ok;
        };
        if kind != OpKind::Send || pos != Position::Only || pkt.payload.len() > self.mtu as usize {
            c.malformed += 1;
            return RespOutcome::Ok;
        }
        if deth.qkey != self.qkey {
            c.qkey_drops += 1;
            return RespOutcome::Ok;
        }
        if cq.len() >= cq_cap {
            c.no_recv_drops += 1;
            return RespOutcome::Ok;
        }
        let Some(wqe) = self.take_recv(srq.as_deref_mut()) else {
            c.no_recv_drops += 1;
            return RespOutcome::Ok;
        };
        let total = GRH_LEN + pkt.payload.len();
        if wqe.sges.total_len() < total as u64 {
            self.give_back(wqe, srq);
            c.len_drops += 1;
            return RespOutcome::Ok;
        }
        let grh = grh_area(from);
        let placed = scatter(mem, actx, &wqe.sges, 0, &grh)
            .and_then(|()| scatter(mem, actx, &wqe.sges, GRH_LEN as u64, pkt.payload));
        if let Err(e) = placed {
            return self.placement_failed(actx, wqe, e, srq, cq, total as u32, c);
        }
        let mut wc = self.recv_wc(
            actx.qpn,
            wqe.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total as u32,
        );
        wc.src_qp = deth.src_qp;
        wc.imm_data = pkt.hdr.immdt;
        wc.solicited = pkt.hdr.bth.se;
        wc.grh = true;
        cq.push_back(wc);
        RespOutcome::Ok
    }

    /// A receive's own memory refused the payload: a suspended region drops the message (the
    /// receive goes back to its queue; no RNR wait on UC and UD); anything else completes
    /// the receive with a local protection error and ends the QP.
    #[allow(clippy::too_many_arguments)]
    fn placement_failed(
        &mut self,
        actx: AccessCtx,
        wqe: super::rq::RecvWqe,
        e: AccessError,
        srq: Option<&mut Srq>,
        cq: &mut VecDeque<WorkCompletion>,
        len: u32,
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        self.msg = InMsg::Idle;
        if matches!(e, AccessError::Suspended(_)) {
            self.give_back(wqe, srq);
            c.suspended_drops += 1;
            return RespOutcome::Ok;
        }
        cq.push_back(self.recv_wc(
            actx.qpn,
            wqe.wr_id,
            WcStatus::LocProtErr,
            WcOpcode::Recv,
            len,
        ));
        RespOutcome::Fatal
    }

    /// Drop the UC message in progress: a receive it had started goes back to the head of
    /// its queue.
    fn uc_abandon(&mut self, srq: Option<&mut Srq>) {
        if let InMsg::Send { wqe, .. } = std::mem::replace(&mut self.msg, InMsg::Idle) {
            self.give_back(wqe, srq);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn receive_uc(
        &mut self,
        pkt: &Packet<'_>,
        kind: OpKind,
        pos: Position,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        mut srq: Option<&mut Srq>,
        (cq, cq_cap): (&mut VecDeque<WorkCompletion>, usize),
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        let psn = pkt.hdr.bth.psn;
        let in_seq = psn == self.epsn
            && !self.uc_drop
            && match (self.msg, pos) {
                (InMsg::Idle, Position::First | Position::Only) => true,
                (InMsg::Send { .. }, Position::Middle | Position::Last) => kind == OpKind::Send,
                (InMsg::Write { .. }, Position::Middle | Position::Last) => kind == OpKind::Write,
                _ => false,
            };
        if !in_seq {
            // A message in progress is cut: drop the rest of it.
            let cut = !matches!(self.msg, InMsg::Idle);
            if cut {
                c.uc_gap_drops += 1;
                self.uc_abandon(srq.as_deref_mut());
            }
            if !pos.starts() {
                // The message this packet belongs to lost its start: wait for the next first
                // or only packet, whatever its PSN.
                if !cut && !self.uc_drop {
                    c.uc_gap_drops += 1;
                }
                self.uc_drop = true;
                self.epsn = psn.add(1);
                return RespOutcome::Ok;
            }
            self.uc_drop = false;
        }
        self.epsn = psn.add(1);
        let mtu = self.mtu as usize;
        let len_ok = match pos {
            Position::First | Position::Middle => pkt.payload.len() == mtu,
            _ => pkt.payload.len() <= mtu,
        };
        if !len_ok {
            c.malformed += 1;
            return self.uc_drop_message(srq);
        }
        match kind {
            OpKind::Send => self.uc_send(pkt, pos, actx, mem, srq, cq, cq_cap, c),
            OpKind::Write => self.uc_write(pkt, pos, actx, mem, srq, cq, cq_cap, c),
            _ => {
                c.malformed += 1;
                self.uc_drop_message(srq)
            }
        }
    }

    fn uc_drop_message(&mut self, srq: Option<&mut Srq>) -> RespOutcome {
        self.uc_abandon(srq);
        self.uc_drop = true;
        RespOutcome::Ok
    }

    #[allow(clippy::too_many_arguments)]
    fn uc_send(
        &mut self,
        pkt: &Packet<'_>,
        pos: Position,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        mut srq: Option<&mut Srq>,
        cq: &mut VecDeque<WorkCompletion>,
        cq_cap: usize,
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        let (wqe, offset) = match self.msg {
            InMsg::Send { wqe, offset } => (wqe, offset),
            _ => {
                let w = if cq.len() < cq_cap {
                    self.take_recv(srq.as_deref_mut())
                } else {
                    None
                };
                match w {
                    Some(w) => (w, 0),
                    None => {
                        c.no_recv_drops += 1;
                        return self.uc_drop_message(srq);
                    }
                }
            }
        };
        let end = u64::from(offset) + pkt.payload.len() as u64;
        if end > wqe.sges.total_len() || end > super::MAX_MSG_SIZE {
            self.msg = InMsg::Send { wqe, offset };
            c.len_drops += 1;
            return self.uc_drop_message(srq);
        }
        if let Err(e) = scatter(mem, actx, &wqe.sges, u64::from(offset), pkt.payload) {
            return self.placement_failed(actx, wqe, e, srq, cq, end as u32, c);
        }
        if pos.ends() {
            let mut wc = self.recv_wc(
                actx.qpn,
                wqe.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                end as u32,
            );
            wc.imm_data = pkt.hdr.immdt;
            wc.solicited = pkt.hdr.bth.se;
            cq.push_back(wc);
            self.msg = InMsg::Idle;
        } else {
            self.msg = InMsg::Send {
                wqe,
                offset: end as u32,
            };
        }
        RespOutcome::Ok
    }

    #[allow(clippy::too_many_arguments)]
    fn uc_write(
        &mut self,
        pkt: &Packet<'_>,
        pos: Position,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        srq: Option<&mut Srq>,
        cq: &mut VecDeque<WorkCompletion>,
        cq_cap: usize,
        c: &mut UnrelCounters,
    ) -> RespOutcome {
        let (va, rkey, len, offset) = match self.msg {
            InMsg::Write {
                va,
                rkey,
                len,
                offset,
            } => (va, rkey, len, offset),
            _ => {
                let Some(reth) = pkt.hdr.reth else {
                    c.malformed += 1;
                    return self.uc_drop_message(srq);
                };
                let bad_len = match pos {
                    Position::Only => reth.dma_len as usize != pkt.payload.len(),
                    _ => reth.dma_len <= self.mtu,
                };
                if bad_len {
                    c.malformed += 1;
                    return self.uc_drop_message(srq);
                }
                let refused = !self.access.contains(Access::REMOTE_WRITE)
                    || (reth.dma_len > 0
                        && mem
                            .check(
                                actx,
                                reth.rkey,
                                reth.va,
                                u64::from(reth.dma_len),
                                Access::REMOTE_WRITE,
                            )
                            .is_err());
                if refused {
                    c.access_drops += 1;
                    return self.uc_drop_message(srq);
                }
                (reth.va, reth.rkey, reth.dma_len, 0)
            }
        };
        let end = offset as usize + pkt.payload.len();
        if end > len as usize || (pos.ends() && end != len as usize) {
            c.malformed += 1;
            return self.uc_drop_message(srq);
        }
        if !pkt.payload.is_empty()
            && let Err(e) = mem.write(
                actx,
                rkey,
                va.wrapping_add(u64::from(offset)),
                pkt.payload,
                Access::REMOTE_WRITE,
            )
        {
            // The target changed under the message (suspended, invalidated, unmapped): the
            // rest of it is dropped; the peer's data never completes anything here.
            if matches!(e, AccessError::Suspended(_)) {
                c.suspended_drops += 1;
            } else {
                c.access_drops += 1;
            }
            return self.uc_drop_message(srq);
        }
        if pos.ends() {
            self.msg = InMsg::Idle;
            if pkt.hdr.immdt.is_some() {
                let w = if cq.len() < cq_cap {
                    self.take_recv(srq)
                } else {
                    None
                };
                let Some(wqe) = w else {
                    c.no_recv_drops += 1;
                    return RespOutcome::Ok;
                };
                let mut wc = self.recv_wc(
                    actx.qpn,
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    len,
                );
                wc.imm_data = pkt.hdr.immdt;
                wc.solicited = pkt.hdr.bth.se;
                cq.push_back(wc);
            }
        } else {
            self.msg = InMsg::Write {
                va,
                rkey,
                len,
                offset: end as u32,
            };
        }
        RespOutcome::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn grh_area_holds_a_valid_ipv4_header_in_its_last_20_bytes() {
        let src = DatagramSource {
            ip: IpHeader::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                id: 0x1234,
                dont_fragment: true,
            },
            udp_payload_len: 12 + 8 + 100 + 4,
        };
        let g = grh_area(&src);
        assert!(g[..20].iter().all(|&b| b == 0));
        let h = &g[20..];
        assert_eq!(h[0], 0x45);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 20 + 8 + 124);
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 0x1234);
        assert_eq!(h[6], 0x40);
        assert_eq!(h[9], 17);
        // A header with its checksum sums to 0xffff.
        assert_eq!(ipv4_checksum(h), 0);
        assert_eq!(
            grh_source(&g),
            Some((
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))
            ))
        );
    }

    #[test]
    fn grh_area_is_the_ipv6_header() {
        let (s, d) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let src = DatagramSource {
            ip: IpHeader::V6 { src: s, dst: d },
            udp_payload_len: 40,
        };
        let g = grh_area(&src);
        assert_eq!(g[0], 0x60);
        assert_eq!(u16::from_be_bytes([g[4], g[5]]), 48);
        assert_eq!(g[6], 17);
        assert_eq!(&g[8..24], &Ipv6Addr::octets(&s));
        assert_eq!(grh_source(&g), Some((IpAddr::V6(s), IpAddr::V6(d))));
    }
}
