//! The RDMA connection manager's library interface (librdmacm's `rdma_*` calls) over
//! softrdma's connection manager (`softrdma::verbs::ConnectionManager`, the CM on each
//! device's QP1).
//!
//! `librdmacm.so.1` (`stubs/rdmacm.c`) is a thin C library with librdmacm's symbols and
//! version nodes; it forwards each call through the table [`ops::softrdma_rdmacm_ops`] to
//! the functions here, which live in `libibverbs.so.1` beside the verbs objects they use
//! (`cm_id->verbs` is one of this library's contexts, `cm_id->qp` one of its QPs).
//!
//! Objects: an event channel is a [`Channel`] (its fd an eventfd counting queued events); a
//! `rdma_cm_id` is the first field of an [`Id`]; an event the first field of an [`Event`]
//! (with room for its private data). One process-wide lock ([`Global`]) maps each device's
//! CM connections to their ids; the CM's hook runs with the CM's lock held and takes only
//! this lock, and nothing here calls into the CM while holding it.

pub mod abi;
pub mod addr;
mod id;
pub mod ops;

use core::ffi::c_int;
use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use softrdma::cm::{CmEvent, ConnId, PeerParams};
use softrdma::verbs::{ConnectionManager, HookVerdict};

use crate::abi::{ibv_ah_attr, ibv_context, ibv_pd};
use crate::device::Device;
use abi::*;
pub use id::Id;

/// An event channel: the C struct first.
#[repr(C)]
#[derive(Debug)]
pub struct Channel {
    ch: rdma_event_channel,
    queue: Mutex<VecDeque<usize>>,
}

impl Channel {
    fn new() -> Result<*mut Channel, c_int> {
        // SAFETY: eventfd with flags only; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(crate::errno::errno());
        }
        let c = Box::into_raw(Box::new(Channel {
            ch: rdma_event_channel { fd },
            queue: Mutex::new(VecDeque::new()),
        }));
        crate::registry::insert(c.cast_const(), crate::registry::Kind::CmChannel);
        Ok(c)
    }

    /// The channel behind a C pointer, if it is a live one of ours.
    ///
    /// # Safety
    /// Valid until `rdma_destroy_event_channel`, which the C API forbids to race with use.
    unsafe fn from_c<'a>(p: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: registered pointers are live Channels (C struct first).
        crate::registry::contains(p.cast_const(), crate::registry::Kind::CmChannel)
            .then(|| unsafe { &*p.cast::<Channel>() })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<usize>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue `ev` and make the fd readable.
    fn push(&self, ev: Box<Event>) {
        self.lock().push_back(Box::into_raw(ev) as usize);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a u64 to our eventfd.
        unsafe { libc::write(self.ch.fd, (&one as *const u64).cast(), 8) };
    }

    /// Take the next event, waiting for one unless the fd is non-blocking (then EAGAIN).
    ///
    /// A count read may belong to an event taken back since it was queued (`rdma_destroy_id`
    /// drops the queued events of the id it destroys, as the kernel's ucma does, and cannot
    /// take their counts back without racing a reader): with nothing queued, a blocking fd is
    /// read again, which waits for the next event, and a non-blocking one answers EAGAIN.
    fn pop(&self) -> Result<Box<Event>, c_int> {
        loop {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes into a u64 from our eventfd.
            let n = unsafe { libc::read(self.ch.fd, (&mut v as *mut u64).cast(), 8) };
            if n != 8 {
                // EINTR too (librdmacm's read gives it to a signal handler's caller).
                return Err(crate::errno::errno());
            }
            if let Some(p) = self.lock().pop_front() {
                // SAFETY: queued by `push` from Box::into_raw, taken once.
                return Ok(unsafe { Box::from_raw(p as *mut Event) });
            }
            // SAFETY: F_GETFL on our own eventfd.
            let flags = unsafe { libc::fcntl(self.ch.fd, libc::F_GETFL) };
            if flags < 0 || flags & libc::O_NONBLOCK != 0 {
                return Err(libc::EAGAIN);
            }
        }
    }
}

/// What to do with the QP when the application takes an event: bring it up with the peer's
/// REP (the active side's ESTABLISHED), as librdmacm does in `rdma_get_cm_event`.
#[derive(Debug)]
enum Apply {
    None,
    Rep(Box<PeerParams>),
}

/// An event: the C struct first, then the private data it points to.
#[repr(C)]
pub struct Event {
    ev: rdma_cm_event,
    private: [u8; 256],
    apply: Apply,
}

impl core::fmt::Debug for Event {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Event")
            .field("event", &self.ev.event)
            .field("status", &self.ev.status)
            .finish()
    }
}

