//! A device's asynchronous events (`ibv_get_async_event`): what happened to a QP or a
//! region outside any work request. Delivered to a hook when one is installed (the C ABI's
//! async fd), otherwise queued, bounded, for [`AsyncEvents::wait`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use crate::mem::InvalidationCause;

/// An asynchronous event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A registered region became unusable: its memory was unmapped, moved or discarded
    /// behind its registration, or an access to it faulted (docs/COHERENCE.md). Every later
    /// access through its keys (and its windows' keys) fails; it stays registered until it
    /// is deregistered.
    RegionInvalidated {
        /// The region's key (L_Key = R_Key).
        lkey: u32,
        /// What happened.
        cause: InvalidationCause,
    },
    /// The QP was using a region when it was invalidated and is now in the error state, its
    /// work requests flushed (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// The QP's number.
        qp_num: u32,
        /// The invalidated region's key.
        lkey: u32,
    },
    /// A work request of the QP completed in error (other than flushed) and the QP is in the
    /// error state (`IBV_EVENT_QP_FATAL`): reported when the completion is polled, once per
    /// QP, and not for a QP whose `QpAccessError` came first.
    QpFatal {
        /// The QP's number.
        qp_num: u32,
    },
}

/// A callback that receives every event instead of the queue. It runs on the engine
/// thread, or for `QpFatal` on the thread that polled the completion, with no QP locked, and
/// must not block.
pub type AsyncEventHook = Arc<dyn Fn(AsyncEvent) + Send + Sync>;

/// Events queued at most (later ones are dropped and counted).
pub const ASYNC_EVENT_QUEUE: usize = 4096;

/// The queue of a device's asynchronous events.
#[derive(Default)]
pub struct AsyncEvents {
    q: Mutex<VecDeque<AsyncEvent>>,
    ready: Condvar,
    hook: RwLock<Option<AsyncEventHook>>,
    /// Events dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl std::fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("queued", &self.lock().len())
            .finish()
    }
}

impl AsyncEvents {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<AsyncEvent>> {
        self.q.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deliver `ev`: to the hook if one is installed, else to the queue.
    pub fn push(&self, ev: AsyncEvent) {
        let hook = self
            .hook
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(h) = hook {
            h(ev);
            return;
        }
        let mut q = self.lock();
        if q.len() >= ASYNC_EVENT_QUEUE {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(ev);
        drop(q);
        self.ready.notify_all();
    }

    /// Install (or remove) the hook. Events already queued stay queued.
    pub fn set_hook(&self, hook: Option<AsyncEventHook>) {
        *self.hook.write().unwrap_or_else(PoisonError::into_inner) = hook;
    }

    /// The oldest queued event, waiting up to `timeout` for one.
    pub fn wait(&self, timeout: Duration) -> Option<AsyncEvent> {
        let end = Instant::now() + timeout;
        let mut q = self.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                return Some(ev);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self
                .ready
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
