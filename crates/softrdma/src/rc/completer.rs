//! The completer: acknowledgements and responses in, WQEs finished and retired in posting
//! order (rxe's `rxe_comp.c`). Also the retransmission timer, go-back-N on NAK-sequence and
//! on timeout, the RNR back-off, and the retry counters.

use std::collections::VecDeque;

use super::psn_set::PsnSet;
use super::sq::{ReRequest, SendSide};
use super::timer::rnr_backoff_ns;
use super::wr::{WcStatus, WorkCompletion, WrOpcode};
use crate::mem::{Access, AccessCtx, MemoryAccess};
use crate::params::{MAX_REREQUESTS, RESTART_WINDOW};
use crate::wire::{NakCode, OpKind, Packet, Psn, Syndrome};

/// Counters the completer keeps (part of [`super::QpCounters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompCounters {
    /// Go-back-N retransmissions started (timeouts, NAK-sequence).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// NAK-sequence errors received.
    pub seq_naks_received: u64,
    /// Responses ignored (stale, duplicate or unexpected).
    pub responses_ignored: u64,
    /// Holes in READ response streams (or lost atomic acknowledgements) asked for again.
    pub rerequests: u64,
}

impl SendSide {
    fn progress(&mut self, now: u64) {
        if self.cwnd < i32::MAX {
            self.cwnd = self.cwnd.saturating_mul(2);
            if self.cwnd >= self.max_inflight {
                self.cwnd = i32::MAX;
            }
        }
        if self.holes_scanned.is_before(self.comp_psn) {
            // Keep the mark within the window (PSNs wrap at 2^24).
            self.holes_scanned = self.comp_psn;
        }
        self.nak_retry_psn = None;
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.arm(now);
    }

    /// (Re)start the retransmission timer while anything is outstanding.
    fn arm(&mut self, now: u64) {
        self.retrans_deadline = if self.outstanding() {
            self.timeout_ns.map(|t| now + t)
        } else {
            None
        };
    }

    /// The responder executed every request up to `p`: finish what that completes. The
    /// responder moving on is progress (the retry budgets start again); a READ or atomic
    /// before `p` whose responses are still missing lost them: its holes are asked for
    /// again (an implied NAK).
    fn ack_through(&mut self, p: Psn, now: u64, c: &mut CompCounters) {
        let moved = p.is_after(self.peer_acked) && p.is_before(self.sent_end);
        if moved {
            self.peer_acked = p;
            self.retry_left = self.retry_cnt;
            self.rnr_left = self.rnr_retry;
            self.arm(now);
        }
        self.advance(now);
        if moved && !p.is_before(self.comp_psn) {
            self.request_holes(p.add(1), c);
        }
    }

    /// Finish WQEs from the head in PSN order: SEND/WRITE through `peer_acked` (a partial
    /// ACK inside a long message advances `comp_psn` too), READ/atomic through the responses
    /// received in `rd_seen`. Stops at the first PSN still missing.
    fn advance(&mut self, now: u64) {
        let before = self.comp_psn;
        let acked = self.peer_acked;
        let mut s = self.sq.head;
        while s < self.sq.tail {
            let w = self.sq.get(s);
            if !w.psn_assigned {
                break;
            }
            if w.done.is_some() || w.npkts == 0 {
                s += 1;
                continue;
            }
            let last = w.last_psn();
            if w.op.is_rd_atomic() {
                if !w.holds(self.comp_psn) {
                    break;
                }
                let mut finished = false;
                loop {
                    let cp = self.comp_psn;
                    if !self.rd_seen.take(cp, cp) {
                        break;
                    }
                    self.comp_psn = cp.add(1);
                    if cp == last {
                        finished = true;
                        break;
                    }
                }
                if !finished {
                    break;
                }
                self.sq.get_mut(s).done = Some(WcStatus::Success);
                s += 1;
                continue;
            }
            if acked.is_before(w.first_psn) {
                break;
            }
            if acked.diff(last) >= 0 {
                self.comp_psn = last.add(1);
                self.sq.get_mut(s).done = Some(WcStatus::Success);
                s += 1;
            } else {
                if acked.add(1).is_after(self.comp_psn) {
                    self.comp_psn = acked.add(1);
                }
                break;
            }
        }
        if self.comp_psn != before {
            self.progress(now);
        }
    }