impl Event {
    fn new(id: *mut rdma_cm_id, event: c_int, status: c_int) -> Box<Event> {
        Box::new(Event {
            ev: rdma_cm_event {
                id,
                listen_id: core::ptr::null_mut(),
                event,
                status,
                param: rdma_cm_event_param {
                    conn: rdma_conn_param {
                        private_data: core::ptr::null(),
                        private_data_len: 0,
                        responder_resources: 0,
                        initiator_depth: 0,
                        flow_control: 0,
                        retry_count: 0,
                        rnr_retry_count: 0,
                        srq: 0,
                        qp_num: 0,
                    },
                },
            },
            private: [0; 256],
            apply: Apply::None,
        })
    }

    /// Set the connection parameters, with `data` (up to 255 bytes) as private data.
    fn conn(&mut self, data: &[u8], p: Option<&PeerParams>) {
        let n = data.len().min(255);
        self.private[..n].copy_from_slice(&data[..n]);
        let mut c = rdma_conn_param {
            private_data: self.private.as_ptr().cast(),
            private_data_len: n as u8,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            srq: 0,
            qp_num: 0,
        };
        if let Some(p) = p {
            c.responder_resources = p.responder_resources;
            c.initiator_depth = p.initiator_depth;
            c.retry_count = p.retry_count;
            c.rnr_retry_count = p.rnr_retry_count;
            c.srq = u8::from(p.srq);
            c.qp_num = p.qpn;
        }
        self.ev.param.conn = c;
    }

    /// Set the UD parameters (the UDP port space), with `data` (up to 255 bytes) as private
    /// data.
    fn ud(&mut self, data: &[u8], ah_attr: Option<ibv_ah_attr>, qp_num: u32, qkey: u32) {
        let n = data.len().min(255);
        self.private[..n].copy_from_slice(&data[..n]);
        self.ev.param.ud = rdma_ud_param {
            private_data: self.private.as_ptr().cast(),
            private_data_len: n as u8,
            // SAFETY: all-zero is a valid ibv_ah_attr.
            ah_attr: ah_attr.unwrap_or(unsafe { core::mem::zeroed() }),
            qp_num,
            qkey,
        };
    }
}

/// The CM of one device, as this library uses it.
struct DevCm {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    cm: &'static ConnectionManager,
}

/// The process-wide state of the library.
#[derive(Default)]
struct Global {
    devs: HashMap<usize, DevCm>,
    /// Ids by (device index, connection).
    conns: HashMap<(usize, ConnId), usize>,
    /// Listening ids by (device index, service ID).
    listeners: HashMap<(usize, u64), usize>,
    /// Events that arrived before their connection was recorded.
    orphans: HashMap<(usize, ConnId), Vec<CmEvent>>,
    /// Connections of destroyed ids whose DREQ is still unanswered: the CM keeps resending
    /// it, their events are dropped.
    detached: std::collections::HashSet<(usize, ConnId)>,
    /// rdma_cm ports in use.
    ports: std::collections::HashSet<u16>,
    next_port: u16,
}

// SAFETY: the raw pointers are objects of this library, used only under the lock.
unsafe impl Send for Global {}

static G: LazyLock<Mutex<Global>> = LazyLock::new(Default::default);

fn global() -> MutexGuard<'static, Global> {
    G.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Global {
    /// A free rdma_cm port (ephemeral range), taken.
    fn take_port(&mut self, want: u16) -> Result<u16, c_int> {
        if want != 0 {
            return if self.ports.insert(want) {
                Ok(want)
            } else {
                Err(libc::EADDRINUSE)
            };
        }
        for _ in 0..30_000 {
            self.next_port = if self.next_port < 32_768 {
                32_768 + (std::process::id() as u16 % 1000)
            } else {
                self.next_port.wrapping_add(1).max(32_768)
            };
            if self.ports.insert(self.next_port) {
                return Ok(self.next_port);
            }
        }
        Err(libc::EADDRINUSE)
    }
}

/// The CM of `dev` (its context, default PD and connection manager), opened on first use.
fn dev_cm(
    g: &mut Global,
    dev: &'static Device,
) -> Result<(*mut ibv_context, *mut ibv_pd, &'static ConnectionManager), c_int> {
    if let Some(d) = g.devs.get(&dev.index) {
        return Ok((d.ctx, d.pd, d.cm));
    }
    let ctx = crate::open::open_context(dev)?;
    let opened = || {
        // SAFETY: a context of ours.
        let shared = unsafe { crate::context::shared_of(ctx) }?;
        let vdev = shared.verbs()?;
        ConnectionManager::open(vdev).map_err(|_| libc::EADDRINUSE)
    };
    let cm = match opened() {
        Ok(cm) => cm,
        Err(e) => {
            // The device did not open (its port taken, say): nothing of it stays behind.
            // SAFETY: the context opened above, used by nothing else yet.
            unsafe { crate::open::ibv_close_device(ctx) };
            return Err(e);
        }
    };
    let cm: &'static ConnectionManager = Box::leak(Box::new(cm));
    let index = dev.index;
    cm.set_hook(Some(Box::new(move |e| on_event(index, e))));
    // SAFETY: our context.
    let pd = unsafe { crate::mr::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    g.devs.insert(index, DevCm { ctx, pd, cm });
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registering a plain function with no arguments.
        unsafe { libc::atexit(linger_at_exit) };
    });
    Ok((ctx, pd, cm))
}

