//! A region invalidated under the responder: whether it uses the region, and the NAK that
//! ends a message or READ response stream the region was under (see
//! [`Qp::access_violation`](crate::rc::Qp::access_violation)).

use super::{InMsg, RecvSide, Response};
use crate::wire::{NakCode, Psn, Syndrome};

/// How far before the remembered PSN a resent READ of a cut-short stream may start and still
/// draw its NAK: the PSNs one READ response stream can span (2 GiB at a 256-byte MTU: 2^23).
const STREAM_WINDOW: i32 = 1 << 23;

impl RecvSide {
    /// True when the responder uses a key `names` picks: a message in progress into it (a
    /// WRITE's R_Key, a SEND's receive buffer), a READ response stream out of it, or a receive
    /// posted on the QP's own RQ that names it.
    pub fn uses_key(&self, names: &dyn Fn(u32) -> bool) -> bool {
        let in_msg = match self.msg {
            InMsg::Idle => false,
            InMsg::Send { wqe, .. } => wqe.sges.names_key(names),
            InMsg::Write { rkey, .. } => names(rkey),
        };
        in_msg
            || self.rq.names_key(names)
            || self.stopped_stream.is_some_and(|(_, k)| names(k))
            || self
                .resp
                .iter()
                .any(|r| matches!(r, Response::Read(s) if names(s.rkey)))
    }

    /// The memory under a message in progress or a READ response stream went away (the
    /// region `names` picks was invalidated): queue the NAK that ends it at the requester, so
    /// that it completes that WR with an error instead of retrying into a dead QP. One NAK,
    /// for the earlier of the two (a stream's PSNs precede a message received after it):
    ///
    /// * a READ stream (or one stopped while the region was suspended, which the requester
    ///   will ask for again): at its next response's PSN, which the requester sent (the READ
    ///   request covers the PSNs of all its responses);
    /// * a WRITE or SEND in progress: at the expected PSN, the message's next packet. The
    ///   requester may not have sent it yet, and then ignores the NAK; so the QP remembers it
    ///   ([`RecvSide::answer_violation`]) and NAKs that packet when it comes (the requester
    ///   sends it, or resends up to it after a timeout).
    ///
    /// The caller moves the QP to the error state, which keeps queued NAKs. Returns whether a
    /// NAK was queued.
    pub fn abort_for_region(&mut self, names: &dyn Fn(u32) -> bool) -> bool {
        let stream = self
            .resp
            .iter()
            .find_map(|r| match *r {
                Response::Read(s) if names(s.rkey) && !s.dup => Some(s.psn),
                _ => None,
            })
            .or(self
                .stopped_stream
                .filter(|&(_, k)| names(k))
                .map(|(p, _)| p));
        let nak = match (stream, self.msg) {
            (Some(psn), _) => Some((psn, NakCode::RemoteAccessError)),
            (None, InMsg::Write { rkey, .. }) if names(rkey) => {
                Some((self.epsn, NakCode::RemoteAccessError))
            }
            (None, InMsg::Send { wqe, .. }) if wqe.sges.names_key(names) => {
                Some((self.epsn, NakCode::RemoteOperationalError))
            }
            _ => None,
        };
        let Some((psn, code)) = nak else {
            return false;
        };
        self.violation = Some((psn, code, stream.is_some()));
        self.resp.clear();
        self.rd_atomic_queued = 0;
        self.dup_queued = 0;
        self.push_ack(psn, Syndrome::Nak(code));
        true
    }

    /// In the error state after [`RecvSide::abort_for_region`] cut a message or a READ
    /// response stream short: a request at the remembered PSN draws the NAK again (one at a
    /// time). For a stream, whose NAK may be lost like any packet, a READ the requester
    /// resends from any PSN of the stream up to the remembered one (it restarts at the first
    /// response it is missing) draws the NAK at its own PSN. Returns whether a NAK was queued.
    pub fn answer_violation(&mut self, psn: Psn) -> bool {
        match self.violation {
            Some((p, code, stream)) if self.resp.is_empty() => {
                let at = if p == psn {
                    p
                } else if stream && psn.is_before(p) && p.diff(psn) < STREAM_WINDOW {
                    psn
                } else {
                    return false;
                };
                self.push_ack(at, Syndrome::Nak(code));
                true
            }
            _ => false,
        }
    }
}
