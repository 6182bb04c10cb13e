//! Receive queues: the QP's own bounded receive queue and the shared receive queue ([`Srq`])
//! that several QPs' responders consume from.

use std::collections::VecDeque;

use super::PostError;
use super::wr::{RecvWr, SgList};

/// A posted receive.
#[derive(Clone, Copy, Debug)]
pub struct RecvWqe {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Where the payload goes.
    pub sges: SgList,
}

/// A bounded FIFO of receive WQEs (the storage of an RQ or an SRQ).
#[derive(Debug)]
pub struct RecvQueue {
    q: VecDeque<RecvWqe>,
    max_wr: usize,
    max_sge: usize,
}

impl RecvQueue {
    /// Room for `max_wr` WQEs of at most `max_sge` entries; allocates once.
    pub fn new(max_wr: usize, max_sge: usize) -> RecvQueue {
        RecvQueue {
            q: VecDeque::with_capacity(max_wr),
            max_wr,
            max_sge,
        }
    }
    /// Post a receive.
    pub fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if wr.sg_list.len() > self.max_sge {
            return Err(PostError::TooManySge(wr.sg_list.len()));
        }
        if self.q.len() >= self.max_wr {
            return Err(PostError::QueueFull);
        }
        let sges = SgList::from_slice(wr.sg_list).ok_or(PostError::TooManySge(wr.sg_list.len()))?;
        self.q.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges,
        });
        Ok(())
    }
    /// True when a posted WQE has an entry whose L_Key `names` picks.
    pub fn names_key(&self, names: &dyn Fn(u32) -> bool) -> bool {
        self.q.iter().any(|w| w.sges.names_key(names))
    }
    /// The oldest WQE, which the next message takes.
    pub fn front(&self) -> Option<&RecvWqe> {
        self.q.front()
    }
    /// Take the oldest WQE.
    pub fn pop(&mut self) -> Option<RecvWqe> {
        self.q.pop_front()
    }
    /// Give a WQE back to the head (its message could not start, or a UC message it had
    /// started was cut). It is never lost: the queue may hold more than `max_wr` for a while
    /// when posts filled it meanwhile (an SRQ, whose other QPs keep posting; a QP's own queue
    /// counts the receive in progress against its posts, see `Qp::post_recv`).
    pub fn unpop(&mut self, w: RecvWqe) {
        self.q.push_front(w);
    }
    /// Number of posted WQEs.
    pub fn len(&self) -> usize {
        self.q.len()
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
    /// Drop everything.
    pub fn clear(&mut self) {
        self.q.clear();
    }
}

/// A shared receive queue (`ibv_srq`). The caller owns it and lends it to the QPs created
/// with its id on each [`crate::rc::Qp::handle_packet`]; a QP ignores an SRQ with another id.
///
/// An armed limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`) fires once: when a receive taken
/// from the SRQ leaves fewer than `limit` posted, the limit disarms and
/// [`Srq::take_limit_event`] reports it (the SRQ limit event).
#[derive(Debug)]
pub struct Srq {
    id: u32,
    rq: RecvQueue,
    limit: usize,
    limit_reached: bool,
}

impl Srq {
    /// An SRQ with this id and room for `max_wr` WQEs of at most `max_sge` entries.
    pub fn new(id: u32, max_wr: usize, max_sge: usize) -> Srq {
        Srq {
            id,
            rq: RecvQueue::new(max_wr, max_sge.min(super::MAX_SGE)),
            limit: 0,
            limit_reached: false,
        }
    }
    /// The id QPs refer to.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// `ibv_post_srq_recv`.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.rq.post(wr)
    }
    /// Posted receives not yet consumed.
    pub fn len(&self) -> usize {
        self.rq.len()
    }
    /// The receive the next message of any of its QPs takes.
    pub fn front(&self) -> Option<&RecvWqe> {
        self.rq.front()
    }
    /// True when no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }
    /// Most WQEs it holds.
    pub fn max_wr(&self) -> usize {
        self.rq.max_wr
    }
    /// Arm the limit (0 disarms). The event fires when a receive taken later leaves fewer
    /// than `limit` posted, as in rxe; a limit above `max_wr` is refused (EINVAL).
    pub fn arm_limit(&mut self, limit: usize) -> Result<(), PostError> {
        if limit > self.rq.max_wr {
            return Err(PostError::InvalidArgument("SRQ limit above max_wr"));
        }
        self.limit = limit;
        Ok(())
    }
    /// The armed limit (0: none; it drops to 0 when the event fires).
    pub fn limit(&self) -> usize {
        self.limit
    }
    /// True once after the limit fired.
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_reached)
    }
    /// Take the oldest receive for a message (the responder), firing an armed limit.
    pub(crate) fn take(&mut self) -> Option<RecvWqe> {
        let w = self.rq.pop()?;
        if self.limit > 0 && self.rq.len() < self.limit {
            self.limit = 0;
            self.limit_reached = true;
        }
        Some(w)
    }
    /// Give a receive back to the head (its message could not start after all).
    pub(crate) fn give_back(&mut self, w: RecvWqe) {
        self.rq.unpop(w);
    }
}
