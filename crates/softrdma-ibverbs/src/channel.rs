//! Completion channels (`ibv_create_comp_channel`), `ibv_get_cq_event`, `ibv_ack_cq_events`.
//!
//! A channel is a `softrdma::verbs::CompChannel` of the context's engine: `ch->fd` is its
//! eventfd (readable while events are pending, so poll/epoll work), and an armed CQ created
//! with the channel fires it from the engine. The engine names the CQ that fired by its id;
//! [`CompChannel::attach`] records which `ibv_cq` that is.

use core::ffi::{c_int, c_void};
use core::ptr::addr_of_mut;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use softrdma::verbs;

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq};
use crate::context::{Shared, shared_of};
use crate::errno::{ffi_errno, ffi_minus1, ffi_ptr, guard};
use crate::events::count_events;
use crate::registry::{self, Kind};

/// A completion channel: the C struct first, then ours.
#[repr(C)]
pub struct CompChannel {
    /// What C sees.
    pub ch: ibv_comp_channel,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's channel.
    pub vch: verbs::CompChannel,
    /// CQs using this channel, by engine CQ id (a channel with CQs cannot be destroyed).
    cqs: Mutex<HashMap<u64, usize>>,
}

impl core::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.ch.fd)
            .finish()
    }
}

impl CompChannel {
    /// The channel behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_comp_channel(ch)`, which the C API forbids to race with use.
    pub unsafe fn from_ibv<'a>(ch: *mut ibv_comp_channel) -> Option<&'a CompChannel> {
        // SAFETY: registered channel pointers point to a live CompChannel (C struct first).
        registry::contains(ch, Kind::CompChannel).then(|| unsafe { &*ch.cast::<CompChannel>() })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.cqs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The CQ `cq` (engine id `id`) now reports to this channel.
    pub fn attach(&self, id: u64, cq: *mut ibv_cq) {
        self.map().insert(id, cq as usize);
    }

    /// The CQ with engine id `id` is being destroyed: its pending events are ignored.
    pub fn detach(&self, id: u64) {
        self.map().remove(&id);
    }

    /// Number of CQs using the channel.
    pub fn cq_count(&self) -> usize {
        self.map().len()
    }

    /// Wait for the next event of a live CQ (EAGAIN at once if the application made the fd
    /// non-blocking and none is pending).
    fn next_cq(&self) -> Result<*mut ibv_cq, c_int> {
        // SAFETY: F_GETFL on our own fd.
        let fl = unsafe { libc::fcntl(self.ch.fd, libc::F_GETFL) };
        let timeout = (fl >= 0 && fl & libc::O_NONBLOCK != 0).then_some(Duration::ZERO);
        loop {
            let id = self
                .vch
                .get_event(timeout)
                .map_err(|e| e.errno())?
                .ok_or(libc::EAGAIN)?;
            if let Some(cq) = self.map().get(&id) {
                return Ok(*cq as *mut ibv_cq);
            }
            // An event of a CQ destroyed meanwhile: skip it.
        }
    }
}

/// `ibv_create_comp_channel`: NULL with errno EINVAL (not an open context), EMFILE, ENOMEM,
/// or the errno of opening the device's engine.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        let vch = shared
            .verbs()?
            .create_comp_channel()
            .map_err(|e| e.errno())?;
        // The fd starts blocking, as libibverbs' does: `ibv_get_cq_event` waits unless the
        // application sets O_NONBLOCK (then EAGAIN when nothing is pending).
        // SAFETY: F_GETFL/F_SETFL on the channel's own fd.
        unsafe {
            let fl = libc::fcntl(vch.fd(), libc::F_GETFL);
            if fl >= 0 {
                libc::fcntl(vch.fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
            }
        }
        let ch = Box::new(CompChannel {
            ch: ibv_comp_channel {
                context,
                fd: vch.fd(),
                refcnt: 0,
            },
            shared,
            vch,
            cqs: Mutex::new(HashMap::new()),
        });
        let p = Box::into_raw(ch).cast::<ibv_comp_channel>();
        registry::insert(p, Kind::CompChannel);
        Ok(p)
    })
}

/// `ibv_destroy_comp_channel`: 0, EINVAL (not a channel), EBUSY (CQs still use it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    ffi_errno(|| {
        if !registry::remove(channel, Kind::CompChannel) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the registry let exactly this caller claim a live CompChannel.
        let ch = unsafe { &*channel.cast::<CompChannel>() };
        if ch.cq_count() > 0 {
            registry::insert(channel, Kind::CompChannel);
            return Err(libc::EBUSY);
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(channel.cast::<CompChannel>()) });
        Ok(())
    })
}

/// `ibv_get_cq_event`: wait for a completion event on `channel` (EAGAIN if the application
/// made the fd non-blocking and none is pending); `*cq` and `*cq_context` receive the CQ and
/// its context. 0, or -1 with errno.
///
/// # Safety
/// `cq` and `cq_context` are NULL or writable.
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi_minus1(|| {
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the C API forbids destroying the channel while a thread waits on it.
        let ch = unsafe { CompChannel::from_ibv(channel) }.ok_or(libc::EINVAL)?;
        let c = ch.next_cq()?;
        // SAFETY: attached CQs are live: a CQ's destroy detaches it first.
        let ctx = unsafe { (*c).cq_context };
        // SAFETY: both out-pointers are non-NULL and writable per the contract.
        unsafe {
            *cq = c;
            *cq_context = ctx;
        }
        Ok(())
    })
}

/// `ibv_ack_cq_events`: acknowledge `nevents` events of `cq` (its destroy waits for them).
/// A pointer that is not a live CQ is ignored.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    guard(
        || (),
        || {
            if registry::contains(cq, Kind::Cq) {
                // SAFETY: a live CQ of ours; its mutex and condvar are initialised.
                unsafe {
                    count_events(
                        addr_of_mut!((*cq).mutex),
                        addr_of_mut!((*cq).cond),
                        addr_of_mut!((*cq).comp_events_completed),
                        nevents,
                    )
                };
            }
        },
    )
}
