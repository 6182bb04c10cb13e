//! The send queue and the state the requester and the completer share.
//!
//! WQEs live in a ring allocated at QP creation (inline-data buffers included), indexed by
//! a monotonically increasing sequence number: `head` is the oldest WQE not yet completed,
//! `tail` the next free slot. The requester walks forward from `req_seq`; the completer
//! retires from `head`. Retransmission rewinds `req_seq` (go-back-N) and packets are rebuilt
//! from memory, as rxe does, so no packet is ever stored.

use std::collections::VecDeque;

use super::psn_set::PsnSet;
use super::wr::{SendFlags, SgList, WcStatus, WrOpcode};
use crate::wire::Psn;

/// A hole in the READ response stream (or a lost atomic acknowledgement) to ask for again:
/// `npkts` PSNs from `psn`, all inside WQE `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReRequest {
    /// The WQE.
    pub seq: u64,
    /// First missing PSN.
    pub psn: Psn,
    /// Missing PSNs from there.
    pub npkts: u32,
}

/// One send work queue entry.
#[derive(Clone, Debug)]
pub struct SendWqe {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Operation.
    pub op: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Local buffers.
    pub sges: SgList,
    /// Inline payload storage (capacity `max_inline_data`, allocated once).
    pub inline: Vec<u8>,
    /// Whether the payload is `inline`.
    pub use_inline: bool,
    /// Message length in bytes.
    pub len: u32,
    /// First PSN (valid once `psn_assigned`).
    pub first_psn: Psn,
    /// PSNs the message occupies (0 for local operations).
    pub npkts: u32,
    /// Whether the requester has started it (PSNs assigned, SGEs checked).
    pub psn_assigned: bool,
    /// Set when the WQE is finished; completed (and retired) when it reaches the head.
    pub done: Option<WcStatus>,
    /// Whether a successful completion is reported.
    pub signaled: bool,
    /// READ/atomic: the last PSN of the hole re-request under way (cleared when its
    /// response arrives, or by a timeout).
    pub rereq_end: Option<Psn>,
    /// UD: where the datagram goes.
    pub ud: Option<super::UdDest>,
}

impl SendWqe {
    fn empty(inline_cap: usize) -> SendWqe {
        SendWqe {
            wr_id: 0,
            op: WrOpcode::Send,
            flags: SendFlags::NONE,
            sges: SgList::default(),
            inline: Vec::with_capacity(inline_cap),
            use_inline: false,
            len: 0,
            first_psn: Psn::new(0),
            npkts: 0,
            psn_assigned: false,
            done: None,
            signaled: false,
            rereq_end: None,
            ud: None,
        }
    }
    /// Last PSN of the message.
    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
    /// True when `p` is one of its PSNs.
    pub fn holds(&self, p: Psn) -> bool {
        self.psn_assigned
            && self.npkts > 0
            && p.diff(self.first_psn) >= 0
            && p.diff(self.last_psn()) <= 0
    }
}

/// The ring of send WQEs.
#[derive(Debug)]
pub struct SendQueue {
    slots: Vec<SendWqe>,
    /// Oldest WQE not yet retired.
    pub head: u64,
    /// Next sequence number to post.
    pub tail: u64,
}

impl SendQueue {
    /// A ring of `depth` WQEs with `inline_cap` bytes of inline storage each.
    pub fn new(depth: usize, inline_cap: usize) -> SendQueue {
        SendQueue {
            slots: (0..depth.max(1))
                .map(|_| SendWqe::empty(inline_cap))
                .collect(),
            head: 0,
            tail: 0,
        }
    }
    /// WQEs posted and not retired.
    pub fn len(&self) -> usize {
        (self.tail - self.head) as usize
    }
    /// True when no WQE is outstanding.
    pub fn is_empty(&self) -> bool {
        self.tail == self.head
    }
    /// WQEs the ring holds.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    /// True when posting would overflow.
    pub fn is_full(&self) -> bool {
        self.len() >= self.slots.len()
    }
    /// The WQE with sequence number `seq` (must be in `head..tail`).
    pub fn get(&self, seq: u64) -> &SendWqe {
        &self.slots[(seq % self.slots.len() as u64) as usize]
    }
    /// Mutable access.
    pub fn get_mut(&mut self, seq: u64) -> &mut SendWqe {
        let n = self.slots.len() as u64;
        &mut self.slots[(seq % n) as usize]
    }
    /// Claim the next slot (the caller checked `is_full`), reset for a new WQE.
    pub fn push(&mut self) -> &mut SendWqe {
        let seq = self.tail;
        self.tail += 1;
        let w = self.get_mut(seq);
        w.inline.clear();
        w.use_inline = false;
        w.psn_assigned = false;
        w.done = None;
        w.npkts = 0;
        w.rereq_end = None;
        w
    }
    /// Retire the head WQE.
    pub fn pop(&mut self) {
        if self.head < self.tail {
            self.head += 1;
        }
    }
    /// Drop everything (QP reset).
    pub fn clear(&mut self) {
        self.head = self.tail;
    }
}

