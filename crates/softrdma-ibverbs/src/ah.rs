//! Address handles. RC QPs take their path from `ibv_modify_qp`, so an AH only records and
//! checks its attributes (a GRH naming an IPv4-mapped or IPv6 GID, port 1): what
//! applications that create one for an RC connection need. UD, which would use it, is not
//! supported.

use core::ffi::{c_int, c_void};
use std::sync::Arc;

use crate::abi::*;
use crate::context::Shared;
use crate::errno::{ffi_errno, ffi_ptr};
use crate::mr::Pd;
use crate::registry::{self, Kind};

/// An address handle: the C struct first, then ours.
#[repr(C)]
pub struct Ah {
    /// What C sees.
    pub ah: ibv_ah,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// Its attributes.
    pub attr: ibv_ah_attr,
    /// The peer it names.
    pub peer: std::net::IpAddr,
}

impl core::fmt::Debug for Ah {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ah").field("peer", &self.peer).finish()
    }
}

static NEXT_AH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// `ibv_create_ah`: NULL with errno EINVAL (bad PD, NULL attributes, no GRH, a zero GID, a
/// port other than 1).
///
/// # Safety
/// `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        let peer = crate::qp::peer_of(&a)?;
        let h = Box::into_raw(Box::new(Ah {
            ah: ibv_ah {
                context: p.pd.context,
                pd,
                handle: NEXT_AH.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            },
            shared: p.shared.clone(),
            attr: a,
            peer,
        }))
        .cast::<ibv_ah>();
        p.hold();
        registry::insert(h, Kind::Ah);
        Ok(h)
    })
}

/// `ibv_destroy_ah`: 0 or EINVAL.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_errno(|| {
        if !registry::remove(ah, Kind::Ah) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Ah (from Box::into_raw) only we hold.
        let h = unsafe { Box::from_raw(ah.cast::<Ah>()) };
        // SAFETY: the PD cannot be deallocated while this AH counts against it.
        unsafe { (*h.ah.pd.cast::<Pd>()).release() };
        drop(h);
        Ok(())
    })
}

/// `ibv_create_ah_from_wc`: UD only; NULL with errno EINVAL (bad arguments) or EOPNOTSUPP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    _port_num: u8,
) -> *mut ibv_ah {
    ffi_ptr(|| {
        if !registry::contains(pd, Kind::Pd) || wc.is_null() || grh.is_null() {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}

/// `ibv_init_ah_from_wc`: UD only; EINVAL (bad arguments) or EOPNOTSUPP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    _port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi_errno(|| {
        if !registry::contains(context, Kind::Context)
            || wc.is_null()
            || grh.is_null()
            || ah_attr.is_null()
        {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}