/// At process exit: a DREQ of a destroyed id still unanswered gets up to 2 s to be answered
/// (the peer waits for it; the kernel's CM would keep resending it after the process ends,
/// this one ends with the process). The CM's thread runs until the process is gone.
extern "C" fn linger_at_exit() {
    crate::errno::guard(
        || (),
        || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            while std::time::Instant::now() < deadline {
                let pending: Vec<_> = {
                    let g = global();
                    g.detached
                        .iter()
                        .filter_map(|&(d, c)| g.devs.get(&d).map(|dc| (dc.cm, c)))
                        .collect()
                };
                if !pending.iter().any(|(cm, c)| cm.raw().is_disconnecting(*c)) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        },
    )
}

/// An event of device `dev`'s CM (called with the CM's lock held: it takes only ours).
fn on_event(dev: usize, e: CmEvent) -> HookVerdict {
    let mut g = global();
    dispatch(&mut g, dev, e)
}

fn dispatch(g: &mut Global, dev: usize, e: CmEvent) -> HookVerdict {
    let conn = match &e {
        CmEvent::ConnectRequest { .. } | CmEvent::SidrRequest { .. } => {
            return id::on_request(g, dev, e);
        }
        e => e.conn(),
    };
    if g.detached.contains(&(dev, conn)) {
        if !matches!(
            e,
            CmEvent::Established { .. } | CmEvent::Disconnected { .. }
        ) {
            g.detached.remove(&(dev, conn));
        }
        return HookVerdict::Taken;
    }
    match g.conns.get(&(dev, conn)).copied() {
        Some(p) => id::on_conn_event(g, dev, p as *mut Id, e),
        None => g.orphans.entry((dev, conn)).or_default().push(e),
    }
    HookVerdict::Taken
}

/// Record that connection `conn` of device `dev` is id `p`; deliver what arrived before.
fn record_conn(dev: usize, conn: ConnId, p: *mut Id) {
    let mut g = global();
    g.conns.insert((dev, conn), p as usize);
    if let Some(evs) = g.orphans.remove(&(dev, conn)) {
        for e in evs {
            // Orphans are events of connections, never requests: nothing to refuse.
            let _ = dispatch(&mut g, dev, e);
        }
    }
}

/// `rdma_event_str`'s names, by event number.
pub const EVENT_NAMES: [&str; 16] = [
    "RDMA_CM_EVENT_ADDR_RESOLVED",
    "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST",
    "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",
    "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",
    "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",
    "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",
    "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Drop the channel's queued events for `id`, as `rdma_destroy_id` does (their counts
    /// stay on the eventfd).
    fn purge(c: &Channel, id: *mut rdma_cm_id) {
        c.lock().retain(|&e| {
            // SAFETY: queued events are Boxes of ours.
            let keep = unsafe { (*(e as *const Event)).ev.id } != id;
            if !keep {
                // SAFETY: taken out of the queue here, once.
                drop(unsafe { Box::from_raw(e as *mut Event) });
            }
            keep
        });
    }

    /// An event taken back leaves a count behind: a blocking reader waits on for the next
    /// event instead of answering EAGAIN (rping's client failed so at a disconnect under MAD
    /// loss), a non-blocking one answers EAGAIN.
    #[test]
    fn a_count_left_by_a_destroyed_ids_event_is_not_an_event() {
        let c = Channel::new().unwrap();
        // SAFETY: a live channel made just above, freed at the end of the test.
        let ch = unsafe { &*c };
        let gone = 0x10 as *mut rdma_cm_id;
        let kept = 0x20 as *mut rdma_cm_id;
        ch.push(Event::new(gone, event::DISCONNECTED, 0));
        purge(ch, gone);
        let late = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                ch.push(Event::new(0x20 as *mut rdma_cm_id, event::ESTABLISHED, 0));
            });
            ch.pop()
        });
        let ev = late.expect("the reader answered instead of waiting for the next event");
        assert_eq!(ev.ev.id, kept);
        // Non-blocking: a left count answers EAGAIN, and so does an empty channel.
        ch.push(Event::new(gone, event::DISCONNECTED, 0));
        purge(ch, gone);
        // SAFETY: F_SETFL on the channel's own eventfd.
        unsafe { libc::fcntl(ch.ch.fd, libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(ch.pop().err(), Some(libc::EAGAIN));
        assert_eq!(ch.pop().err(), Some(libc::EAGAIN));
        ch.push(Event::new(kept, event::ESTABLISHED, 0));
        assert_eq!(ch.pop().unwrap().ev.id, kept);
        crate::registry::remove(c.cast_const(), crate::registry::Kind::CmChannel);
        // SAFETY: made by Channel::new, no longer registered or used; its eventfd is closed.
        let c = unsafe { Box::from_raw(c) };
        // SAFETY: the channel's own eventfd.
        unsafe { libc::close(c.ch.fd) };
    }
}