/// Requester and completer state of one QP.
#[derive(Debug)]
pub struct SendSide {
    /// The WQEs.
    pub sq: SendQueue,
    // --- requester ---
    /// The WQE the requester works on.
    pub req_seq: u64,
    /// Next packet index within it.
    pub req_pkt: u32,
    /// PSN the next new WQE gets.
    pub next_psn: Psn,
    /// One past the highest PSN ever sent.
    pub sent_end: Psn,
    /// Packets sent since the last AckReq.
    pub noack: u32,
    /// Most unacknowledged PSNs in flight (the send window).
    pub max_inflight: i32,
    /// The window while recovering from a timeout: starts small and doubles with every
    /// acknowledgement that moves `comp_psn`, up to `max_inflight` (`i32::MAX`: not limited).
    pub cwnd: i32,
    /// Set when a WQE failed locally: start nothing more.
    pub halted: bool,
    // --- completer ---
    /// Oldest PSN not yet acknowledged.
    pub comp_psn: Psn,
    /// Transport retries left.
    pub retry_left: u8,
    /// RNR retries left (7 = forever).
    pub rnr_left: u8,
    /// When the retransmission timer fires.
    pub retrans_deadline: Option<u64>,
    /// While set, the requester waits out an RNR back-off.
    pub rnr_deadline: Option<u64>,
    /// The PSN of the NAK-sequence whose go-back-N is under way: the same NAK again is not
    /// counted again (cleared by progress or a timeout).
    pub nak_retry_psn: Option<Psn>,
    /// READ response and atomic acknowledgement PSNs received ahead of `comp_psn`.
    pub rd_seen: PsnSet,
    /// Hole re-requests the requester sends before anything else.
    pub rereq: VecDeque<ReRequest>,
    /// READ/atomic PSNs before this one were looked at for holes already.
    pub holes_scanned: Psn,
    /// The highest PSN the responder is known to have executed (from ACKs and responses).
    pub peer_acked: Psn,
    // --- attributes ---
    /// Path MTU in bytes.
    pub mtu: u32,
    /// ACK timeout (`None`: infinite).
    pub timeout_ns: Option<u64>,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
    /// Peer QPN.
    pub dest_qpn: u32,
    /// Every WQE completes signaled (`sq_sig_all`).
    pub sig_all: bool,
    /// Keys LOCAL_INV invalidated, for the driver to wait on ([`super::Qp::pop_invalidated`]).
    pub invalidated: Vec<u32>,
}

impl SendSide {
    /// Requester/completer state with a ring of `depth` WQEs (`sig_all`: every WQE
    /// completes signaled).
    pub fn new(depth: usize, inline_cap: usize, sig_all: bool) -> SendSide {
        SendSide {
            sq: SendQueue::new(depth, inline_cap),
            req_seq: 0,
            req_pkt: 0,
            next_psn: Psn::new(0),
            sent_end: Psn::new(0),
            noack: 0,
            max_inflight: super::MAX_INFLIGHT_PSNS,
            cwnd: i32::MAX,
            halted: false,
            comp_psn: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            retrans_deadline: None,
            rnr_deadline: None,
            nak_retry_psn: None,
            rd_seen: PsnSet::default(),
            rereq: VecDeque::new(),
            holes_scanned: Psn::new(0),
            peer_acked: Psn::new(0).sub(1),
            mtu: 1024,
            timeout_ns: None,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            dest_qpn: 0,
            sig_all,
            invalidated: Vec::with_capacity(4),
        }
    }

