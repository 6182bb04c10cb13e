//! The requester: turns send WQEs into request packets (rxe's `rxe_req.c`).
//!
//! Segmentation to the path MTU, PSN assignment, the AckReq policy (see
//! `SendSide::wants_ack`: the last packet of a message whose completion the application
//! waits for, every [`ACK_REQ_EVERY`] packets, every READ/atomic request),
//! the send window of unacknowledged PSNs (default [`super::MAX_INFLIGHT_PSNS`]), the `max_rd_atomic` limit,
//! fences, and local operations (LOCAL_INV, BIND_MW) executed in queue order.

use super::ACK_REQ_EVERY;
use super::emit::build_request;
use super::gather::Gather;
use super::sq::{SendSide, SendWqe};
use super::wr::{SendFlags, WcStatus, WrOpcode};
use crate::mem::{Access, AccessCtx, AccessError, Invalidator, MemoryAccess};
pub use crate::params::LOCAL_SUSPEND_WAIT_NS;
use crate::wire::{IcrcPrefix, Position, Psn};

/// What one call of the requester produced.
#[derive(Debug, PartialEq, Eq)]
pub enum ReqOutput {
    /// A packet of this length is in the buffer.
    Packet(usize),
    /// Nothing to send now.
    Idle,
}

pub(super) fn position(idx: u32, n: u32) -> Position {
    match (idx == 0, idx + 1 >= n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

/// Number of packets (PSNs) a message of `len` bytes needs at this MTU (at least one).
pub fn packets_for(len: u64, mtu: u32) -> u32 {
    len.div_ceil(u64::from(mtu)).max(1) as u32
}

impl SendSide {
    /// Produce the next request packet into `buf`, or execute local WQEs. `sqd` stops new
    /// WQEs from starting (send queue drain). With `gather`, payloads may be lent (see
    /// [`Gather`]).
    pub fn poll_request(&mut self, now: u64, sqd: bool, env: ReqEnv<'_>) -> ReqOutput {
        let ReqEnv {
            actx,
            mem,
            icrc,
            buf,
            mut gather,
        } = env;
        if self.rnr_deadline.is_some() || self.halted {
            return ReqOutput::Idle;
        }
        if let Some(n) = self.poll_rerequest(now, actx, mem, icrc, buf) {
            return ReqOutput::Packet(n);
        }
        loop {
            let Some(seq) = self.next_unfinished(sqd) else {
                return ReqOutput::Idle;
            };
            let w = self.sq.get(seq);
            if !w.psn_assigned {
                if !self.may_start(w) {
                    return ReqOutput::Idle;
                }
                match self.start_wqe(seq, now, actx, mem) {
                    Start::Started => {}
                    Start::Next => continue,
                    Start::Stop => return ReqOutput::Idle,
                }
            }
            let w = self.sq.get(seq);
            if self.req_pkt >= w.npkts {
                self.req_seq += 1;
                self.req_pkt = 0;
                continue;
            }
            // A go-back-N skips READ/atomic responses that already arrived.
            let skip = self.seen_prefix(w, self.req_pkt);
            if skip > 0 {
                self.req_pkt += skip;
                continue;
            }
            let psn = w.first_psn.add(self.req_pkt);
            let window = self.max_inflight.min(self.cwnd);
            let ahead = psn.diff(self.comp_psn);
            if ahead >= window {
                return ReqOutput::Idle;
            }
            // The packet that fills a reduced window asks for an ACK: nothing more can be
            // sent before one arrives.
            let force_ack =
                self.noack + 1 >= ACK_REQ_EVERY || (self.cwnd < i32::MAX && ahead + 1 >= window);
            let end_ack = self.wants_ack(w, psn);
            if let Some(g) = gather.as_deref_mut() {
                // A staged payload copies no more than the window lets this run send.
                let room = u64::try_from(window - ahead).unwrap_or(1);
                g.set_stage_room(room.saturating_mul(u64::from(self.mtu)));
            }
            let at = PacketAt {
                seq,
                idx: self.req_pkt,
                limit: u32::MAX,
                psn,
                dest_qpn: self.dest_qpn,
                mtu: self.mtu,
                force_ack,
                end_ack,
            };
            let env = ReqEnv {
                actx,
                mem,
                icrc,
                buf,
                gather,
            };
            let built = build_request(w, at, env);
            return self.built(now, at, built);
        }
    }

    /// Whether WQE `w` may start now: a fenced WQE waits for the READs and atomics before
    /// it, a READ/atomic for a free slot among `max_rd_atomic`.
    fn may_start(&self, w: &SendWqe) -> bool {
        // Counting the READs and atomics in flight walks every unacknowledged WQE (cold
        // memory, and many of them once unsignaled messages are acknowledged lazily): only a
        // fenced WQE or a READ/atomic needs the count.
        let fenced = w.flags.contains(SendFlags::FENCE);
        if !fenced && !w.op.is_rd_atomic() {
            return true;
        }
        let in_flight = self.rd_atomic_in_flight();
        let fence_waits = fenced && in_flight > 0;
        let no_slot = w.op.is_rd_atomic() && in_flight >= usize::from(self.max_rd_atomic);
        !fence_waits && !no_slot
    }

    /// Account for packet `at` as built (`Ok((length, AckReq set, PSNs consumed))`): the
    /// request moves on and the retransmission timer runs; a suspended local region waits,
    /// a failed WQE halts the send queue.
    fn built(
        &mut self,
        now: u64,
        at: PacketAt,
        built: Result<(usize, bool, u32), LocalErr>,
    ) -> ReqOutput {
        match built {
            Ok((n, ack_req, consumed)) => {
                self.noack = if ack_req { 0 } else { self.noack + 1 };
                self.req_pkt += consumed;
                let end = at.psn.add(consumed);
                if end.is_after(self.sent_end) {
                    self.sent_end = end;
                }
                if self.retrans_deadline.is_none() {
                    self.retrans_deadline = self.timeout_ns.map(|t| now + t);
                }
                ReqOutput::Packet(n)
            }
            Err(LocalErr::Wait) => {
                self.rnr_deadline = Some(now + LOCAL_SUSPEND_WAIT_NS);
                ReqOutput::Idle
            }
            Err(LocalErr::Fail(st)) => {
                self.sq.get_mut(at.seq).done = Some(st);
                self.halted = true;
                ReqOutput::Idle
            }
        }
    }
}

/// What starting a WQE came to ([`SendSide::start_wqe`]).
pub(super) enum Start {
    /// Its PSNs are assigned: build its packets.
    Started,
    /// A local operation, executed: look at the next WQE.
    Next,
    /// Nothing more now (a suspended local region to wait for, or the WQE failed).
    Stop,
}

impl SendSide {
    /// The WQE the requester works on next: `req_seq`, moved up to the SQ head and past
    /// finished WQEs. `None` when the queue holds nothing more, or when that WQE is yet to
    /// start and `sqd` (send queue drain) stops new ones. Shared by RC, UC and UD.
    pub(super) fn next_unfinished(&mut self, sqd: bool) -> Option<u64> {
        loop {
            if self.req_seq < self.sq.head {
                self.req_seq = self.sq.head;
                self.req_pkt = 0;
            }
            if self.req_seq >= self.sq.tail {
                return None;
            }
            let w = self.sq.get(self.req_seq);
            if w.done.is_some() {
                self.req_seq += 1;
                self.req_pkt = 0;
                continue;
            }
            if !w.psn_assigned && sqd {
                return None;
            }
            return Some(self.req_seq);
        }
    }

    /// Start WQE `seq`: execute a local operation (LOCAL_INV, BIND_MW) in queue order, or
    /// check the local buffers and give the message its PSNs. A suspended local region makes
    /// the requester wait as for an RNR NAK and look again; a failure ends the WQE and halts
    /// the requester. Shared by RC, UC and UD.
    pub(super) fn start_wqe(
        &mut self,
        seq: u64,
        now: u64,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
    ) -> Start {
        let w = self.sq.get(seq);
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
                return Start::Stop;
            }
            return Start::Next;
        }
        match check_local(w, actx, mem) {
            Ok(()) => {}
            Err(LocalErr::Wait) => {
                self.rnr_deadline = Some(now + LOCAL_SUSPEND_WAIT_NS);
                return Start::Stop;
            }
            Err(LocalErr::Fail(st)) => {
                self.sq.get_mut(seq).done = Some(st);
                self.halted = true;
                return Start::Stop;
            }
        }
        let (mtu, first) = (self.mtu, self.next_psn);
        let w = self.sq.get_mut(seq);
        w.first_psn = first;
        w.npkts = if w.op.is_atomic() {
            1
        } else {
            packets_for(u64::from(w.len), mtu)
        };
        w.psn_assigned = true;
        self.next_psn = first.add(w.npkts);
        self.req_pkt = 0;
        Start::Started
    }

    /// For packet `idx` of READ/atomic `w`: how many PSNs from there already have their
    /// response. A go-back-N skips them and asks for the rest of the READ from the first
    /// one missing (see `request_holes`).
    fn seen_prefix(&self, w: &SendWqe, idx: u32) -> u32 {
        if self.rd_seen.is_empty() || !w.op.is_rd_atomic() {
            return 0;
        }
        let base = self.comp_psn;
        let mut i = idx;
        while i < w.npkts && self.rd_seen.contains(base, w.first_psn.add(i)) {
            i += 1;
        }
        i - idx
    }

    /// Whether the last packet of `w`, sent at `psn`, asks for an acknowledgement. Only when
    /// something waits for one, as hardware requesters do: the application (a signaled WQE),
    /// the send queue (half of it holds WQEs not yet acknowledged, which retire only with
    /// an ACK), or a recovery (a packet sent again, or any while the window is reduced after a
    /// timeout: their ACK ends it). Otherwise the responder acknowledges lazily
    /// ([`super::LAZY_ACK_NS`]) unless a later requested ACK covers the message first; a ping-
    /// pong of unsignaled messages then sends no ACK per message. (Linux rxe requests one for
    /// every message, and answers only requests: a message left without one is acknowledged by
    /// the next requested ACK, or after the retransmission timeout by the ACK of its
    /// retransmission.)
    pub(super) fn wants_ack(&self, w: &SendWqe, psn: Psn) -> bool {
        w.signaled
            || self.sig_all
            || self.sq.len() * 2 >= self.sq.capacity()
            || psn.is_before(self.sent_end)
            || self.cwnd < i32::MAX
    }

    /// Send the next queued hole re-request that is still needed, if any.
    fn poll_rerequest(
        &mut self,
        now: u64,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        icrc: &IcrcPrefix,
        buf: &mut [u8],
    ) -> Option<usize> {
        while let Some(r) = self.rereq.pop_front() {
            if r.seq < self.sq.head || r.seq >= self.sq.tail {
                continue;
            }
            let w = self.sq.get(r.seq);
            if w.done.is_some() || !w.op.is_rd_atomic() || !w.holds(r.psn) {
                continue;
            }
            let idx = r.psn.diff(w.first_psn) as u32;
            let want = r.npkts.min(w.npkts - idx);
            let psn = r.psn;
            let at = PacketAt {
                seq: r.seq,
                idx,
                limit: want,
                psn,
                dest_qpn: self.dest_qpn,
                mtu: self.mtu,
                force_ack: true,
                end_ack: true,
            };
            let env = ReqEnv {
                actx,
                mem,
                icrc,
                buf,
                gather: None,
            };
            if let Ok((n, _, _)) = build_request(w, at, env) {
                if self.retrans_deadline.is_none() {
                    self.retrans_deadline = self.timeout_ns.map(|t| now + t);
                }
                return Some(n);
            }
        }
        None
    }
}