    /// Start a counted go-back-N retransmission from `comp_psn` at `now`. Returns the error
    /// when the retry budget is exhausted (the WQE is then finished with `RetryExcErr`).
    pub fn retry(&mut self, now: u64) -> Result<(), WcStatus> {
        let p = self.comp_psn;
        self.retry_from(p, now)
    }

    /// A counted go-back-N from `p`, or from `comp_psn` if that is later. The retransmission
    /// timer restarts now: the go-back-N may send nothing at all (every response from there
    /// on may have arrived already, with only a hole re-request, itself lost, outstanding),
    /// and a timer left unarmed while requests are outstanding would wait forever.
    fn retry_from(&mut self, p: Psn, now: u64) -> Result<(), WcStatus> {
        if self.retry_left == 0 {
            if let Some(s) = self.first_pending() {
                self.sq.get_mut(s).done = Some(WcStatus::RetryExcErr);
            }
            return Err(WcStatus::RetryExcErr);
        }
        self.retry_left -= 1;
        let from = if p.is_after(self.comp_psn) {
            p
        } else {
            self.comp_psn
        };
        self.rewind(from);
        self.arm(now);
        Ok(())
    }

    /// The pending WQE that owns PSN `p`.
    fn pending_holding(&self, p: Psn) -> Option<u64> {
        (self.sq.head..self.sq.tail).find(|&s| {
            let w = self.sq.get(s);
            w.done.is_none() && w.holds(p)
        })
    }

    /// Handle an acknowledgement, NAK or response. Returns an error status when a WQE failed
    /// (the QP must go to the error state once it is retired).
    pub fn handle_response(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        kind: OpKind,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        c: &mut CompCounters,
    ) -> Result<(), WcStatus> {
        let p = pkt.hdr.bth.psn;
        // Only PSNs that were sent and are not yet acknowledged mean anything.
        if p.is_before(self.comp_psn) || !p.is_before(self.sent_end) {
            c.responses_ignored += 1;
            return Ok(());
        }
        match kind {
            OpKind::Ack => self.on_ack(now, pkt, c),
            OpKind::ReadResponse | OpKind::AtomicAck => {
                self.on_read_or_atomic(now, pkt, kind, actx, mem, c)
            }
            _ => Ok(()),
        }
    }

    /// An acknowledgement: an ACK, an RNR NAK (resend from the refused request after the
    /// RNR timer), a NAK-sequence (go back to the PSN it names, once per NAK) or another NAK
    /// (the WQE it names fails).
    fn on_ack(&mut self, now: u64, pkt: &Packet<'_>, c: &mut CompCounters) -> Result<(), WcStatus> {
        let p = pkt.hdr.bth.psn;
        let Some(aeth) = pkt.hdr.aeth else {
            return Ok(());
        };
        match aeth.syndrome {
            Syndrome::Ack { .. } => self.ack_through(p, now, c),
            Syndrome::RnrNak { timer } => {
                self.ack_through(p.sub(1), now, c);
                c.rnr_naks_received += 1;
                if self.rnr_left == 0 {
                    if let Some(s) = self.first_pending() {
                        self.sq.get_mut(s).done = Some(WcStatus::RnrRetryExcErr);
                    }
                    return Err(WcStatus::RnrRetryExcErr);
                }
                if self.rnr_retry != 7 {
                    self.rnr_left -= 1;
                }
                // Everything before `p` was executed: resend from the refused request.
                let from = if p.is_after(self.comp_psn) {
                    p
                } else {
                    self.comp_psn
                };
                self.rewind(from);
                self.retrans_deadline = None;
                self.rnr_deadline = Some(now + rnr_backoff_ns(timer));
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                self.ack_through(p.sub(1), now, c);
                c.seq_naks_received += 1;
                if self.rnr_deadline.is_some() || self.nak_retry_psn == Some(p) {
                    // Already going back (after an RNR NAK, or for this very NAK).
                    return Ok(());
                }
                c.retransmits += 1;
                self.retry_from(p, now)?;
                self.nak_retry_psn = Some(p);
            }
            Syndrome::Nak(code) => {
                self.ack_through(p.sub(1), now, c);
                let st = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                let s = self.pending_holding(p).or_else(|| self.first_pending());
                if let Some(s) = s {
                    self.sq.get_mut(s).done = Some(st);
                }
                return Err(st);
            }
            Syndrome::Reserved(_) => c.responses_ignored += 1,
        }
        Ok(())
    }

