//! Memory windows (`ctx->ops.alloc_mw`, `bind_mw`, `dealloc_mw`), over `softrdma::verbs::Mw`.
//!
//! Type 1 windows are bound by `ibv_bind_mw`, which posts a bind work request (as rdma-core's
//! providers do: `mw->rkey` is updated before it returns, the bind executes in order with
//! the QP's other requests and completes like one). Type 2 windows are bound by an
//! `IBV_WR_BIND_MW` work request ([`crate::post`]).

use core::ffi::c_int;
use std::sync::Arc;

use softrdma::verbs;
use softrdma::verbs::{Access, MwType};

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

/// `ops.bind_mw` (`ibv_bind_mw`, type 1): a `BIND_MW` work request on `qp`, as rdma-core's
/// providers post it: `mw->rkey` gets the new key at once (drawn at random), the window
/// takes effect when the request executes, in order with the QP's other requests, and a
/// signaled bind (or any, with `sq_sig_all`) completes with `IBV_WC_BIND_MW` and
/// `bind->wr_id`; a bind the region refuses (rights, range, PD) completes with
/// `IBV_WC_MW_BIND_ERR`. A zero length unbinds (the region may then be NULL). 0 or errno
/// (EINVAL: bad QP, window or region, a type 2 window; or the errno of posting: ENOMEM
/// for a full send queue).
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
                let info = b.bind_info;
                // SAFETY: registry-checked.
                let m = unsafe { Mr::from_ibv(info.mr) };
                let vmr = match (m, info.length) {
                    (Some(m), _) => Some(m.vmr.as_ref().ok_or(libc::EINVAL)?),
                    (None, 0) => None,
                    (None, _) => return Err(libc::EINVAL),
                };
                let k = w.vmw.draw_type1_key().map_err(|e| e.errno())?;
                let bind = verbs::MwBind {
                    mw: &w.vmw,
                    new_rkey: k,
                    mr: vmr,
                    addr: info.addr,
                    length: info.length,
                    access: Access(info.mw_access_flags),
                };
                let flags = verbs::SendFlags(b.send_flags);
                (q.vqp.post_batch())
                    .bind_mw(b.wr_id, flags, &bind)
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
