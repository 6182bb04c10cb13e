//! Opening and closing contexts (`ibv_open_device`, `ibv_close_device`).
//!
//! A context calls through functions of most modules of this library, which all build on
//! `crate::context`; so a context is assembled here, above them: the data-path table
//! `ctx->ops` ([`ops`]: `crate::cq`, `crate::mw`, `crate::post`), the `ibv_wr_*` operations of
//! its QPs (`crate::wr_ex`), the destination of the engine's asynchronous events
//! (`crate::qp::report_async`) and the extended slots of its `verbs_context`
//! (`crate::ext_ops::install`). The connection manager opens its contexts here too
//! ([`open_context`]).

use core::ffi::c_int;

use crate::abi::{ibv_context, ibv_context_ops, ibv_device};
use crate::context::{Context, Ops};
use crate::device::{Device, lookup};
use crate::errno::{ffi_minus1, ffi_ptr};
use crate::{cq, ext_ops, mw, post, qp, wr_ex};

/// The data-path operation table (`ctx->ops`).
pub fn ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_query_device: None,
        _compat_query_port: None,
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(mw::alloc_mw),
        bind_mw: Some(mw::bind_mw),
        dealloc_mw: Some(mw::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(cq::poll_cq),
        req_notify_cq: Some(cq::req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(post::post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(post::post_send),
        post_recv: Some(post::post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

/// A new context on `dev`, with every operation table filled (see the module documentation).
pub fn open_context(dev: &'static Device) -> Result<*mut ibv_context, c_int> {
    let ctx = Context::open(
        dev,
        Ops {
            verbs: ops(),
            qp_ex: wr_ex::qp_ex_ops(),
            async_event: qp::report_async,
        },
    )?;
    // SAFETY: just opened; its pointer has not reached C or another thread yet.
    unsafe { ext_ops::install(ctx) };
    Ok(ctx)
}

/// `ibv_open_device`: a new context, or NULL with errno (EINVAL: not our device; EMFILE/ENFILE:
/// no file descriptor for the async event fd; ENOMEM). The context is extended: verbs.h finds
/// the operations of [`crate::ext_ops`] in its `verbs_context`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    ffi_ptr(|| {
        let dev = lookup(device).ok_or(libc::EINVAL)?;
        open_context(dev)
    })
}

/// `ibv_close_device`: 0, or -1 with errno EINVAL for a context that is not open. Objects
/// still allocated on the context stay usable until they are destroyed (libibverbs leaves
/// them to the application too).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    ffi_minus1(|| Context::close(context))
}
