//! Verbs that need the engine (CQ, QP, SRQ, AH, MW, posting and polling): phase 2 backs them
//! with `softrdma::verbs`. Until then they check their arguments like the real ones (a NULL
//! or foreign pointer is EINVAL, never a crash) and then report ENOSYS the documented way:
//! NULL with errno, or the errno value, or -1 for `poll_cq`.

use core::ffi::{c_int, c_void};

use crate::abi::*;
use crate::channel::CompChannel;
use crate::context::Context;
use crate::errno::{ffi_errno, ffi_ptr, guard, set_errno};
use crate::limits;
use crate::mr::Pd;
use crate::registry::{self, Kind};

/// Not implemented yet (phase 2).
const PENDING: c_int = libc::ENOSYS;

fn live<T>(p: *mut T, kind: Kind) -> Result<(), c_int> {
    if registry::contains(p, kind) {
        Ok(())
    } else {
        Err(libc::EINVAL)
    }
}

/// `ibv_create_cq`: EINVAL for a bad context, channel or size; ENOSYS (phase 2).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    _cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
        // SAFETY: the C API forbids destroying the channel concurrently.
        if !channel.is_null() && unsafe { CompChannel::from_ibv(channel) }.is_none() {
            return Err(libc::EINVAL);
        }
        if !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_resize_cq`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    ffi_errno(|| live(cq, Kind::Cq).and(Err(PENDING)))
}

/// `ibv_destroy_cq`: EINVAL for anything but a live CQ (phase 2: EBUSY while a QP uses it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_errno(|| live(cq, Kind::Cq).and(Err(PENDING)))
}

/// `ibv_create_qp`: EINVAL for a bad PD, NULL attributes or foreign CQs/SRQ; ENOSYS.
///
/// # Safety
/// `qp_init_attr` is NULL or readable.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if qp_init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { qp_init_attr.read() };
        live(a.send_cq, Kind::Cq)?;
        live(a.recv_cq, Kind::Cq)?;
        if !a.srq.is_null() {
            live(a.srq, Kind::Srq)?;
        }
        Err(PENDING)
    })
}

/// `ibv_modify_qp`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
) -> c_int {
    ffi_errno(|| {
        live(qp, Kind::Qp)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_query_qp`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_errno(|| {
        live(qp, Kind::Qp)?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_errno(|| live(qp, Kind::Qp).and(Err(PENDING)))
}

/// `ibv_qp_to_qp_ex` (IBVERBS_1.6): NULL (errno EINVAL for a foreign QP, else EOPNOTSUPP:
/// no QP is created with send-ops flags while extended verbs are off).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ffi_ptr(|| live(qp, Kind::Qp).and(Err(libc::EOPNOTSUPP)))
}

/// `ibv_create_srq`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_modify_srq`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    _attr: *mut ibv_srq_attr,
    _mask: c_int,
) -> c_int {
    ffi_errno(|| live(srq, Kind::Srq).and(Err(PENDING)))
}

/// `ibv_query_srq`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, _attr: *mut ibv_srq_attr) -> c_int {
    ffi_errno(|| live(srq, Kind::Srq).and(Err(PENDING)))
}

/// `ibv_destroy_srq`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_errno(|| live(srq, Kind::Srq).and(Err(PENDING)))
}

/// `ibv_create_ah`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_create_ah_from_wc`.
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
        // SAFETY: the C API forbids deallocating the PD concurrently.
        unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if wc.is_null() || grh.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_init_ah_from_wc`.
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
        live(context, Kind::Context)?;
        if wc.is_null() || grh.is_null() || ah_attr.is_null() {
            return Err(libc::EINVAL);
        }
        Err(PENDING)
    })
}

/// `ibv_destroy_ah`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_errno(|| live(ah, Kind::Ah).and(Err(PENDING)))
}

/// `ibv_attach_mcast`: multicast is not supported (EOPNOTSUPP; EINVAL for a foreign QP).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    ffi_errno(|| live(qp, Kind::Qp).and(Err(libc::EOPNOTSUPP)))
}

/// `ibv_detach_mcast`: as [`ibv_attach_mcast`].
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    ffi_errno(|| live(qp, Kind::Qp).and(Err(libc::EOPNOTSUPP)))
}

// ---- ctx->ops (data path) ----

fn fail_wr<W>(wr: *mut W, bad: *mut *mut W) -> c_int {
    if !bad.is_null() {
        // SAFETY: `bad` is non-NULL; the C API requires it to be writable.
        unsafe { *bad = wr };
    }
    PENDING
}

/// `ops.post_send`.
pub(crate) unsafe extern "C" fn post_send(
    _qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(|| PENDING, || fail_wr(wr, bad_wr))
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    _qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(|| PENDING, || fail_wr(wr, bad_wr))
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    _srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(|| PENDING, || fail_wr(wr, bad_wr))
}

/// `ops.poll_cq`: -1 (a negative value is the documented error).
pub(crate) unsafe extern "C" fn poll_cq(_cq: *mut ibv_cq, _num: c_int, _wc: *mut ibv_wc) -> c_int {
    -1
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(_cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    PENDING
}

/// `ops.alloc_mw`: NULL with errno.
pub(crate) unsafe extern "C" fn alloc_mw(_pd: *mut ibv_pd, _type: c_int) -> *mut ibv_mw {
    set_errno(PENDING);
    core::ptr::null_mut()
}

/// `ops.bind_mw`.
pub(crate) unsafe extern "C" fn bind_mw(
    _qp: *mut ibv_qp,
    _mw: *mut ibv_mw,
    _bind: *mut ibv_mw_bind,
) -> c_int {
    PENDING
}

/// `ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(_mw: *mut ibv_mw) -> c_int {
    PENDING
}
