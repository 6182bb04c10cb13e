//! The responder: executes requests in PSN order and answers them (rxe's `rxe_resp.c`).
//! SEND and WRITE placement is in `place.rs`, READ/atomic requests and duplicates in
//! `read_atomic.rs`, access violations in `violation.rs`, and the answers are emitted by
//! `response.rs`.
//!
//! Receive consumption (own RQ or SRQ), placement through [`MemoryAccess`] with all its
//! checks, READ responses, atomics executed once with a replay cache, duplicate detection
//! and re-ACK, NAKs (PSN sequence error, invalid request, remote access error, remote
//! operational error), RNR NAKs (no receive posted, or a suspended target region), ACK
//! coalescing and the MSN. Answers are queued in PSN order and sent by [`RecvSide::poll_response`].

use std::collections::VecDeque;

mod place;
mod read_atomic;
mod response;
mod violation;

pub(super) use place::{reth_len_fits, scatter, write_end};

use super::atomic_cache::AtomicCache;
use super::read_history::ReadHistory;
use super::rq::{RecvQueue, RecvWqe, Srq};
use super::wr::{WcOpcode, WcStatus, WorkCompletion};
use crate::mem::{Access, AccessCtx, AccessError, Invalidator, MemoryAccess};
pub use crate::params::NAK_SEQ_WINDOW;
use crate::wire::{NakCode, OpKind, Packet, Position, Psn, RethRepr, Syndrome};

/// Credit count rxe puts in every ACK: "invalid", end-to-end credits not used.
pub(super) const NO_CREDITS: Syndrome = Syndrome::Ack { credits: 0x1f };

/// A queued answer.
#[derive(Clone, Copy, Debug)]
pub(super) enum Response {
    /// ACK, NAK or RNR NAK.
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    /// A READ response stream in progress.
    Read(ReadStream),
    /// An atomic acknowledgement; `dup` when it answers a duplicate.
    Atomic {
        psn: Psn,
        orig: u64,
        msn: u32,
        dup: bool,
    },
}

/// A READ response stream: its next response's PSN, where it reads from (`va` under `rkey`)
/// and how much is left; `started` once its first response went out; the MSN its AETH
/// carries; `dup` when it answers a duplicate request.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadStream {
    pub(super) psn: Psn,
    pub(super) va: u64,
    pub(super) rkey: u32,
    pub(super) remaining: u32,
    pub(super) started: bool,
    pub(super) msn: u32,
    pub(super) dup: bool,
}

/// The message being received.
#[derive(Clone, Copy, Debug)]
pub(super) enum InMsg {
    Idle,
    Send {
        wqe: RecvWqe,
        offset: u32,
    },
    Write {
        va: u64,
        rkey: u32,
        len: u32,
        offset: u32,
    },
}

impl InMsg {
    /// The WRITE under way: its target address, R_Key and length, and the bytes placed.
    pub(super) fn write(&self) -> Option<(u64, u32, u32, u32)> {
        match *self {
            InMsg::Write {
                va,
                rkey,
                len,
                offset,
            } => Some((va, rkey, len, offset)),
            _ => None,
        }
    }
}

/// What a request is handled against ([`RecvSide::handle_request`]): the QP's access context
/// and memory, the SRQ its receives come from (if attached), its receive CQ with that CQ's
/// capacity, and the responder's counters.
pub type RespEnv<'a> = super::unreliable::RxEnv<'a, 'a, RespCounters>;

/// Counters the responder keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespCounters {
    /// Duplicate requests seen.
    pub duplicates: u64,
    /// NAK-sequence errors sent.
    pub seq_naks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// Other NAKs sent.
    pub naks_sent: u64,
    /// Atomics answered from the replay cache.
    pub atomic_replays: u64,
    /// Duplicate READ/atomic requests dropped: no READ executed at that PSN asked for those
    /// bytes under that key, or no atomic result is remembered for it.
    pub duplicates_dropped: u64,
    /// Requests too far ahead of the expected PSN to come from the peer's send window,
    /// dropped without a NAK-sequence.
    pub far_ahead_dropped: u64,
    /// Acknowledgements sent for requests that did not ask for one (lazily: no requested ACK
    /// covered them in time).
    pub lazy_acks: u64,
}

/// A READ could not be served and was NAKed: the QP must enter the error state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fatal;

