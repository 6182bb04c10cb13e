//! Memory regions: their state, the access-flag rules, and address translation.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32};

use super::pin::PinSpan;
use super::source::Backing;
use super::{Access, AccessCtx, AccessError, InvalidationCause, MemError, RemapPolicy};

/// The rights a lookup can require (everything else in a request is ignored).
pub(crate) const RIGHTS: u32 = Access::LOCAL_WRITE.0
    | Access::REMOTE_WRITE.0
    | Access::REMOTE_READ.0
    | Access::REMOTE_ATOMIC.0
    | Access::MW_BIND.0;
/// Remote rights.
pub(crate) const REMOTE: u32 =
    Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0;
/// Every non-optional flag libibverbs defines (`IBV_ACCESS_LOCAL_WRITE` .. `FLUSH_PERSISTENT`).
const KNOWN: u32 = 0x3ff;

/// Validate `ibv_reg_mr` access flags and return the ones kept (optional flags such as
/// `RELAXED_ORDERING` are accepted and dropped, as libibverbs allows).
pub(crate) fn validate_mr_access(a: Access) -> Result<Access, MemError> {
    let bad = |why| MemError::InvalidAccess { flags: a.0, why };
    if a.0 & !(KNOWN | Access::OPTIONAL_RANGE) != 0 {
        return Err(bad("unknown flag"));
    }
    let a = Access(a.0 & KNOWN);
    if a.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0
        && !a.contains(Access::LOCAL_WRITE)
    {
        return Err(bad("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE"));
    }
    Ok(a)
}

/// Validate the access flags of a window bind (`ibv_mw_bind_info.mw_access_flags`): remote
/// rights and zero-based addressing. LOCAL_WRITE (which rdma-core's own tests pass, and rxe
/// accepts) means nothing for a window and is ignored; any other flag is refused.
pub(crate) fn validate_mw_access(a: Access) -> Option<Access> {
    let allowed = REMOTE | Access::ZERO_BASED.0;
    let ignored = Access::LOCAL_WRITE.0 | Access::OPTIONAL_RANGE;
    if a.0 & !(allowed | ignored) != 0 {
        return None;
    }
    Some(Access(a.0 & allowed))
}

/// True when `have` grants every right of `need`.
#[inline]
pub(crate) fn grants(have: Access, need: Access) -> bool {
    have.0 & need.0 & RIGHTS == need.0 & RIGHTS
}

/// Offset of `[iova, iova+len)` inside `[start, start+size)`, or `None` when outside. Written
/// so that nothing can overflow, even with every argument near `u64::MAX`. A zero-length
/// access is inside when its address is within `[start, start+size]`.
#[inline]
pub(crate) fn offset_in(start: u64, size: u64, iova: u64, len: u64) -> Option<u64> {
    let off = iova.checked_sub(start)?;
    if off > size || len > size - off {
        return None;
    }
    Some(off)
}

/// Whether `[iova, iova+len)` fits below 2^64.
pub(crate) fn range_fits(iova: u64, len: u64) -> bool {
    len == 0 || iova.checked_add(len - 1).is_some()
}

/// Lifecycle of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrStatus {
    Valid,
    /// No new accesses until `resume` (the transport answers RNR NAK).
    Suspended,
    /// Invalidated (local invalidate); every access fails until re-registration.
    Invalidated,
}

/// The mutable part of a region.
pub(crate) struct MrState {
    pub(crate) pd: u32,
    pub(crate) access: Access,
    /// First wire address (0 for zero-based regions).
    pub(crate) iova: u64,
    pub(crate) backing: Backing,
    pub(crate) pin: Option<PinSpan>,
    pub(crate) status: MrStatus,
    /// Why the watcher invalidated the region (`None`: valid, or invalidated by a verb).
    pub(crate) cause: Option<InvalidationCause>,
    /// What an `mremap` of raw memory does to the region.
    pub(crate) remap: RemapPolicy,
}

/// A memory region.
///
/// Its state sits behind an `RwLock` whose **read** side is held for the whole of every
/// access (validation *and* copy): the lock's reader count is the region's in-flight counter.
/// `suspend`, `invalidate`, `rereg` and `deregister` take the write side, which returns only
/// when every access in flight has finished (the lock spins briefly, then parks on a futex),
/// and an access that starts afterwards sees the new status. No access is lost, none sees a
/// half-changed region, and the data path pays one uncontended atomic pair per access.
/// Bytes lent to the transmit path (zero-copy sends) outlive the read guard; `lent` counts
/// them, and those operations wait for it after releasing the write side (`lend.rs`).
pub(crate) struct Mr {
    pub(crate) state: RwLock<MrState>,
    /// Windows bound to this region (deregistration is refused while non-zero).
    pub(crate) windows: AtomicU32,
    /// An access faulted since the backing was set (reported once).
    pub(crate) faulted: AtomicBool,
    /// Bytes lent to the transmit path and not yet sent ([`super::lend`]).
    pub(crate) lent: AtomicU32,
}

