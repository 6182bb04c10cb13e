//! The completer: acknowledgements and responses in, WQEs finished and retired in posting
//! order (rxe's `rxe_comp.c`). Also the retransmission timer, go-back-N on NAK-sequence and
//! on timeout, the RNR back-off, and the retry counters.

use std::collections::VecDeque;

use super::sq::SendSide;
use super::timer::rnr_backoff_ns;
use super::wr::{WcStatus, WorkCompletion, WrOpcode};
use crate::mem::{Access, AccessCtx, MemoryAccess};
use crate::wire::{NakCode, OpKind, Packet, Psn, Syndrome};

/// Counters the completer keeps (part of [`super::QpCounters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompCounters {
    /// Go-back-N retransmissions started (timeouts, NAK-sequence, response gaps).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// NAK-sequence errors received.
    pub seq_naks_received: u64,
    /// Responses ignored (stale, duplicate or unexpected).
    pub responses_ignored: u64,
}

impl SendSide {
    fn progress(&mut self, now: u64) {
        self.retry_pending = false;
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.retrans_deadline = if self.outstanding() {
            self.timeout_ns.map(|t| now + t)
        } else {
            None
        };
    }

    /// Finish SEND/WRITE WQEs whose last PSN is at or before `p`; stop at a READ/atomic not
    /// yet answered. Advances `comp_psn` (a partial ACK inside a long message too).
    fn ack_through(&mut self, p: Psn, now: u64) {
        let before = self.comp_psn;
        let mut s = self.sq.head;
        while s < self.sq.tail {
            let w = self.sq.get(s);
            if w.done.is_some() || w.npkts == 0 {
                if !w.psn_assigned {
                    break;
                }
                s += 1;
                continue;
            }
            if !w.psn_assigned || p.is_before(w.first_psn) {
                break;
            }
            if w.op.is_rd_atomic() {
                break;
            }
            let last = w.last_psn();
            if p.diff(last) >= 0 {
                self.comp_psn = last.add(1);
                self.sq.get_mut(s).done = Some(WcStatus::Success);
                s += 1;
            } else {
                self.comp_psn = p.add(1);
                break;
            }
        }
        if self.comp_psn != before {
            self.progress(now);
        }
    }

    /// A go-back-N asked for by the peer (NAK-sequence) or implied by a response gap: one
    /// per round until progress is made.
    fn retry_on_nak(&mut self, c: &mut CompCounters) -> Result<(), WcStatus> {
        if self.retry_pending {
            return Ok(());
        }
        c.retransmits += 1;
        self.retry()?;
        self.retry_pending = true;
        Ok(())
    }

    /// Start a counted go-back-N retransmission from `comp_psn`. Returns the error when the
    /// retry budget is exhausted (the WQE is then finished with `RetryExcErr`).
    pub fn retry(&mut self) -> Result<(), WcStatus> {
        if self.retry_left == 0 {
            if let Some(s) = self.first_pending() {
                self.sq.get_mut(s).done = Some(WcStatus::RetryExcErr);
            }
            return Err(WcStatus::RetryExcErr);
        }
        self.retry_left -= 1;
        let p = self.comp_psn;
        self.rewind(p);
        self.retrans_deadline = None;
        Ok(())
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
            OpKind::Ack => {
                let Some(aeth) = pkt.hdr.aeth else {
                    return Ok(());
                };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => self.ack_through(p, now),
                    Syndrome::RnrNak { timer } => {
                        self.ack_through(p.sub(1), now);
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
                        let cp = self.comp_psn;
                        self.rewind(cp);
                        self.retrans_deadline = None;
                        self.rnr_deadline = Some(now + rnr_backoff_ns(timer));
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.ack_through(p.sub(1), now);
                        c.seq_naks_received += 1;
                        if self.rnr_deadline.is_some() {
                            // Already going back after an RNR NAK.
                            return Ok(());
                        }
                        self.retry_on_nak(c)?;
                    }
                    Syndrome::Nak(code) => {
                        self.ack_through(p.sub(1), now);
                        let st = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        let s = (self.sq.head..self.sq.tail)
                            .find(|&s| self.sq.get(s).done.is_none() && self.sq.get(s).holds(p))
                            .or_else(|| self.first_pending());
                        if let Some(s) = s {
                            self.sq.get_mut(s).done = Some(st);
                        }
                        return Err(st);
                    }
                    Syndrome::Reserved(_) => c.responses_ignored += 1,
                }
                Ok(())
            }
            OpKind::ReadResponse | OpKind::AtomicAck => {
                // Responses implicitly acknowledge everything before them.
                self.ack_through(p.sub(1), now);
                let Some(s) = self.first_pending() else {
                    return Ok(());
                };
                let w = self.sq.get(s);
                let matches = match w.op {
                    WrOpcode::RdmaRead { .. } => kind == OpKind::ReadResponse,
                    _ => w.op.is_atomic() && kind == OpKind::AtomicAck,
                };
                if !w.psn_assigned || !matches || !w.holds(p) {
                    c.responses_ignored += 1;
                    return Ok(());
                }
                if p != self.comp_psn {
                    // A gap in the response stream: an implied NAK-sequence.
                    return self.retry_on_nak(c);
                }
                let done = if kind == OpKind::AtomicAck {
                    let Some(a) = pkt.hdr.atomic_ack_eth else {
                        return Ok(());
                    };
                    if let Err(st) = place(w, 0, &a.orig.to_ne_bytes(), actx, mem) {
                        self.sq.get_mut(s).done = Some(st);
                        return Err(st);
                    }
                    true
                } else {
                    let idx = p.diff(w.first_psn) as u32;
                    let off = u64::from(idx) * u64::from(self.mtu);
                    let expect = (u64::from(w.len) - off).min(u64::from(self.mtu)) as usize;
                    if pkt.payload.len() != expect {
                        c.responses_ignored += 1;
                        return Ok(());
                    }
                    if let Err(st) = place(w, off, pkt.payload, actx, mem) {
                        self.sq.get_mut(s).done = Some(st);
                        return Err(st);
                    }
                    p == w.last_psn()
                };
                self.comp_psn = p.add(1);
                if done {
                    self.sq.get_mut(s).done = Some(WcStatus::Success);
                }
                self.progress(now);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The retransmission or RNR timer fired (or not yet: checked against `now`).
    pub fn handle_timeout(&mut self, now: u64, c: &mut CompCounters) -> Result<(), WcStatus> {
        if self.rnr_deadline.is_some_and(|d| d <= now) {
            self.rnr_deadline = None;
        }
        if self.retrans_deadline.is_some_and(|d| d <= now) {
            self.retrans_deadline = None;
            self.retry_pending = false;
            if self.outstanding() {
                c.timeouts += 1;
                c.retransmits += 1;
                self.retry()?;
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
