//! Completion channels (`ibv_create_comp_channel`), `ibv_get_cq_event`, `ibv_ack_cq_events`.
//!
//! A channel is an [`EventQueue`] of CQ pointers; `ch->fd` is its eventfd. Phase 2: a CQ
//! created with this channel calls [`CompChannel::attach`] (and `detach` when destroyed), and
//! when an armed CQ gets a completion the engine calls [`CompChannel::notify`].

use core::ffi::{c_int, c_void};
use core::ptr::addr_of_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq};
use crate::context::{Shared, shared_of};
use crate::errno::{ffi_errno, ffi_minus1, ffi_ptr, guard};
use crate::events::{EventQueue, count_events};
use crate::registry::{self, Kind};

/// A completion channel: the C struct first, then ours.
#[repr(C)]
pub struct CompChannel {
    /// What C sees.
    pub ch: ibv_comp_channel,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// CQs whose completions were signalled and not yet taken by `ibv_get_cq_event`.
    pub events: EventQueue<*mut ibv_cq>,
    /// CQs using this channel (a channel with CQs cannot be destroyed: EBUSY).
    pub cqs: AtomicU32,
}

impl core::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.ch.fd)
            .field("events", &self.events)
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

    /// A CQ now reports to this channel.
    pub fn attach(&self) {
        self.cqs.fetch_add(1, Ordering::AcqRel);
    }

    /// A CQ no longer reports to this channel; its undelivered events are dropped.
    pub fn detach(&self, cq: *mut ibv_cq) {
        self.events.retain(|c| *c != cq);
        self.cqs.fetch_sub(1, Ordering::AcqRel);
    }

    /// An armed CQ of this channel got a completion: queue it for `ibv_get_cq_event`.
    pub fn notify(&self, cq: *mut ibv_cq) {
        self.events.push(cq);
    }
}

/// `ibv_create_comp_channel`: NULL with errno EINVAL (not an open context), EMFILE, ENOMEM.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        let events = EventQueue::new()?;
        let ch = Box::new(CompChannel {
            ch: ibv_comp_channel {
                context,
                fd: events.fd(),
                refcnt: 0,
            },
            shared,
            events,
            cqs: AtomicU32::new(0),
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
        if ch.cqs.load(Ordering::Acquire) > 0 {
            registry::insert(channel, Kind::CompChannel);
            return Err(libc::EBUSY);
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(channel.cast::<CompChannel>()) });
        Ok(())
    })
}

/// `ibv_get_cq_event`: wait for a completion event on `channel` (EAGAIN if the application
/// made the fd non-blocking and none is queued); `*cq` and `*cq_context` receive the CQ and
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
        let c = ch.events.wait()?;
        // SAFETY: queued CQs are live: a CQ's destroy drops its events first (`detach`).
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
