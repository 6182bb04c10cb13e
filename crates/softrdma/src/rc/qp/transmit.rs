//! What a QP sends: responder answers first, then requests (local WRs executed in queue
//! order on the way), with the held-ACK choice and the gather for lent payloads.

use super::*;

impl Qp {
    /// Produce the next packet to send into `buf` (at least [`Qp::max_packet_len`] bytes):
    /// responder answers first, then requests. Also executes local WRs (LOCAL_INV, BIND_MW).
    /// Returns the UDP payload length.
    pub fn poll_transmit(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
    ) -> Option<usize> {
        self.transmit(now, mem, buf, None, Answers::All)
    }

    /// [`Qp::poll_transmit`], with request and READ response payloads from memory that can
    /// be lent left in place: see [`Gather`](crate::rc::Gather) for what the packet then is.
    /// The gather is empty after a packet built the usual way.
    ///
    /// With `hold_ack`, a positive acknowledgement that is the only answer waiting is left
    /// queued (see [`Qp::holds_ack`]) and requests go out past it.
    pub fn poll_transmit_gather(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
        gather: &mut crate::rc::Gather,
        hold_ack: bool,
    ) -> Option<usize> {
        gather.clear();
        let answers = if hold_ack {
            Answers::HoldLoneAck
        } else {
            Answers::All
        };
        self.transmit(now, mem, buf, Some(gather), answers)
    }

    /// [`Qp::poll_transmit_gather`] for requests only: answers (READ response streams among
    /// them) stay queued. A driver that gives each QP a budget of answers per pass uses it
    /// once the budget is spent, so that a long READ response stream cannot hold back the
    /// QP's own requests, nor keep the driver from its other QPs.
    pub fn poll_request_gather(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
        gather: &mut crate::rc::Gather,
    ) -> Option<usize> {
        gather.clear();
        self.transmit(now, mem, buf, Some(gather), Answers::Later)
    }

    /// True when answers wait to be sent (a lone positive acknowledgement among them).
    pub fn has_response_work(&self) -> bool {
        self.recv.has_response()
    }

    /// UD: where the next request goes (each work request names its destination), so that a
    /// driver addresses the datagram before building it. `None` for RC and UC (they send to
    /// the address vector) and when no request waits.
    pub fn next_datagram_dest(&self) -> Option<AddressVector> {
        if self.qp_type != QpType::Ud {
            return None;
        }
        self.send.next_ud_dest()
    }

    /// True while request packets sent wait for their acknowledgement or response.
    pub fn requests_outstanding(&self) -> bool {
        self.send.outstanding()
    }

    /// True when a request is left to start or continue (see [`Qp::has_transmit_work`]).
    pub fn has_request_work(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd) && self.send.has_request_work()
    }

    /// A mark that moves whenever the transport accepts a packet as new progress: the
    /// responder's expected PSN (an in-order request executed) and the completer's oldest
    /// unacknowledged PSN (an acknowledgement or response for outstanding work). A driver
    /// compares it before and after [`Qp::handle_packet`] to tell a packet that passed full
    /// transport validation from one that was dropped, a duplicate, or a NAK.
    pub fn progress_mark(&self) -> (u32, u32) {
        (self.recv.epsn.value(), self.send.comp_psn.value())
    }

    /// False when a transmit poll would produce nothing now: no answer waits, and no request
    /// is left to start or continue (a driver may skip the poll). True does not promise a
    /// packet (the window, a fence or an RNR wait may hold the next request back).
    pub fn has_transmit_work(&self) -> bool {
        self.recv.has_response()
            || (matches!(self.state, QpState::Rts | QpState::Sqd) && self.send.has_request_work())
    }

    /// True when the only answer waiting is a positive acknowledgement, which a driver may
    /// hold back: acknowledgements are cumulative, so newer ones replace it until it is sent
    /// (by a transmit poll without `hold_ack`). Nothing else waits behind a held one.
    pub fn holds_ack(&self) -> bool {
        self.recv.has_lone_ack()
    }

    /// The next packet: answers as `answers` says, then requests (UC and UD: requests only).
    fn transmit(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
        gather: Option<&mut crate::rc::Gather>,
        answers: Answers,
    ) -> Option<usize> {
        let built = self.transmit_one(now, mem, buf, gather, answers);
        self.send.debug_check();
        built
    }

    fn transmit_one(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
        mut gather: Option<&mut crate::rc::Gather>,
        answers: Answers,
    ) -> Option<usize> {
        if buf.len() < self.max_packet_len() || self.state == QpState::Reset {
            return None;
        }
        if self.qp_type.is_unreliable() {
            return self.transmit_unreliable(now, mem, buf, gather);
        }
        let icrc = *self.attr.av.as_ref()?.prefix();
        let answer = match answers {
            Answers::All => self.recv.has_response(),
            Answers::HoldLoneAck => self.recv.has_response() && !self.recv.has_lone_ack(),
            Answers::Later => false,
        };
        if answer {
            let actx = self.actx();
            match self
                .recv
                .poll_response(actx, mem, &icrc, buf, gather.as_deref_mut())
            {
                Ok(Some(n)) => {
                    self.counters.packets_sent += 1;
                    return Some(n);
                }
                Ok(None) if self.recv.stream_rnr_naks > 0 => {
                    // A READ stream met a suspended region: its RNR NAK goes next.
                    self.counters.resp.rnr_naks_sent +=
                        std::mem::take(&mut self.recv.stream_rnr_naks);
                    return self.transmit(now, mem, buf, gather, answers);
                }
                Ok(None) => {}
                Err(Fatal) => {
                    self.enter_error();
                    return self.transmit(now, mem, buf, gather, answers);
                }
            }
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let env = crate::rc::requester::ReqEnv {
            actx: self.actx(),
            mem,
            icrc: &icrc,
            buf,
            gather,
        };
        let out = self.send.poll_request(now, self.state == QpState::Sqd, env);
        self.sent(out)
    }

    /// UC and UD: the next request (nothing is answered).
    fn transmit_unreliable(
        &mut self,
        now: u64,
        mem: &dyn MemoryAccess,
        buf: &mut [u8],
        gather: Option<&mut crate::rc::Gather>,
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let env = crate::rc::unreliable::TxEnv {
            qp_type: self.qp_type,
            now,
            sqd: self.state == QpState::Sqd,
            actx: self.actx(),
            mem,
            icrc: self.attr.av.as_ref().map(AddressVector::prefix),
            qkey: self.attr.qkey,
        };
        let out = self.send.poll_unreliable(&env, buf, gather);
        self.sent(out)
    }

    /// After a request poll: finished WQEs retire, a packet is counted.
    fn sent(&mut self, out: ReqOutput) -> Option<usize> {
        self.retire();
        match out {
            ReqOutput::Packet(n) => {
                self.counters.packets_sent += 1;
                Some(n)
            }
            ReqOutput::Idle => None,
        }
    }
}

/// Which answers a transmit poll sends before requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answers {
    /// Every queued answer first.
    All,
    /// Every queued answer, except a positive acknowledgement that is the only one waiting
    /// (held: see [`Qp::holds_ack`]).
    HoldLoneAck,
    /// None: answers stay queued for a later poll.
    Later,
}
