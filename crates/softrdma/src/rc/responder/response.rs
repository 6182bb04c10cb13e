//! The responder's answers on the wire: ACKs, NAKs, RNR NAKs, atomic acknowledgements and
//! READ response streams, emitted in PSN order from the queue the responder fills.

use super::{Fatal, NO_CREDITS, ReadStream, RecvSide, Response, map_err};
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

/// What a READ response's payload is read with ([`RecvSide::poll_response`]'s arguments).
struct ReadEnv<'a> {
    actx: AccessCtx,
    mem: &'a dyn MemoryAccess,
    icrc: &'a IcrcPrefix,
    buf: &'a mut [u8],
    gather: Option<&'a mut Gather>,
}

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
        let Some(&front) = self.resp.front() else {
            return Ok(None);
        };
        let dest = self.dest_qpn;
        let sealed = |h: &HeaderRepr, buf: &mut [u8]| {
            emit_sealed(h, 0, icrc, buf, |_| Ok::<(), WcStatus>(())).ok()
        };
        match front {
            Response::Ack { psn, syndrome, msn } => {
                let mut h = HeaderRepr::new(BthRepr::new(Opcode::RC_ACK, dest, psn));
                h.aeth = Some(AethRepr { syndrome, msn });
                self.resp.pop_front();
                Ok(sealed(&h, buf))
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
                Ok(sealed(&h, buf))
            }
            Response::Read(s) => {
                let env = ReadEnv {
                    actx,
                    mem,
                    icrc,
                    buf,
                    gather,
                };
                self.emit_read_response(s, env)
            }
        }
    }

    /// The next response of READ stream `s` (the queue's front): its payload lent or copied,
    /// then the stream advanced, finished, stopped (a suspended region) or ended in a NAK.
    fn emit_read_response(
        &mut self,
        s: ReadStream,
        env: ReadEnv<'_>,
    ) -> Result<Option<usize>, Fatal> {
        let plen = s.remaining.min(self.mtu);
        let last = plen == s.remaining;
        let opcode = match (s.started, last) {
            (false, true) => Opcode::RC_READ_RESPONSE_ONLY,
            (false, false) => Opcode::RC_READ_RESPONSE_FIRST,
            (true, true) => Opcode::RC_READ_RESPONSE_LAST,
            (true, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
        };
        let mut h = HeaderRepr::new(BthRepr::new(opcode, self.dest_qpn, s.psn));
        if !s.started || last {
            h.aeth = Some(AethRepr {
                syndrome: NO_CREDITS,
                msn: s.msn,
            });
        }
        match read_payload(&h, &s, plen, env) {
            Ok(n) => {
                self.advance_stream(&s, plen, last);
                Ok(Some(n))
            }
            Err(Some(AccessError::Suspended(_))) => {
                self.stop_stream(&s);
                Ok(None)
            }
            Err(Some(e)) => {
                let code = map_err(e).unwrap_or(NakCode::RemoteAccessError);
                // A resend of the READ, from any PSN of its stream up to this one,
                // draws the NAK again in the error state (`answer_violation`).
                self.violation = Some((s.psn, code, true));
                self.resp.clear();
                self.rd_atomic_queued = 0;
                self.dup_queued = 0;
                self.push_ack(s.psn, Syndrome::Nak(code));
                Err(Fatal)
            }
            Err(None) => {
                // The packet could not be built (no room): the answer is dropped and
                // its slot freed; the requester times out and asks again.
                self.resp.pop_front();
                self.answered(s.dup);
                Ok(None)
            }
        }
    }

    /// A response of `plen` bytes of stream `s` went out: the stream ends with its `last`, or
    /// moves on to its next PSN.
    fn advance_stream(&mut self, s: &ReadStream, plen: u32, last: bool) {
        if last {
            self.resp.pop_front();
            self.answered(s.dup);
            if self
                .stopped_stream
                .is_some_and(|(p, k)| k == s.rkey && p.diff(s.psn) <= 0)
            {
                self.stopped_stream = None;
            }
        } else if let Some(Response::Read(f)) = self.resp.front_mut() {
            f.psn = f.psn.add(1);
            f.va = f.va.wrapping_add(u64::from(plen));
            f.remaining -= plen;
            f.started = true;
        }
    }

    /// The region under stream `s` is suspended: the stream stops and the requester is told
    /// to wait (an RNR NAK at the stream's next PSN, which it sent), then asks again from
    /// there; the repeat is served once the region is resumed. Until then the QP still uses
    /// the region.
    fn stop_stream(&mut self, s: &ReadStream) {
        if self.stopped_stream.is_none() {
            self.stopped_stream = Some((s.psn, s.rkey));
        }
        self.resp.pop_front();
        self.answered(s.dup);
        self.stream_rnr_naks += 1;
        let (timer, msn) = (self.min_rnr_timer, self.msn);
        self.resp.push_front(Response::Ack {
            psn: s.psn,
            syndrome: Syndrome::RnrNak { timer },
            msn,
        });
    }
}

/// Build READ response `h` with the next `plen` bytes of stream `s`: lent when a gather
/// takes them (the rest of the stream is lent with them: its later packets cut theirs from
/// it), else copied. `Err(Some(e))` when memory refused, `Err(None)` when the packet could not
/// be built.
fn read_payload(
    h: &HeaderRepr,
    s: &ReadStream,
    plen: u32,
    env: ReadEnv<'_>,
) -> Result<usize, Option<AccessError>> {
    let ReadEnv {
        actx,
        mem,
        icrc,
        buf,
        gather,
    } = env;
    if let Some(g) = gather.filter(|_| plen as usize >= LEND_MIN) {
        g.set_stage_room(crate::mem::STAGE_MAX as u64);
        let piece = crate::rc::gather::Piece {
            tag: READ_RESPONSE_TAG | u64::from(s.msn),
            actx,
            key: s.rkey,
            iova: s.va,
            len: plen as usize,
            ahead: u64::from(s.remaining - plen),
            access: Access::REMOTE_READ,
        };
        match g.lend(mem, piece) {
            Ok(true) => return emit_lent(h, plen as usize, icrc, buf, g).map_err(|_| None),
            Ok(false) => {}
            Err(e) => return Err(Some(e)),
        }
    }
    let mut failed = None;
    emit_sealed(h, plen as usize, icrc, buf, |dst| {
        if dst.is_empty() {
            return Ok(());
        }
        mem.read(actx, s.rkey, s.va, dst, Access::REMOTE_READ)
            .map_err(|e| {
                failed = Some(e);
                WcStatus::RemAccessErr
            })
    })
    .map_err(|_| failed)
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