/// Why a request could not be built from local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LocalErr {
    /// The work request fails with this status.
    Fail(WcStatus),
    /// A local region is suspended: the request waits (nothing was consumed).
    Wait,
}

impl From<WcStatus> for LocalErr {
    fn from(st: WcStatus) -> LocalErr {
        LocalErr::Fail(st)
    }
}

pub(super) fn local_err(e: AccessError) -> LocalErr {
    match e {
        AccessError::Suspended(_) => LocalErr::Wait,
        _ => LocalErr::Fail(WcStatus::LocProtErr),
    }
}

/// Execute LOCAL_INV or BIND_MW.
pub(super) fn execute_local(w: &SendWqe, actx: AccessCtx, mem: &dyn MemoryAccess) -> WcStatus {
    match w.op {
        WrOpcode::LocalInv { rkey } => match mem.invalidate(actx, rkey, Invalidator::Local) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::LocProtErr,
        },
        WrOpcode::BindMw {
            mw_rkey,
            new_rkey,
            mr_lkey,
            addr,
            length,
            access,
        } => match mem.bind_mw(
            actx,
            crate::mem::MwBind {
                mw_key: mw_rkey,
                new_rkey,
                mr_lkey,
                iova: addr,
                len: length,
                access,
            },
        ) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::MwBindErr,
        },
        _ => WcStatus::LocQpOpErr,
    }
}

