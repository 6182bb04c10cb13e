//! Completion queues: `ibv_create_cq`/`ibv_destroy_cq` and the data-path `poll_cq` and
//! `req_notify_cq`, over `softrdma::verbs::Cq`.
//!
//! `poll_cq` translates the engine's completions to `struct ibv_wc`: `imm_data` is handed out
//! in network byte order (verbs.h declares it `__be32`: the bytes the sender put in its
//! `ibv_send_wr`), `wc_flags` carries `IBV_WC_WITH_IMM` / `IBV_WC_WITH_INV`, and
//! `invalidated_rkey` shares the `imm_data` slot as in verbs.h's union. A CQ that overflowed
//! reports `IBV_EVENT_CQ_ERR` once on the context's async fd.

use core::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use softrdma::verbs::{self, EMPTY_WC, WcStatus, WorkCompletion};

use crate::abi::*;
use crate::channel::CompChannel;
use crate::context::{Context, Shared};
use crate::errno::{ffi_errno, ffi_ptr, guard};
use crate::limits;
use crate::registry::{self, Kind};

/// `IBV_WC_GRH`: the receive buffer starts with the 40-byte GRH area (UD).
pub const IBV_WC_GRH: u32 = 1;
/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
/// `IBV_WC_WITH_INV`.
pub const IBV_WC_WITH_INV: u32 = 1 << 3;
/// `IBV_EVENT_CQ_ERR`.
pub const IBV_EVENT_CQ_ERR: c_int = 0;
/// `IBV_EVENT_QP_FATAL`.
pub const IBV_EVENT_QP_FATAL: c_int = 1;

/// A completion queue: the C struct first, then ours.
#[repr(C)]
pub struct Cq {
    /// What C sees.
    pub cq: ibv_cq,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's CQ.
    pub vcq: verbs::Cq,
    /// The channel it reports to (NULL: none).
    pub channel: *mut ibv_comp_channel,
    /// QPs using it (a CQ in use cannot be destroyed: EBUSY).
    pub users: AtomicU32,
    /// The overrun was reported as `IBV_EVENT_CQ_ERR`.
    overrun_reported: AtomicBool,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.vcq.id())
            .field("cqe", &self.cq.cqe)
            .finish()
    }
}

impl Cq {
    /// The CQ behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_cq(cq)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: registered CQ pointers point to a live Cq (C struct first).
        registry::contains(cq, Kind::Cq).then(|| unsafe { &*cq.cast::<Cq>() })
    }

    fn report_overrun(&self) {
        if self.vcq.overrun() && !self.overrun_reported.swap(true, Ordering::AcqRel) {
            self.shared.async_event(ibv_async_event {
                element: ibv_async_event_element {
                    cq: (&self.cq as *const ibv_cq).cast_mut(),
                },
                event_type: IBV_EVENT_CQ_ERR,
            });
        }
    }
}

/// `ibv_create_cq`: NULL with errno EINVAL (bad context or channel, `cqe` not in
/// 1..=max_cqe), or the errno of opening the engine.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let ctx = unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
        // One completion vector (`num_comp_vectors` is 1).
        if comp_vector != 0 {
            return Err(libc::EINVAL);
        }
        let ch = if channel.is_null() {
            None
        } else {
            // SAFETY: the C API forbids destroying the channel concurrently.
            let ch = unsafe { CompChannel::from_ibv(channel) }.ok_or(libc::EINVAL)?;
            if !Arc::ptr_eq(&ch.shared, &ctx.shared) {
                return Err(libc::EINVAL);
            }
            Some(ch)
        };
        if !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(libc::EINVAL);
        }
        let vcq = ctx
            .shared
            .verbs()?
            .create_cq(cqe as u32, ch.map(|c| &c.vch))
            .map_err(|e| e.errno())?;
        let id = vcq.id();
        let p = Box::into_raw(Box::new(Cq {
            cq: ibv_cq {
                context,
                channel,
                cq_context,
                handle: id as u32,
                cqe,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                comp_events_completed: 0,
                async_events_completed: 0,
            },
            shared: ctx.shared.clone(),
            vcq,
            channel,
            users: AtomicU32::new(0),
            overrun_reported: AtomicBool::new(false),
        }))
        .cast::<ibv_cq>();
        if let Some(ch) = ch {
            ch.attach(id, p);
        }
        registry::insert(p, Kind::Cq);
        Ok(p)
    })
}