    /// The send side's invariants, asserted in debug builds, where every simulator seed
    /// checks them after each packet, transmit poll and timeout: the queue's indices in
    /// order, nothing acknowledged that was not sent, nothing sent that was not assigned.
    pub fn debug_check(&self) {
        debug_assert!(
            self.sq.head <= self.sq.tail,
            "SQ head {} past its tail {}",
            self.sq.head,
            self.sq.tail
        );
        debug_assert!(
            !self.comp_psn.is_after(self.sent_end),
            "acknowledged up to {:?}, sent only up to {:?}",
            self.comp_psn,
            self.sent_end
        );
        debug_assert!(
            !self.sent_end.is_after(self.next_psn),
            "sent up to {:?}, assigned only up to {:?}",
            self.sent_end,
            self.next_psn
        );
        debug_assert!(
            self.peer_acked.is_before(self.sent_end),
            "executed by the peer up to {:?}, sent only up to {:?}",
            self.peer_acked,
            self.sent_end
        );
    }

    /// Set the starting PSN (RTR→RTS).
    pub fn set_sq_psn(&mut self, psn: Psn) {
        self.next_psn = psn;
        self.sent_end = psn;
        self.comp_psn = psn;
        self.peer_acked = psn.sub(1);
        self.holes_scanned = psn;
    }

    /// True when a WQE is left to start or continue, or a hole re-request waits.
    pub fn has_request_work(&self) -> bool {
        if !self.rereq.is_empty() {
            return true;
        }
        let seq = self.req_seq.max(self.sq.head);
        if seq + 1 < self.sq.tail {
            return true;
        }
        // The last WQE: work unless every packet of it has gone out.
        seq < self.sq.tail && {
            let w = self.sq.get(seq);
            !(w.psn_assigned && self.req_seq == seq && self.req_pkt >= w.npkts)
        }
    }

    /// UD: the destination of the next WQE to send (local operations before it are executed
    /// by the same transmit poll).
    pub fn next_ud_dest(&self) -> Option<crate::wire::AddressVector> {
        (self.req_seq.max(self.sq.head)..self.sq.tail)
            .map(|s| self.sq.get(s))
            .find(|w| w.done.is_none() && !w.op.is_local())
            .and_then(|w| w.ud.map(|u| u.av()))
    }

    /// True while sent packets wait for acknowledgement.
    pub fn outstanding(&self) -> bool {
        self.comp_psn.is_before(self.sent_end)
    }

    /// READ/atomic WQEs started and not finished.
    pub fn rd_atomic_in_flight(&self) -> usize {
        (self.sq.head..self.req_seq.min(self.sq.tail))
            .map(|s| self.sq.get(s))
            .filter(|w| w.op.is_rd_atomic() && w.psn_assigned && w.done.is_none())
            .count()
    }

    /// True when a WQE not yet finished names a key `names` picks: the L_Key of a local
    /// buffer (not of inline data, which was copied at posting), or the parent region of a
    /// window bind.
    pub fn names_key(&self, names: &dyn Fn(u32) -> bool) -> bool {
        (self.sq.head..self.sq.tail).any(|s| {
            let w = self.sq.get(s);
            w.done.is_none()
                && ((!w.use_inline && w.sges.names_key(names))
                    || matches!(w.op, WrOpcode::BindMw { mr_lkey, .. } if names(mr_lkey)))
        })
    }

    /// The first WQE (from the head) that is not finished.
    pub fn first_pending(&self) -> Option<u64> {
        (self.sq.head..self.sq.tail).find(|&s| self.sq.get(s).done.is_none())
    }

    /// Go back: make the requester resend from PSN `p` (go-back-N).
    pub fn rewind(&mut self, p: Psn) {
        let end = self.req_seq.min(self.sq.tail.saturating_sub(1));
        for s in self.sq.head..=end.max(self.sq.head) {
            if s >= self.sq.tail {
                break;
            }
            let w = self.sq.get(s);
            if w.done.is_none() && w.holds(p) {
                self.req_seq = s;
                self.req_pkt = p.diff(w.first_psn) as u32;
                self.noack = 0;
                return;
            }
        }
    }
}