/// What handling a request led to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RespOutcome {
    /// Carry on.
    Ok,
    /// A fatal error was NAKed: the QP must enter the error state.
    Fatal,
}

/// Responder state of one QP.
#[derive(Debug)]
pub struct RecvSide {
    /// The QP's own receive queue.
    pub rq: RecvQueue,
    /// The SRQ the QP takes receives from, if any.
    pub srq_id: Option<u32>,
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number.
    pub msn: u32,
    nak_seq_sent: bool,
    pub(super) msg: InMsg,
    /// Q_Key (UD): datagrams carrying another are dropped.
    pub qkey: u32,
    /// UC: the rest of the message in progress is dropped (a PSN gap or a refused packet),
    /// until the next first or only packet.
    pub(super) uc_drop: bool,
    pub(super) resp: VecDeque<Response>,
    pub(super) resp_cap: usize,
    /// READ/atomic answers queued, duplicates included (at most twice the depth).
    pub(super) rd_atomic_queued: usize,
    /// Of those, answers to duplicates: they do not count against the depth new requests are
    /// judged by (a requester resending the READs it has outstanding has no more than the
    /// depth outstanding; rxe replays a duplicate from the resource it already holds).
    pub(super) dup_queued: usize,
    pub(super) cache: AtomicCache,
    pub(super) reads: ReadHistory,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Remote rights granted.
    pub access: Access,
    /// RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// READ/atomic requests accepted at once.
    pub max_dest_rd_atomic: u8,
    /// Peer QPN.
    pub dest_qpn: u32,
    /// The newest request PSN executed without AckReq and not yet acknowledged: the
    /// requester did not ask for an acknowledgement, so one is sent only lazily (see
    /// [`RecvSide::ack_unacked`]) unless a newer answer covers it first.
    pub(super) unacked: Option<Psn>,
    /// The PSN and NAK of a message or READ response stream an invalidated region cut short
    /// (error state only), and whether it was a stream (see [`RecvSide::answer_violation`]).
    pub(super) violation: Option<(Psn, NakCode, bool)>,
    /// Keys a peer's SEND with Invalidate invalidated, for the driver to wait on
    /// ([`super::Qp::pop_invalidated`]).
    pub(super) invalidated: Vec<u32>,
    /// The next PSN and R_Key of a READ response stream stopped because its region was
    /// suspended (or changing), until a repeat of the READ is answered in full: the QP still
    /// uses that region.
    pub(super) stopped_stream: Option<(Psn, u32)>,
    /// RNR NAKs queued for READ streams that met a suspended region, not yet counted in
    /// `RespCounters::rnr_naks_sent` (the QP adds them).
    pub(super) stream_rnr_naks: u64,
}

pub(super) fn map_err(e: AccessError) -> Option<NakCode> {
    match e {
        AccessError::Suspended(_) => None,
        AccessError::Misaligned(_) => Some(NakCode::InvalidRequest),
        // The R_Key names memory that vanished (unmapped behind the registration before the
        // watcher saw it): an access violation, as for an invalidated region (docs/COHERENCE.md).
        _ => Some(NakCode::RemoteAccessError),
    }
}

impl RecvSide {
    /// Responder state with an RQ of `max_recv_wr` entries (unused with an SRQ).
    pub fn new(max_recv_wr: usize, max_sge: usize, srq_id: Option<u32>) -> RecvSide {
        // READ/atomic answers, duplicates (twice the depth, see `dup_room`) and ACKs.
        let cap = 3 * usize::from(super::qp_state::MAX_RD_ATOMIC) + 4;
        RecvSide {
            rq: RecvQueue::new(if srq_id.is_some() { 0 } else { max_recv_wr }, max_sge),
            srq_id,
            epsn: Psn::new(0),
            msn: 0,
            nak_seq_sent: false,
            msg: InMsg::Idle,
            qkey: 0,
            uc_drop: false,
            resp: VecDeque::with_capacity(cap),
            resp_cap: cap,
            rd_atomic_queued: 0,
            dup_queued: 0,
            cache: AtomicCache::new(usize::from(super::qp_state::MAX_RD_ATOMIC)),
            reads: ReadHistory::new(usize::from(super::qp_state::MAX_RD_ATOMIC)),
            mtu: 1024,
            access: Access::NONE,
            min_rnr_timer: 12,
            max_dest_rd_atomic: 1,
            dest_qpn: 0,
            unacked: None,
            violation: None,
            invalidated: Vec::with_capacity(4),
            stopped_stream: None,
            stream_rnr_naks: 0,
        }
    }

