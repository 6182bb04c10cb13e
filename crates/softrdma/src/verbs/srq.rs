//! Shared receive queues.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Pd, RecvWr, VerbsError};
use crate::net::SrqCore;
use crate::rc;

/// A shared receive queue: several QPs of one PD take their receives from it.
#[derive(Clone, Debug)]
pub struct Srq {
    pub(crate) core: Arc<SrqCore>,
    id: u32,
    _pd: Pd,
}

static NEXT_SRQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

impl Srq {
    pub(crate) fn create(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Srq, VerbsError> {
        if max_wr == 0
            || max_wr > super::device::MAX_QP_WR
            || max_sge == 0
            || max_sge as usize > rc::MAX_SGE
        {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ max_wr {max_wr}, max_sge {max_sge}"
            )));
        }
        let id = NEXT_SRQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let srq = rc::Srq::new(id, max_wr as usize, max_sge as usize);
        Ok(Srq {
            core: Arc::new(SrqCore::new(srq)),
            id,
            _pd: pd.clone(),
        })
    }

    /// SRQ number.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Post a receive (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        self.core
            .srq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .post_recv(wr)?;
        Ok(())
    }

    /// Receives waiting.
    pub fn len(&self) -> usize {
        self.core
            .srq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// True when no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Arm the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms): once a receive
    /// taken from the SRQ leaves fewer than `limit` posted, the limit event fires (the hook set
    /// with [`Srq::on_limit_reached`] runs, [`Srq::limit_events`] counts it) and the limit
    /// disarms; arm it again after replenishing. A limit above the SRQ's `max_wr` is refused.
    pub fn arm_limit(&self, limit: u32) -> Result<(), VerbsError> {
        self.core
            .srq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .arm_limit(limit as usize)?;
        Ok(())
    }

    /// The armed limit (0: none armed, or it fired).
    pub fn limit(&self) -> u32 {
        self.core
            .srq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .limit() as u32
    }

    /// Run `hook` (with the SRQ's id) each time the limit event fires, replacing any earlier
    /// hook. It runs on the thread that received the message which emptied the SRQ below its
    /// limit (an engine thread or a polling application thread), with the receiving QP busy:
    /// it should only record or signal the event (post to a channel, write an eventfd) and
    /// leave replenishing to the application's own threads.
    pub fn on_limit_reached(&self, hook: impl Fn(u32) + Send + Sync + 'static) {
        *self
            .core
            .limit_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
    }

    /// Remove the limit hook.
    pub fn clear_limit_hook(&self) {
        *self
            .core
            .limit_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// How many times the limit event fired.
    pub fn limit_events(&self) -> u64 {
        self.core.limit_events.load(Ordering::Relaxed)
    }
}
