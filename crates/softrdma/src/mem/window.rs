//! Memory windows: remote access to a sub-range of a region, with their own R_Key and rights.
//!
//! Type 1 windows are bound by the bind verb and usable by any QP of their PD; each bind gives
//! them a new random R_Key. Type 2 windows are bound by a work request on one QP and usable
//! only through it; the consumer picks the new R_Key's low 8 bits (`ibv_inc_rkey`); they are
//! unbound by a LOCAL_INV work request or an incoming SEND with Invalidate.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::region::{Mr, MrStatus, REMOTE, grants, offset_in, range_fits, validate_mw_access};
use super::{Access, AccessCtx, AccessError};

/// The type of a memory window (`IBV_MW_TYPE_1` / `IBV_MW_TYPE_2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MwType {
    /// Bound by the bind verb; PD-wide.
    Type1,
    /// Bound by a work request on one QP; usable only through that QP.
    Type2,
}

/// What a bound window grants.
pub(crate) struct Binding {
    pub(crate) parent: Arc<Mr>,
    pub(crate) parent_key: u32,
    /// First wire address of the window (0 when zero-based).
    pub(crate) start: u64,
    pub(crate) len: u64,
    /// The parent's wire address where the window begins.
    pub(crate) parent_iova: u64,
    pub(crate) access: Access,
    /// The QP a type 2 window is bound to.
    pub(crate) qpn: Option<u32>,
}

/// A memory window, stored in its key-table slot.
pub(crate) struct Mw {
    pub(crate) key: u32,
    pub(crate) pd: u32,
    pub(crate) ty: MwType,
    pub(crate) binding: Option<Binding>,
    /// Unbound by invalidation (as opposed to never bound).
    pub(crate) invalidated: bool,
    /// The region the window was bound to when it was invalidated: bytes lent through the
    /// window count in that region, and its invalidation waits for them
    /// ([`MemoryTable::wait_unlent`](super::MemoryTable::wait_unlent)).
    pub(crate) unbound_from: Option<std::sync::Weak<Mr>>,
}

impl Mw {
    /// Validate an access through this window and translate it to a host address.
    /// The caller holds the window's slot (read) so the binding cannot change meanwhile.
    #[inline]
    pub(crate) fn access<R>(
        &self,
        ctx: AccessCtx,
        iova: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(*mut u8, &super::region::MrState) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        let key = self.key;
        if self.pd != ctx.pd {
            return Err(AccessError::WrongPd(key));
        }
        let Some(b) = &self.binding else {
            return Err(if self.invalidated {
                AccessError::Invalidated(key)
            } else {
                AccessError::InvalidKey(key)
            });
        };
        if b.qpn.is_some_and(|q| q != ctx.qpn) {
            return Err(AccessError::WrongQp(key));
        }
        if need.0 & REMOTE == 0 {
            // A window key is an R_Key only: it cannot serve as an L_Key.
            return Err(AccessError::InvalidOperation(key));
        }
        if !grants(b.access, need) {
            return Err(AccessError::AccessDenied {
                key,
                needed: need.0 & super::region::RIGHTS,
            });
        }
        let off = offset_in(b.start, b.len, iova, len).ok_or(AccessError::OutOfBounds {
            key,
            iova,
            len,
        })?;
        let st = super::table::read(&b.parent.state);
        match st.status {
            MrStatus::Invalidated => Err(AccessError::Invalidated(key)),
            MrStatus::Suspended => Err(AccessError::Suspended(key)),
            MrStatus::Valid => f(st.host(b.parent_iova.wrapping_add(off)), &st),
        }
    }

    /// Drop the binding (unbind, invalidate, dealloc), releasing the parent.
    pub(crate) fn unbind(&mut self) {
        if let Some(b) = self.binding.take() {
            b.parent.windows.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What a window is bound to ([`bind`]): `[iova, iova+len)` of the region with key `mr_key`,
/// with `access`, for the window whose key is `mw_key`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Range {
    pub(crate) mr_key: u32,
    pub(crate) mw_key: u32,
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
}

/// Validate a bind of `r` (a range of `parent`) for a window of `pd` (bound to QP `qpn` for a
/// type 2 window), and build the binding. Increments the parent's window count on success.
/// The caller holds the parent's slot (read), so the parent cannot be deregistered meanwhile.
pub(crate) fn bind(
    parent: &Arc<Mr>,
    r: Range,
    pd: u32,
    qpn: Option<u32>,
) -> Result<Binding, AccessError> {
    let Range {
        mr_key,
        mw_key,
        iova,
        len,
        access,
    } = r;
    let Some(access) = validate_mw_access(access) else {
        return Err(AccessError::InvalidOperation(mw_key));
    };
    let st = super::table::read(&parent.state);
    if st.pd != pd {
        return Err(AccessError::WrongPd(mr_key));
    }
    match st.status {
        MrStatus::Valid => {}
        MrStatus::Invalidated => return Err(AccessError::Invalidated(mr_key)),
        MrStatus::Suspended => return Err(AccessError::Suspended(mr_key)),
    }
    if !st.access.contains(Access::MW_BIND) {
        return Err(AccessError::AccessDenied {
            key: mr_key,
            needed: Access::MW_BIND.0,
        });
    }
    if access.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0
        && !st.access.contains(Access::LOCAL_WRITE)
    {
        return Err(AccessError::AccessDenied {
            key: mr_key,
            needed: Access::LOCAL_WRITE.0,
        });
    }
    if !range_fits(iova, len) || offset_in(st.iova, st.backing.len() as u64, iova, len).is_none() {
        return Err(AccessError::OutOfBounds {
            key: mr_key,
            iova,
            len,
        });
    }
    // Held under the parent's state lock: a concurrent rereg sees the count.
    parent.windows.fetch_add(1, Ordering::AcqRel);
    Ok(Binding {
        parent: Arc::clone(parent),
        parent_key: mr_key,
        start: if access.contains(Access::ZERO_BASED) {
            0
        } else {
            iova
        },
        len,
        parent_iova: iova,
        access,
        qpn,
    })
}
