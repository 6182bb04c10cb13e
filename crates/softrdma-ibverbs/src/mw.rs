//! Memory windows (`ctx->ops.alloc_mw`, `bind_mw`, `dealloc_mw`), over `softrdma::verbs::Mw`.
//!
//! Type 1 windows are bound by `ibv_bind_mw`, which here binds at once and updates
//! `mw->rkey` before returning; it produces no work completion (a difference from hardware,
//! where the bind is a work request: see docs/IBVERBS.md). Type 2 windows are bound by an
//! `IBV_WR_BIND_MW` work request ([`crate::post`]).

use core::ffi::c_int;
use std::sync::Arc;

use softrdma::mem::{Access, MwType};
use softrdma::verbs;

use crate::abi::*;
use crate::context::Shared;
use crate::errno::{PANIC_ERRNO, guard, set_errno};
use crate::mr::{Mr, Pd};
use crate::qp::Qp;
use crate::registry::{self, Kind};

/// `IBV_MW_TYPE_1`.
pub const IBV_MW_TYPE_1: c_int = 1;
/// `IBV_MW_TYPE_2`.
pub const IBV_MW_TYPE_2: c_int = 2;

/// A memory window: the C struct first, then ours.
#[repr(C)]
pub struct Mw {
    /// What C sees.
    pub mw: ibv_mw,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's window.
    pub vmw: verbs::Mw,
}

impl core::fmt::Debug for Mw {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.mw.rkey).finish()
    }
}

impl Mw {
    /// The window behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_dealloc_mw(mw)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(mw: *mut ibv_mw) -> Option<&'a Mw> {
        // SAFETY: registered MW pointers point to a live Mw (C struct first).
        registry::contains(mw, Kind::Mw).then(|| unsafe { &*mw.cast::<Mw>() })
    }
}

fn alloc(pd: *mut ibv_pd, ty: c_int) -> Result<*mut ibv_mw, c_int> {
    // SAFETY: the C API forbids deallocating the PD concurrently.
    let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let t = match ty {
        IBV_MW_TYPE_1 => MwType::Type1,
        IBV_MW_TYPE_2 => MwType::Type2,
        _ => return Err(libc::EINVAL),
    };
    let vmw = p.vpd.alloc_mw(t).map_err(|e| e.errno())?;
    let rkey = vmw.rkey();
    let w = Box::into_raw(Box::new(Mw {
        mw: ibv_mw {
            context: p.pd.context,
            pd,
            rkey,
            handle: rkey,
            type_: ty,
        },
        shared: p.shared.clone(),
        vmw,
    }))
    .cast::<ibv_mw>();
    p.hold();
    registry::insert(w, Kind::Mw);
    Ok(w)
}

/// `ops.alloc_mw` (`ibv_alloc_mw`): NULL with errno EINVAL (bad PD or type), ENOMEM.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    crate::errno::ffi_ptr(|| alloc(pd, ty))
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`): 0 or EINVAL.
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    crate::errno::ffi_errno(|| {
        if !registry::remove(mw, Kind::Mw) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Mw (from Box::into_raw) only we hold.
        let w = unsafe { Box::from_raw(mw.cast::<Mw>()) };
        // SAFETY: the PD cannot be deallocated while this window counts against it.
        unsafe { (*w.mw.pd.cast::<Pd>()).release() };
        drop(w);
        Ok(())
    })
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1): 0 or errno (EINVAL: bad QP, window, region,
/// range or rights). A zero length unbinds. `mw->rkey` gets the new key.
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    guard(
        || {
            set_errno(PANIC_ERRNO);
            PANIC_ERRNO
        },
        || {
            let r = (|| {
                // SAFETY: registry-checked pointers; the C API forbids concurrent destroys.
                let (q, w) = unsafe { (Qp::from_ibv(qp), Mw::from_ibv(mw)) };
                let (q, w) = (q.ok_or(libc::EINVAL)?, w.ok_or(libc::EINVAL)?);
                if bind.is_null() || w.mw.type_ != IBV_MW_TYPE_1 {
                    return Err(libc::EINVAL);
                }
                // SAFETY: non-NULL and readable per the C contract.
                let b = unsafe { bind.read() };
                // SAFETY: registry-checked.
                let m = unsafe { Mr::from_ibv(b.bind_info.mr) }.ok_or(libc::EINVAL)?;
                let vmr = m.vmr.as_ref().ok_or(libc::EINVAL)?;
                let k = w
                    .vmw
                    .bind(
                        &q.vqp,
                        vmr,
                        b.bind_info.addr,
                        b.bind_info.length,
                        Access(b.bind_info.mw_access_flags),
                    )
                    .map_err(|e| e.errno())?;
                // SAFETY: the window is live; the application must not use it concurrently
                // with a bind.
                unsafe { (*mw).rkey = k };
                Ok(())
            })();
            match r {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    e
                }
            }
        },
    )
}