/// Check the local SGEs of a WQE before it starts: readable for SEND/WRITE, writable for
/// READ and atomics.
pub(super) fn check_local(
    w: &SendWqe,
    actx: AccessCtx,
    mem: &dyn MemoryAccess,
) -> Result<(), LocalErr> {
    if w.use_inline {
        return Ok(());
    }
    let access = if w.op.carries_payload() {
        Access::NONE
    } else {
        Access::LOCAL_WRITE
    };
    for s in w.sges.as_slice() {
        if s.length > 0 {
            mem.check(actx, s.lkey, s.addr, u64::from(s.length), access)
                .map_err(local_err)?;
        }
    }
    Ok(())
}

/// Which packet of a WQE [`super::emit::build_request`] builds: packet `idx` of the WQE at SQ sequence
/// number `seq`, at `psn` (a READ request asks for at most `limit` response PSNs), for the
/// peer's QP `dest_qpn` at path MTU `mtu`; AckReq is set with `force_ack`, and on the
/// message's last packet with `end_ack`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PacketAt {
    pub(super) seq: u64,
    pub(super) idx: u32,
    pub(super) limit: u32,
    pub(super) psn: Psn,
    pub(super) dest_qpn: u32,
    pub(super) mtu: u32,
    pub(super) force_ack: bool,
    pub(super) end_ack: bool,
}

/// What a request packet is built with ([`SendSide::poll_request`]): the QP's access context
/// and the memory payloads come from, the ICRC prefix of the path, the buffer the packet is
/// built in, and, when payloads may be lent instead of copied, the gather they go to.
pub struct ReqEnv<'a> {
    /// The QP's PD and number, as every access names them.
    pub actx: AccessCtx,
    /// The memory payloads are read from.
    pub mem: &'a dyn MemoryAccess,
    /// The ICRC prefix of the QP's path.
    pub icrc: &'a IcrcPrefix,
    /// The buffer the packet is built in.
    pub buf: &'a mut [u8],
    /// Where lent payloads go (see [`Gather`]); `None` copies every payload.
    pub gather: Option<&'a mut Gather>,
}

impl std::fmt::Debug for ReqEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReqEnv")
            .field("actx", &self.actx)
            .field("buf_len", &self.buf.len())
            .field("gather", &self.gather.is_some())
            .finish_non_exhaustive()
    }
}
