//! Shared receive queues.

use std::sync::{Arc, Mutex};

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
            core: Arc::new(SrqCore {
                srq: Mutex::new(srq),
            }),
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
}