    /// A READ response or atomic acknowledgement: it acknowledges every request before it,
    /// and its payload is placed into the WQE it answers (in any order within the window;
    /// a hole before it is asked for again).
    fn on_read_or_atomic(
        &mut self,
        now: u64,
        pkt: &Packet<'_>,
        kind: OpKind,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        c: &mut CompCounters,
    ) -> Result<(), WcStatus> {
        let p = pkt.hdr.bth.psn;
        // Responses implicitly acknowledge every request before them.
        self.ack_through(p.sub(1), now, c);
        let Some(s) = self.pending_holding(p) else {
            c.responses_ignored += 1;
            return Ok(());
        };
        let w = self.sq.get(s);
        let matches = match w.op {
            WrOpcode::RdmaRead { .. } => kind == OpKind::ReadResponse,
            _ => w.op.is_atomic() && kind == OpKind::AtomicAck,
        };
        let base = self.comp_psn;
        if !matches || !PsnSet::in_window(base, p) || self.rd_seen.contains(base, p) {
            c.responses_ignored += 1;
            return Ok(());
        }
        let placed = if kind == OpKind::AtomicAck {
            let Some(a) = pkt.hdr.atomic_ack_eth else {
                c.responses_ignored += 1;
                return Ok(());
            };
            place(w, 0, &a.orig.to_ne_bytes(), actx, mem)
        } else {
            let idx = p.diff(w.first_psn) as u32;
            let off = u64::from(idx) * u64::from(self.mtu);
            let expect = (u64::from(w.len) - off).min(u64::from(self.mtu)) as usize;
            if pkt.payload.len() != expect {
                c.responses_ignored += 1;
                return Ok(());
            }
            place(w, off, pkt.payload, actx, mem)
        };
        if let Err(st) = placed {
            if p == base {
                self.sq.get_mut(s).done = Some(st);
                return Err(st);
            }
            // Ahead of a hole: fail it when it is the next response in order.
            c.responses_ignored += 1;
            return Ok(());
        }
        self.rd_seen.insert(base, p);
        if w.rereq_end == Some(p) {
            // The re-request was answered: what is still missing was lost again, and
            // this WQE's PSNs are looked at again.
            let first = w.first_psn;
            self.sq.get_mut(s).rereq_end = None;
            if first.is_before(self.holes_scanned) {
                self.holes_scanned = first;
            }
        }
        self.advance(now);
        if !p.is_before(self.comp_psn) {
            // Data ahead of a hole: the responder is alive (keep the timer off
            // the go-back-N) and the hole is asked for again, once.
            if self.comp_psn == base {
                self.arm(now);
            }
            self.request_holes(p, c);
        }
        Ok(())
    }

    /// Queue re-requests for READ/atomic PSNs missing before `p`: per WQE at most one at a
    /// time, from its lowest missing PSN to the last one missing before `p` (an atomic asks
    /// for its own PSN; the responder answers duplicates from its history). Always starting
    /// at the lowest missing PSN matters: Linux rxe narrows a READ's replayable range to the
    /// start of the latest re-request, so asking for a later hole first would make an
    /// earlier one unreachable.
    ///
    /// PSNs before `holes_scanned` were looked at already (what is missing there belongs to a
    /// WQE with a re-request under way), so a stream of responses after a hole costs each PSN
    /// one look, not one per packet.
    fn request_holes(&mut self, p: Psn, c: &mut CompCounters) {
        let base = self.comp_psn;
        let from = if self.holes_scanned.is_after(base) {
            self.holes_scanned
        } else {
            base
        };
        if !from.is_before(p) {
            return;
        }
        self.holes_scanned = p;
        for s in self.sq.head..self.sq.tail {
            let w = self.sq.get(s);
            if !w.psn_assigned || !w.first_psn.is_before(p) {
                break;
            }
            if w.done.is_some() || w.npkts == 0 || !w.op.is_rd_atomic() || w.rereq_end.is_some() {
                continue;
            }
            let end = w.last_psn().add(1);
            let stop = if p.is_before(end) { p } else { end };
            if !from.is_before(end) {
                continue;
            }
            let mut q = if from.is_after(w.first_psn) {
                from
            } else {
                w.first_psn
            };
            let mut first = None;
            let mut last = q;
            while q.is_before(stop) {
                if !self.rd_seen.contains(base, q) {
                    first.get_or_insert(q);
                    last = q;
                }
                q = q.add(1);
            }
            let Some(first) = first else { continue };
            if self.rereq.len() >= MAX_REREQUESTS {
                // Look here again next time.
                self.holes_scanned = w.first_psn;
                return;
            }
            self.rereq.push_back(ReRequest {
                seq: s,
                psn: first,
                npkts: last.diff(first) as u32 + 1,
            });
            self.sq.get_mut(s).rereq_end = Some(last);
            c.rerequests += 1;
        }
    }

