//! Live objects by address, so the control path never dereferences a pointer it did not hand
//! out (NULL, freed, or of another kind): such a pointer is answered with `EINVAL`.
//!
//! The data path (`ctx->ops`) does not consult it: the verbs there are called millions of times
//! per second and their callers already hold objects they created.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

/// What a registered address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An array returned by `ibv_get_device_list`.
    DeviceList,
    /// An `ibv_context` (inside a `crate::context::Context`).
    Context,
    /// An `ibv_pd`.
    Pd,
    /// An `ibv_mr`.
    Mr,
    /// An `ibv_mw`.
    Mw,
    /// An `ibv_comp_channel`.
    CompChannel,
    /// An `ibv_cq`.
    Cq,
    /// An `ibv_qp`.
    Qp,
    /// An `ibv_srq`.
    Srq,
    /// An `ibv_ah`.
    Ah,
    /// An `ibv_dm` (device memory).
    Dm,
    /// An `rdma_cm_id` (librdmacm).
    CmId,
    /// An `rdma_event_channel` (librdmacm).
    CmChannel,
}

static LIVE: LazyLock<Mutex<HashMap<usize, Kind>>> = LazyLock::new(Default::default);

fn live() -> MutexGuard<'static, HashMap<usize, Kind>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Record `p` as a live object of `kind`.
pub fn insert<T>(p: *const T, kind: Kind) {
    live().insert(p as usize, kind);
}

/// True when `p` is a live object of `kind` (false for NULL).
pub fn contains<T>(p: *const T, kind: Kind) -> bool {
    !p.is_null() && live().get(&(p as usize)) == Some(&kind)
}

/// Forget `p` if it is a live object of `kind`; true when it was. Exactly one of several
/// threads racing to destroy the same object wins.
pub fn remove<T>(p: *const T, kind: Kind) -> bool {
    let mut g = live();
    if g.get(&(p as usize)) == Some(&kind) {
        g.remove(&(p as usize));
        true
    } else {
        false
    }
}

/// Number of live objects of `kind` (for tests and leak checks).
pub fn count(kind: Kind) -> usize {
    live().values().filter(|k| **k == kind).count()
}
