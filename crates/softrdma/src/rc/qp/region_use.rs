//! A region going away under a QP: whether the QP uses it, and the access violation that ends
//! the QP (seed 001: "declare an access violation and tear all the connections using it
//! down"). The driver finds the QPs (docs/COHERENCE.md, "Connections using a region").

use super::Qp;
use crate::rc::qp_state::QpState;

impl Qp {
    /// True when the QP, in a state that moves data, uses the region `names` picks (by its
    /// L_Key, or the R_Key of a window bound to it): a send WR not yet finished names it (a
    /// local buffer, or a window bind's parent region), the responder has a message in
    /// progress into it or a READ response stream out of it, or a receive posted on the QP's
    /// own RQ names it. Receives waiting in an SRQ belong to no QP until one takes them.
    pub fn uses_region(&self, names: &dyn Fn(u32) -> bool) -> bool {
        matches!(
            self.state,
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd
        ) && (self.send.names_key(names) || self.recv.uses_key(names))
    }

    /// A key this QP invalidated (its LOCAL_INV, or a peer's SEND with Invalidate) since the
    /// last call. Before the driver reports that work's completion it waits until no byte lent
    /// from the key's region is unsent (`MemoryTable::wait_unlent`): a request built before
    /// the invalidation may still hold the region's bytes for the socket (in this QP's
    /// transmit batch, sent by the time completions are drained, or another QP's).
    pub fn pop_invalidated(&mut self) -> Option<u32> {
        self.send
            .invalidated
            .pop()
            .or_else(|| self.recv.invalidated.pop())
    }

    /// The region `names` picks was invalidated while this QP used it: end a message in
    /// progress into it or a READ response stream out of it with a NAK the peer's requester
    /// accepts (it completes that WR with `REM_ACCESS_ERR`, or `REM_OP_ERR` for a SEND), and
    /// move the QP to the error state, which flushes every WR, the receive in progress
    /// included. Returns whether a NAK was queued for the peer (the driver sends it).
    pub fn access_violation(&mut self, names: &dyn Fn(u32) -> bool) -> bool {
        if matches!(self.state, QpState::Reset | QpState::Err) {
            return false;
        }
        let nak = self.recv.abort_for_region(names);
        self.state = QpState::Err;
        self.enter_error();
        nak
    }
}
