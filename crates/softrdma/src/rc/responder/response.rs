//! The responder's answers on the wire: ACKs, NAKs, RNR NAKs, atomic acknowledgements and
//! READ response streams, emitted in PSN order from the queue the responder fills.

use super::{Fatal, NO_CREDITS, RecvSide, Response, map_err};
use crate::mem::{Access, AccessCtx, AccessError, MemoryAccess};
use crate::rc::emit::{LEND_MIN, emit_lent, emit_sealed};
use crate::rc::gather::Gather;
use crate::rc::wr::WcStatus;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, HeaderRepr, IcrcPrefix, NakCode, Opcode, Syndrome,
};

/// Anchor tags of READ responses (their MSN below), apart from the requester's (SQ sequence
/// numbers, far below 2^63).
const READ_RESPONSE_TAG: u64 = 1 << 63;

impl RecvSide {
    /// Emit the next queued answer into `buf`. `Err(Fatal)` when a READ could not be served and
    /// was NAKed (the QP must enter the error state).
    ///
    /// With `gather`, a READ response payload of at least [`LEND_MIN`] bytes from memory that
    /// can be lent is not copied into `buf` (see [`Gather`]).
    pub fn poll_response(
        &mut self,
        actx: AccessCtx,
        mem: &dyn MemoryAccess,
        icrc: &IcrcPrefix,
        buf: &mut [u8],
        gather: Option<&mut Gather>,
    ) -> Result<Option<usize>, Fatal> {
        let Some(front) = self.resp.front_mut() else {
            return Ok(None);
        };
        let dest = self.dest_qpn;
        match *front {
            Response::Ack { psn, syndrome, msn } => {
                let mut h = HeaderRepr::new(BthRepr::new(Opcode::RC_ACK, dest, psn));
                h.aeth = Some(AethRepr { syndrome, msn });
                self.resp.pop_front();
                Ok(emit_sealed(&h, 0, icrc, buf, |_| Ok::<(), WcStatus>(())).ok())
            }
            Response::Atomic {
                psn,
                orig,
                msn,
                dup,
            } => {
                let mut h = HeaderRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACK, dest, psn));
                h.aeth = Some(AethRepr {
                    syndrome: NO_CREDITS,
                    msn,
                });
                h.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                self.resp.pop_front();
                self.answered(dup);
                Ok(emit_sealed(&h, 0, icrc, buf, |_| Ok::<(), WcStatus>(())).ok())
            }
            Response::Read {
                psn,
                va,
                rkey,
                remaining,
                started,
                msn,
                dup,
            } => {
                let plen = remaining.min(self.mtu);
                let last = plen == remaining;
                let opcode = match (started, last) {
                    (false, true) => Opcode::RC_READ_RESPONSE_ONLY,
                    (false, false) => Opcode::RC_READ_RESPONSE_FIRST,
                    (true, true) => Opcode::RC_READ_RESPONSE_LAST,
                    (true, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
                };
                let mut h = HeaderRepr::new(BthRepr::new(opcode, dest, psn));
                if !started || last {
                    h.aeth = Some(AethRepr {
                        syndrome: NO_CREDITS,
                        msn,
                    });
                }
                let mut failed = None;
                let lent = match gather {
                    Some(g) if plen as usize >= LEND_MIN => {
                        // The rest of the response is lent with this packet's payload (its
                        // later packets cut theirs from it).
                        let ahead = u64::from(remaining - plen);
                        let tag = READ_RESPONSE_TAG | u64::from(msn);
                        let access = Access::REMOTE_READ;
                        g.set_stage_room(crate::mem::STAGE_MAX as u64);
                        let piece = crate::rc::gather::Piece {
                            tag,
                            actx,
                            key: rkey,
                            iova: va,
                            len: plen as usize,
                            ahead,
                            access,
                        };
                        match g.lend(mem, piece) {
                            Ok(true) => Some(emit_lent(&h, plen as usize, icrc, buf, g)),
                            Ok(false) => None,
                            Err(e) => {
                                failed = Some(e);
                                Some(Err(WcStatus::RemAccessErr))
                            }
                        }
                    }
                    _ => None,
                };
                let r = match lent {
                    Some(r) => r,
                    None => emit_sealed(&h, plen as usize, icrc, buf, |dst| {
                        if dst.is_empty() {
                            return Ok(());
                        }
                        mem.read(actx, rkey, va, dst, Access::REMOTE_READ)
                            .map_err(|e| {
                                failed = Some(e);
                                WcStatus::RemAccessErr
                            })
                    }),
                };
                match (r, failed) {
                    (Ok(n), _) => {
                        if last {
                            self.resp.pop_front();
                            self.answered(dup);
                            if self
                                .stopped_stream
                                .is_some_and(|(p, k)| k == rkey && p.diff(psn) <= 0)
                            {
                                self.stopped_stream = None;
                            }
                        } else if let Some(Response::Read {
                            psn,
                            va,
                            remaining,
                            started,
                            ..
                        }) = self.resp.front_mut()
                        {
                            *psn = psn.add(1);
                            *va = va.wrapping_add(u64::from(plen));
                            *remaining -= plen;
                            *started = true;
                        }
                        Ok(Some(n))
                    }
                    (Err(_), Some(AccessError::Suspended(_))) => {
                        // The region is suspended: the stream stops and the requester is told
                        // to wait (an RNR NAK at the stream's next PSN, which it sent), then
                        // asks again from there; the repeat is served once the region is
                        // resumed. Until then the QP still uses the region.
                        if self.stopped_stream.is_none() {
                            self.stopped_stream = Some((psn, rkey));
                        }
                        self.resp.pop_front();
                        self.answered(dup);
                        self.stream_rnr_naks += 1;
                        let (timer, msn) = (self.min_rnr_timer, self.msn);
                        self.resp.push_front(Response::Ack {
                            psn,
                            syndrome: Syndrome::RnrNak { timer },
                            msn,
                        });
                        Ok(None)
                    }
                    (Err(_), Some(e)) => {
                        let code = map_err(e).unwrap_or(NakCode::RemoteAccessError);
                        // A resend of the READ, from any PSN of its stream up to this one,
                        // draws the NAK again in the error state (`answer_violation`).
                        self.violation = Some((psn, code, true));
                        self.resp.clear();
                        self.rd_atomic_queued = 0;
                        self.dup_queued = 0;
                        self.push_ack(psn, Syndrome::Nak(code));
                        Err(Fatal)
                    }
                    (Err(_), None) => {
                        // The packet could not be built (no room): the answer is dropped and
                        // its slot freed; the requester times out and asks again.
                        self.resp.pop_front();
                        self.answered(dup);
                        Ok(None)
                    }
                }
            }
        }
    }
}

impl RecvSide {
    /// A READ/atomic answer left the queue: its slot is free (a duplicate's among the
    /// duplicates').
    fn answered(&mut self, dup: bool) {
        self.rd_atomic_queued = self.rd_atomic_queued.saturating_sub(1);
        if dup {
            self.dup_queued = self.dup_queued.saturating_sub(1);
        }
    }
}