/// `ibv_resize_cq`: EINVAL for anything but a live CQ or a size out of range; EOPNOTSUPP
/// otherwise (the engine's rings have a fixed size).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_errno(|| {
        if !registry::contains(cq, Kind::Cq) || !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}

/// `ibv_destroy_cq`: 0, EINVAL (not a live CQ), EBUSY (a QP still uses it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_errno(|| {
        if !registry::remove(cq, Kind::Cq) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Cq only this caller holds.
        let c = unsafe { &*cq.cast::<Cq>() };
        if c.users.load(Ordering::Acquire) > 0 {
            registry::insert(cq, Kind::Cq);
            return Err(libc::EBUSY);
        }
        if !c.channel.is_null() {
            // SAFETY: a channel with CQs cannot be destroyed, so it is live.
            unsafe { &*c.channel.cast::<CompChannel>() }.detach(c.vcq.id());
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        Ok(())
    })
}

/// One engine completion as `struct ibv_wc`.
pub fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: w.opcode as c_int,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        ..ibv_wc::default()
    };
    if let Some(imm) = w.imm_data {
        // The engine holds the value as read from the wire (big-endian); C wants the wire
        // bytes in memory.
        wc.imm_data = imm.to_be();
        wc.wc_flags |= IBV_WC_WITH_IMM;
    } else if let Some(rkey) = w.invalidated_rkey {
        wc.imm_data = rkey;
        wc.wc_flags |= IBV_WC_WITH_INV;
    }
    if w.grh {
        wc.wc_flags |= IBV_WC_GRH;
    }
    wc
}

/// `ops.poll_cq`: up to `num` completions into `wc`; their number, or -1 for a NULL CQ or
/// array or a negative count.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    guard(
        || -1,
        || {
            if cq.is_null() || num < 0 || (wc.is_null() && num > 0) {
                return -1;
            }
            // SAFETY: the data path trusts a non-NULL CQ to be one the application created
            // and has not destroyed (the C API's contract).
            let c = unsafe { &*cq.cast::<Cq>() };
            let mut buf = [EMPTY_WC; 32];
            let mut done = 0usize;
            let want = num as usize;
            while done < want {
                let k = c.vcq.poll(&mut buf[..(want - done).min(32)]);
                for w in &buf[..k] {
                    // SAFETY: `wc` has room for `num` entries per the C contract.
                    unsafe { wc.add(done).write(to_ibv_wc(w)) };
                    if w.status != WcStatus::Success && w.status != WcStatus::WrFlushErr {
                        crate::qp::report_fatal(&c.shared, w.qp_num);
                    }
                    done += 1;
                }
                if k < 32 {
                    break;
                }
            }
            c.report_overrun();
            if done == 0 {
                // Nothing yet: give the CPU to whoever is runnable here (the engine thread,
                // or a peer process on a small machine) instead of spinning through its
                // time slice.
                std::thread::yield_now();
            }
            done as c_int
        },
    )
}

/// `ops.req_notify_cq`: arm the CQ; 0, or EINVAL for NULL. With `solicited_only` the CQ fires
/// on the next receive whose message carried the solicited-event bit, or completion in error.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(
        || crate::errno::PANIC_ERRNO,
        || {
            if cq.is_null() {
                return libc::EINVAL;
            }
            // SAFETY: as in `poll_cq`.
            let c = unsafe { &*cq.cast::<Cq>() };
            c.vcq.req_notify(solicited_only != 0);
            0
        },
    )
}