    /// Forget everything (QP reset).
    pub fn reset(&mut self) {
        self.rq.clear();
        self.resp.clear();
        self.rd_atomic_queued = 0;
        self.dup_queued = 0;
        self.cache.clear();
        self.reads.clear();
        self.msg = InMsg::Idle;
        self.uc_drop = false;
        self.nak_seq_sent = false;
        self.msn = 0;
        self.unacked = None;
        self.violation = None;
        self.stopped_stream = None;
    }

    /// The QP entered the error state: keep only NAKs still to be sent. Returns the receive
    /// of a SEND in progress, which the caller completes (flushed) with the rest.
    pub fn enter_error(&mut self) -> Option<RecvWqe> {
        self.resp.retain(|r| {
            matches!(
                r,
                Response::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.rd_atomic_queued = 0;
        self.dup_queued = 0;
        self.unacked = None;
        self.stopped_stream = None;
        match std::mem::replace(&mut self.msg, InMsg::Idle) {
            InMsg::Send { wqe, .. } => Some(wqe),
            _ => None,
        }
    }

    /// True while a message in progress holds a receive taken from the QP's own queue.
    pub fn holds_rq_wqe(&self) -> bool {
        self.srq_id.is_none() && matches!(self.msg, InMsg::Send { .. })
    }

    /// The newest request PSN executed without AckReq that no answer has acknowledged yet.
    pub fn unacked(&self) -> Option<Psn> {
        self.unacked
    }

    /// Queue the acknowledgement nobody asked for (of [`RecvSide::unacked`]); the driver
    /// calls this once it has waited long enough for a requested one to cover it. Returns
    /// false when there was none to send.
    pub fn ack_unacked(&mut self, c: &mut RespCounters) -> bool {
        match self.unacked {
            Some(psn) => {
                c.lazy_acks += 1;
                self.push_ack(psn, NO_CREDITS);
                true
            }
            None => false,
        }
    }

    /// True when answers wait to be sent.
    pub fn has_response(&self) -> bool {
        !self.resp.is_empty()
    }

    /// True when the only answer waiting is a positive acknowledgement: a driver may hold it
    /// back, since acknowledgements are cumulative and a newer one replaces it in the queue.
    pub fn has_lone_ack(&self) -> bool {
        self.resp.len() == 1
            && matches!(
                self.resp.front(),
                Some(Response::Ack {
                    syndrome: Syndrome::Ack { .. },
                    ..
                })
            )
    }

    pub(super) fn push_ack(&mut self, psn: Psn, syndrome: Syndrome) {
        // Every ACK and NAK covers the requests executed before it.
        self.unacked = None;
        let msn = self.msn;
        // Coalesce: a newer ACK replaces an unsent one at the back of the queue.
        if let Some(Response::Ack {
            syndrome: NO_CREDITS,
            ..
        }) = self.resp.back()
            && syndrome == NO_CREDITS
        {
            self.resp.pop_back();
        }
        if self.resp.len() < self.resp_cap {
            self.resp.push_back(Response::Ack { psn, syndrome, msn });
        }
    }

    pub(super) fn nak(&mut self, psn: Psn, code: NakCode, c: &mut RespCounters) -> RespOutcome {
        c.naks_sent += 1;
        // The QP ends in the error state; a resend of the request (its NAK lost, like any
        // packet) draws the NAK again there (`answer_violation`) instead of silence, which
        // would end the requester's WR in a retry error.
        self.violation = Some((psn, code, false));
        self.resp.clear();
        self.rd_atomic_queued = 0;
        self.dup_queued = 0;
        self.push_ack(psn, Syndrome::Nak(code));
        RespOutcome::Fatal
    }

    /// Answer a refused memory access: RNR NAK while the region is suspended (the retry
    /// meets it resumed, moved or gone), else the NAK [`map_err`] names.
    pub(super) fn refused(
        &mut self,
        psn: Psn,
        e: AccessError,
        c: &mut RespCounters,
    ) -> RespOutcome {
        match map_err(e) {
            None => self.rnr(psn, c),
            Some(code) => self.nak(psn, code, c),
        }
    }

    /// Count a completed message (the MSN is 24 bits) and return its number.
    pub(super) fn next_msn(&mut self) -> u32 {
        self.msn = self.msn.wrapping_add(1) & 0x00ff_ffff;
        self.msn
    }

    pub(super) fn rnr(&mut self, psn: Psn, c: &mut RespCounters) -> RespOutcome {
        c.rnr_naks_sent += 1;
        // The packets behind this one are out of sequence until it is resent: no NAK-sequence
        // for them (the requester goes back on the RNR NAK anyway).
        self.nak_seq_sent = true;
        self.push_ack(
            psn,
            Syndrome::RnrNak {
                timer: self.min_rnr_timer,
            },
        );
        RespOutcome::Ok
    }

    pub(super) fn recv_wc(
        &self,
        qpn: u32,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: qpn,
            src_qp: self.dest_qpn,
            solicited: false,
            grh: None,
        }
    }

    /// The receive the next message would take (see [`RecvSide::take_recv`]), left posted.
    pub(super) fn next_recv<'a>(&'a self, srq: Option<&'a Srq>) -> Option<&'a RecvWqe> {
        match (self.srq_id, srq) {
            (None, _) => self.rq.front(),
            (Some(id), Some(s)) if s.id() == id => s.front(),
            _ => None,
        }
    }

    pub(super) fn take_recv(&mut self, srq: Option<&mut Srq>) -> Option<RecvWqe> {
        match (self.srq_id, srq) {
            (None, _) => self.rq.pop(),
            (Some(id), Some(s)) if s.id() == id => s.take(),
            _ => None,
        }
    }

    pub(super) fn give_back(&mut self, w: RecvWqe, srq: Option<&mut Srq>) {
        match (self.srq_id, srq) {
            (None, _) => self.rq.unpop(w),
            (Some(_), Some(s)) => s.give_back(w),
            _ => {}
        }
    }

    /// Handle a request packet addressed to this QP.
    pub fn handle_request(
        &mut self,
        pkt: &Packet<'_>,
        kind: OpKind,
        pos: Position,
        env: RespEnv<'_>,
    ) -> RespOutcome {
        let (actx, mem) = (env.actx, env.mem);
        let c = &mut *env.counters;
        let psn = pkt.hdr.bth.psn;
        let d = psn.diff(self.epsn);
        if d > NAK_SEQ_WINDOW {
            // No requester's window reaches this far: a forged or stray packet. Answering it
            // would make the real requester go back and resend its whole window.
            c.far_ahead_dropped += 1;
            return RespOutcome::Ok;
        }
        if d > 0 {
            if !self.nak_seq_sent {
                self.nak_seq_sent = true;
                c.seq_naks_sent += 1;
                let e = self.epsn;
                self.push_ack(e, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return RespOutcome::Ok;
        }
        if d < 0 {
            self.duplicate(pkt, kind, actx, mem, c);
            return RespOutcome::Ok;
        }
        self.nak_seq_sent = false;
        // Opcode sequence: Middle/Last only inside a message of the same kind.
        let in_seq = match (self.msg, pos) {
            (InMsg::Idle, Position::First | Position::Only) => true,
            (InMsg::Send { .. }, Position::Middle | Position::Last) => kind == OpKind::Send,
            (InMsg::Write { .. }, Position::Middle | Position::Last) => kind == OpKind::Write,
            _ => false,
        };
        let mtu = self.mtu as usize;
        let len_ok = match pos {
            Position::First | Position::Middle => pkt.payload.len() == mtu,
            _ => pkt.payload.len() <= mtu,
        };
        if !in_seq || !len_ok {
            return self.nak(psn, NakCode::InvalidRequest, c);
        }
        match kind {
            OpKind::Send => self.do_send(pkt, pos, env),
            OpKind::Write => self.do_write(pkt, pos, env),
            OpKind::ReadRequest => self.do_read(pkt, actx, mem, c),
            OpKind::CompareSwap | OpKind::FetchAdd => self.do_atomic(pkt, kind, actx, mem, c),
            // FLUSH and ATOMIC WRITE (IBTA 1.5) are not supported.
            _ => self.nak(psn, NakCode::InvalidRequest, c),
        }
    }

    pub(super) fn finish_packet(&mut self, pkt: &Packet<'_>) {
        let psn = pkt.hdr.bth.psn;
        self.epsn = psn.add(1);
        if pkt.hdr.bth.ack_req {
            self.push_ack(psn, NO_CREDITS);
        } else {
            self.unacked = Some(psn);
        }
    }
}
