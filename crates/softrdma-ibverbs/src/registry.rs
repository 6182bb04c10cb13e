//! Live objects by address, so the control path never dereferences a pointer it did not hand
//! out (NULL, freed, or of another kind): such a pointer is answered with `EINVAL`.
//!
//! The data path (`ctx->ops`) does not consult it: the verbs there are called millions of times
//! per second and their callers already hold objects they created. The posts do (a stray QP
//! pointer there is common enough), through a per-thread memory of the objects it found live:
//! valid until any object is destroyed (`GENERATION`), so a post costs one atomic load instead
//! of the map's lock and hash (about 70-170 ns measured per post, besides its contention with
//! other threads).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Bumped (under `LIVE`'s lock) by every removal, before the object can be freed: a thread's
/// memory of live objects (`SEEN`) holds while it is unchanged.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// How many live objects a thread remembers.
const SEEN_MAX: usize = 4;

/// Objects a thread found live (address and kind), newest first.
type Seen = [Option<(usize, Kind)>; SEEN_MAX];

thread_local! {
    /// Objects this thread found live, and the generation they were found in.
    static SEEN: Cell<(u64, Seen)> = const { Cell::new((u64::MAX, [None; SEEN_MAX])) };
}

fn live() -> MutexGuard<'static, HashMap<usize, Kind>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Record `p` as a live object of `kind`.
pub fn insert<T>(p: *const T, kind: Kind) {
    live().insert(p as usize, kind);
}

/// True when `p` is a live object of `kind` (false for NULL).
pub fn contains<T>(p: *const T, kind: Kind) -> bool {
    if p.is_null() {
        return false;
    }
    let key = (p as usize, kind);
    let generation = GENERATION.load(Ordering::Acquire);
    let (seen_gen, mut seen) = SEEN.get();
    if seen_gen == generation && seen.contains(&Some(key)) {
        return true;
    }
    let g = live();
    // Read under the lock: a removal that bumped it after the load above is seen here.
    let generation = GENERATION.load(Ordering::Acquire);
    if g.get(&key.0) != Some(&kind) {
        return false;
    }
    drop(g);
    if seen_gen != generation {
        seen = [None; SEEN_MAX];
    }
    seen.rotate_right(1);
    seen[0] = Some(key);
    SEEN.set((generation, seen));
    true
}

/// Forget `p` if it is a live object of `kind`; true when it was. Exactly one of several
/// threads racing to destroy the same object wins.
pub fn remove<T>(p: *const T, kind: Kind) -> bool {
    let mut g = live();
    if g.get(&(p as usize)) == Some(&kind) {
        g.remove(&(p as usize));
        GENERATION.fetch_add(1, Ordering::Release);
        true
    } else {
        false
    }
}

/// Number of live objects of `kind` (for tests and leak checks).
pub fn count(kind: Kind) -> usize {
    live().values().filter(|k| **k == kind).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_object_is_forgotten_when_any_object_is_removed() {
        let a = Box::new(1u64);
        let b = Box::new(2u64);
        let (pa, pb) = (&*a as *const u64, &*b as *const u64);
        insert(pa, Kind::Qp);
        insert(pb, Kind::Srq);
        // Found live twice: the second answer comes from this thread's memory.
        assert!(contains(pa, Kind::Qp) && contains(pa, Kind::Qp));
        assert!(!contains(pa, Kind::Srq), "the kind is part of the answer");
        assert!(contains(pb, Kind::Srq));
        assert!(remove(pa, Kind::Qp));
        assert!(
            !contains(pa, Kind::Qp),
            "a destroyed QP is not live for its poster"
        );
        assert!(contains(pb, Kind::Srq));
        // Another thread's removal is seen too.
        let addr = pb as usize;
        std::thread::spawn(move || assert!(remove(addr as *const u64, Kind::Srq)))
            .join()
            .unwrap();
        assert!(!contains(pb, Kind::Srq));
        assert!(!contains(std::ptr::null::<u64>(), Kind::Qp));
    }
}
