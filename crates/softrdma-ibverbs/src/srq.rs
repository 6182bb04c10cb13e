//! Shared receive queues, over `softrdma::verbs::Srq`.

use core::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma::verbs;

use crate::abi::*;
use crate::context::Shared;
use crate::errno::{ffi_errno, ffi_ptr};
use crate::limits;
use crate::mr::Pd;
use crate::registry::{self, Kind};

/// `IBV_SRQ_MAX_WR`.
pub const IBV_SRQ_MAX_WR: c_int = 1;
/// `IBV_SRQ_LIMIT`.
pub const IBV_SRQ_LIMIT: c_int = 2;
/// `IBV_EVENT_SRQ_LIMIT_REACHED`.
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;

/// A shared receive queue: the C struct first, then ours.
#[repr(C)]
pub struct Srq {
    /// What C sees.
    pub srq: ibv_srq,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's SRQ.
    pub vsrq: verbs::Srq,
    /// Its sizes (`srq_limit` is read from the engine's SRQ, where it is armed).
    attr: std::sync::Mutex<ibv_srq_attr>,
    /// QPs using it (a SRQ in use cannot be destroyed: EBUSY).
    pub users: AtomicU32,
}

impl core::fmt::Debug for Srq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Srq").field("id", &self.vsrq.id()).finish()
    }
}

impl Srq {
    /// The SRQ behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_srq(srq)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> Option<&'a Srq> {
        // SAFETY: registered SRQ pointers point to a live Srq (C struct first).
        registry::contains(srq, Kind::Srq).then(|| unsafe { &*srq.cast::<Srq>() })
    }

    fn attr(&self) -> std::sync::MutexGuard<'_, ibv_srq_attr> {
        self.attr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `ibv_create_srq`: NULL with errno EINVAL (bad PD, NULL attributes, `max_wr` or `max_sge`
/// out of range). `attr->attr` receives the sizes granted.
///
/// # Safety
/// `attr` is NULL or readable and writable.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        let (wr, sge) = (a.attr.max_wr, a.attr.max_sge.max(1));
        if wr == 0 || wr > limits::MAX_SRQ_WR as u32 || sge > limits::MAX_SRQ_SGE as u32 {
            return Err(libc::EINVAL);
        }
        let vsrq = p.vpd.create_srq(wr, sge).map_err(|e| e.errno())?;
        // As rxe: a limit given at creation is armed (above max_wr: EINVAL).
        vsrq.arm_limit(a.attr.srq_limit).map_err(|e| e.errno())?;
        let granted = ibv_srq_attr {
            max_wr: wr,
            max_sge: sge,
            srq_limit: a.attr.srq_limit,
        };
        let s = Box::into_raw(Box::new(Srq {
            srq: ibv_srq {
                context: p.pd.context,
                srq_context: a.srq_context,
                pd,
                handle: vsrq.id(),
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            shared: p.shared.clone(),
            vsrq,
            attr: std::sync::Mutex::new(granted),
            users: AtomicU32::new(0),
        }))
        .cast::<ibv_srq>();
        // The limit event goes to the context's async fd, naming this SRQ. The hook holds the
        // context weakly and is removed by `ibv_destroy_srq` before the SRQ is freed.
        // SAFETY: `s` was just allocated; nothing else has it yet.
        let me = unsafe { &*s.cast::<Srq>() };
        let (shared, ptr) = (Arc::downgrade(&me.shared), s as usize);
        me.vsrq.on_limit_reached(move |_| {
            if let Some(shared) = shared.upgrade() {
                shared.async_event(ibv_async_event {
                    element: ibv_async_event_element {
                        srq: ptr as *mut ibv_srq,
                    },
                    event_type: IBV_EVENT_SRQ_LIMIT_REACHED,
                });
            }
        });
        p.hold();
        // SAFETY: writable per the contract.
        unsafe { (*attr).attr = granted };
        registry::insert(s, Kind::Srq);
        Ok(s)
    })
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit (0 disarms; above `max_wr`: EINVAL): when
/// a message takes a receive that leaves fewer than `srq_limit` posted, the context's async fd
/// reports `IBV_EVENT_SRQ_LIMIT_REACHED` once and the limit disarms (as rxe). Resizing
/// (`IBV_SRQ_MAX_WR`) is EOPNOTSUPP.
///
/// # Safety
/// `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids destroying the SRQ concurrently.
        let s = unsafe { Srq::from_ibv(srq) }.ok_or(libc::EINVAL)?;
        if attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return Err(libc::EINVAL);
        }
        if mask & IBV_SRQ_MAX_WR != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        if mask & IBV_SRQ_LIMIT != 0 {
            s.vsrq.arm_limit(a.srq_limit).map_err(|e| e.errno())?;
        }
        Ok(())
    })
}

/// `ibv_query_srq`: 0 or EINVAL.
///
/// # Safety
/// `attr` is NULL or writable.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids destroying the SRQ concurrently.
        let s = unsafe { Srq::from_ibv(srq) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let mut a = *s.attr();
        a.srq_limit = s.vsrq.limit();
        // SAFETY: non-NULL and writable per the contract.
        unsafe { attr.write(a) };
        Ok(())
    })
}

/// `ibv_destroy_srq`: 0, EINVAL (not a live SRQ), EBUSY (a QP still uses it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_errno(|| {
        if !registry::remove(srq, Kind::Srq) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Srq only this caller holds.
        let s = unsafe { &*srq.cast::<Srq>() };
        if s.users.load(Ordering::Acquire) > 0 {
            registry::insert(srq, Kind::Srq);
            return Err(libc::EBUSY);
        }
        s.vsrq.clear_limit_hook();
        // SAFETY: the PD cannot be deallocated while this SRQ counts against it.
        unsafe { (*s.srq.pd.cast::<Pd>()).release() };
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
        Ok(())
    })
}