    /// The retransmission or RNR timer fired (or not yet: checked against `now`).
    pub fn handle_timeout(&mut self, now: u64, c: &mut CompCounters) -> Result<(), WcStatus> {
        if self.rnr_deadline.is_some_and(|d| d <= now) {
            self.rnr_deadline = None;
            // The retransmission timer was off during the back-off; it runs again from now
            // (the resend may skip everything, as after a NAK: see `retry_from`).
            if self.retrans_deadline.is_none() {
                self.arm(now);
            }
        }
        if self.retrans_deadline.is_some_and(|d| d <= now) {
            self.retrans_deadline = None;
            self.nak_retry_psn = None;
            // The go-back-N asks again for every hole (responses received ahead are kept;
            // each READ is asked for again from its lowest missing PSN).
            self.rereq.clear();
            self.holes_scanned = self.comp_psn;
            for s in self.sq.head..self.sq.tail {
                self.sq.get_mut(s).rereq_end = None;
            }
            if self.outstanding() {
                c.timeouts += 1;
                c.retransmits += 1;
                // Silence may mean a responder swamped by the last window: go back with a
                // small one and let acknowledgements open it again.
                self.cwnd = RESTART_WINDOW;
                self.retry(now)?;
            }
        }
        Ok(())
    }

    /// Retire finished WQEs from the head in posting order into `cq` (while it has room).
    /// Returns the status of an error completion, after which the QP must enter the error
    /// state.
    pub fn retire(
        &mut self,
        qpn: u32,
        sig_all: bool,
        cq: &mut VecDeque<WorkCompletion>,
        cap: usize,
    ) -> Option<WcStatus> {
        while self.sq.head < self.sq.tail {
            let w = self.sq.get(self.sq.head);
            let Some(st) = w.done else { break };
            let report = st != WcStatus::Success || w.signaled || sig_all;
            if report && cq.len() >= cap {
                break;
            }
            if report {
                let byte_len = match w.op {
                    WrOpcode::RdmaRead { .. } => w.len,
                    WrOpcode::AtomicCmpAndSwp { .. } | WrOpcode::AtomicFetchAndAdd { .. } => 8,
                    _ => w.len,
                };
                cq.push_back(WorkCompletion {
                    wr_id: w.wr_id,
                    status: st,
                    opcode: w.op.wc_opcode(),
                    byte_len,
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: qpn,
                    src_qp: self.dest_qpn,
                    solicited: false,
                    grh: None,
                });
            }
            self.sq.pop();
            if st != WcStatus::Success && st != WcStatus::WrFlushErr {
                return Some(st);
            }
        }
        None
    }

    /// Finish every unfinished WQE with `WR_FLUSH_ERR` (the QP entered the error state).
    pub fn flush(&mut self) {
        for s in self.sq.head..self.sq.tail {
            let w = self.sq.get_mut(s);
            if w.done.is_none() {
                w.done = Some(WcStatus::WrFlushErr);
            }
        }
        self.retrans_deadline = None;
        self.rnr_deadline = None;
        self.rereq.clear();
        self.rd_seen.clear();
        self.halted = true;
    }
}

/// Write READ response data or an atomic's original value into the WQE's local SGEs.
fn place(
    w: &super::sq::SendWqe,
    off: u64,
    data: &[u8],
    actx: AccessCtx,
    mem: &dyn MemoryAccess,
) -> Result<(), WcStatus> {
    match w
        .sges
        .for_each_piece(off, data.len(), |sge, soff, doff, n| {
            mem.write(
                actx,
                sge.lkey,
                sge.addr.wrapping_add(soff),
                &data[doff..doff + n],
                Access::LOCAL_WRITE,
            )
        }) {
        Ok(true) => Ok(()),
        Ok(false) => Err(WcStatus::LocLenErr),
        Err(_) => Err(WcStatus::LocProtErr),
    }
}
