//! Event queues whose file descriptor works with poll/epoll/select (completion channels and
//! the async event fd), and the event acknowledgement counters of CQs, QPs and SRQs.
//!
//! Each queue is a FIFO beside an `eventfd` in semaphore mode: one `push` adds one to the
//! counter (the fd polls readable while it is positive); one `wait` reads one from it
//! (blocking, unless the application set `O_NONBLOCK` on the fd: then `EAGAIN`, as
//! libibverbs) and pops one event.

use core::ffi::c_int;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::abi::{ibv_async_event, ibv_cq, ibv_qp, ibv_srq};
use crate::registry::{self, Kind};

/// A FIFO of `T` with a pollable file descriptor.
pub struct EventQueue<T> {
    q: Mutex<VecDeque<T>>,
    fd: c_int,
}

// SAFETY: the queued values are plain C data (pointers are opaque handles the queue never
// dereferences), moved between threads under the mutex.
unsafe impl<T> Send for EventQueue<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for EventQueue<T> {}

impl<T> core::fmt::Debug for EventQueue<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EventQueue")
            .field("fd", &self.fd)
            .field("queued", &self.len())
            .finish()
    }
}

impl<T> EventQueue<T> {
    /// A new, empty queue (its fd is blocking and close-on-exec).
    pub fn new() -> Result<EventQueue<T>, c_int> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(crate::errno::errno());
        }
        Ok(EventQueue {
            q: Mutex::new(VecDeque::new()),
            fd,
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        self.q.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The file descriptor (readable while events are queued).
    pub fn fd(&self) -> c_int {
        self.fd
    }

    /// Queue one event and make the fd readable.
    pub fn push(&self, ev: T) {
        self.lock().push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It cannot fail short of
        // 2^64-1 queued events.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Wait for and take the oldest event.
    pub fn wait(&self) -> Result<T, c_int> {
        let mut v: u64 = 0;
        loop {
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
            let n = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
            if n == 8 {
                break;
            }
            let e = crate::errno::errno();
            if n < 0 && e == libc::EINTR {
                continue;
            }
            return Err(if n < 0 { e } else { libc::EIO });
        }
        self.lock().pop_front().ok_or(libc::EAGAIN)
    }

    /// Drop every queued event matching `f` (their counter units stay: `wait` then reports
    /// EAGAIN for them, which a caller polling the fd treats as spurious).
    pub fn retain(&self, f: impl FnMut(&T) -> bool) {
        self.lock().retain(f);
    }

    /// Number of queued events.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for EventQueue<T> {
    fn drop(&mut self) {
        // SAFETY: we own the fd and close it once.
        unsafe { libc::close(self.fd) };
    }
}

/// Add `n` to an event counter embedded in a C object and wake whoever waits on its
/// condition variable (a destroy waiting for every event to be acknowledged).
///
/// # Safety
/// The three pointers are fields of one live object whose mutex and condvar are initialised.
pub unsafe fn count_events(
    mutex: *mut libc::pthread_mutex_t,
    cond: *mut libc::pthread_cond_t,
    counter: *mut u32,
    n: u32,
) {
    // SAFETY: per the contract the mutex, condvar and counter are live and initialised; the
    // counter is only touched under the mutex.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        *counter = (*counter).wrapping_add(n);
        libc::pthread_cond_broadcast(cond);
        libc::pthread_mutex_unlock(mutex);
    }
}

/// Count an acknowledged async event on the CQ, QP or SRQ it names (if it still exists).
pub fn ack_async(ev: &ibv_async_event) {
    use core::ptr::addr_of_mut;
    match ev.event_type {
        // IBV_EVENT_CQ_ERR
        0 => {
            // SAFETY: every variant of the union is a plain pointer or int.
            let cq: *mut ibv_cq = unsafe { ev.element.cq };
            if registry::contains(cq, Kind::Cq) {
                // SAFETY: `cq` is a live CQ of ours, its mutex and condvar initialised.
                unsafe {
                    count_events(
                        addr_of_mut!((*cq).mutex),
                        addr_of_mut!((*cq).cond),
                        addr_of_mut!((*cq).async_events_completed),
                        1,
                    )
                };
            }
        }
        // QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, COMM_EST, SQ_DRAINED, PATH_MIG(_ERR),
        // QP_LAST_WQE_REACHED
        1..=7 | 16 => {
            // SAFETY: as above.
            let qp: *mut ibv_qp = unsafe { ev.element.qp };
            if registry::contains(qp, Kind::Qp) {
                // SAFETY: `qp` is a live QP of ours.
                unsafe {
                    count_events(
                        addr_of_mut!((*qp).mutex),
                        addr_of_mut!((*qp).cond),
                        addr_of_mut!((*qp).events_completed),
                        1,
                    )
                };
            }
        }
        // SRQ_ERR, SRQ_LIMIT_REACHED
        14 | 15 => {
            // SAFETY: as above.
            let srq: *mut ibv_srq = unsafe { ev.element.srq };
            if registry::contains(srq, Kind::Srq) {
                // SAFETY: `srq` is a live SRQ of ours.
                unsafe {
                    count_events(
                        addr_of_mut!((*srq).mutex),
                        addr_of_mut!((*srq).cond),
                        addr_of_mut!((*srq).events_completed),
                        1,
                    )
                };
            }
        }
        _ => {}
    }
}