impl MrState {
    /// Validate an access to `[iova, iova+len)` and translate it to a host address.
    /// Checks in order: PD, invalidation, rights, bounds, suspension, so a request that
    /// would fail anyway gets its real error rather than "retry later".
    #[inline]
    pub(crate) fn resolve(
        &self,
        key: u32,
        ctx: AccessCtx,
        iova: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, AccessError> {
        if self.pd != ctx.pd {
            return Err(AccessError::WrongPd(key));
        }
        if self.status == MrStatus::Invalidated {
            return Err(AccessError::Invalidated(key));
        }
        if !grants(self.access, need) {
            return Err(AccessError::AccessDenied {
                key,
                needed: need.0 & RIGHTS,
            });
        }
        let off = offset_in(self.iova, self.backing.len() as u64, iova, len)
            .ok_or(AccessError::OutOfBounds { key, iova, len })?;
        if self.status == MrStatus::Suspended {
            return Err(AccessError::Suspended(key));
        }
        Ok(self.backing.ptr().wrapping_add(off as usize))
    }

    /// Host address of wire address `iova` (already validated to be inside the region).
    pub(crate) fn host(&self, iova: u64) -> *mut u8 {
        self.backing
            .ptr()
            .wrapping_add(iova.wrapping_sub(self.iova) as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn access_rules() {
        let ok = |a: u32| validate_mr_access(Access(a)).is_ok();
        for a in 0..(1u32 << 10) {
            let needs_lw = a & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0;
            assert_eq!(
                ok(a),
                !needs_lw || a & Access::LOCAL_WRITE.0 != 0,
                "flags {a:#x}"
            );
        }
        assert!(ok(Access::RELAXED_ORDERING.0 | Access::REMOTE_READ.0));
        assert_eq!(
            validate_mr_access(Access(Access::RELAXED_ORDERING.0 | 1)).unwrap(),
            Access::LOCAL_WRITE
        );
        assert!(!ok(1 << 10));
        assert!(!ok(1 << 31));
    }

    #[test]
    fn bounds_edges() {
        let top = u64::MAX - 4095;
        assert_eq!(offset_in(top, 4096, top, 4096), Some(0));
        assert_eq!(offset_in(top, 4096, u64::MAX, 1), Some(4095));
        assert_eq!(offset_in(top, 4096, u64::MAX, 2), None);
        assert_eq!(offset_in(top, 4096, u64::MAX, u64::MAX), None);
        assert_eq!(offset_in(top, 4096, top - 1, 1), None);
        assert_eq!(offset_in(100, 0, 100, 0), Some(0));
        assert_eq!(offset_in(100, 0, 100, 1), None);
        assert_eq!(offset_in(100, 10, 110, 0), Some(10));
        assert_eq!(offset_in(100, 10, 111, 0), None);
        assert!(range_fits(top, 4096));
        assert!(!range_fits(top, 4097));
        assert!(range_fits(u64::MAX, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// `offset_in` agrees with 128-bit arithmetic everywhere, including near u64::MAX.
        #[test]
        fn bounds_match_wide_math(start in prop_oneof![any::<u64>(), (u64::MAX - 64)..=u64::MAX],
                                  size in prop_oneof![any::<u64>(), 0u64..64],
                                  iova in prop_oneof![any::<u64>(), (u64::MAX - 64)..=u64::MAX],
                                  len in prop_oneof![any::<u64>(), 0u64..64]) {
            let (s, z, i, l) = (start as u128, size as u128, iova as u128, len as u128);
            let inside = i >= s && i + l <= s + z;
            prop_assert_eq!(offset_in(start, size, iova, len).is_some(), inside);
            if inside { prop_assert_eq!(offset_in(start, size, iova, len), Some(iova - start)); }
        }

        /// `grants` is exactly "every required right is held", for every pair of flag sets.
        #[test]
        fn grants_is_subset(have in 0u32..32, need in 0u32..32) {
            prop_assert_eq!(grants(Access(have), Access(need)), have & need == need);
        }
    }
}
