//! The per-device engine: drives the device core ([`Endpoint`]) with a port and a clock.
//!
//! The endpoint holds the QPs and does everything with packets but move them; the engine
//! owns the I/O and decides who does the work when:
//!
//! * **Send path** — in the posting thread: `post_send` locks the QP, posts, and the endpoint
//!   transmits what the transport produces straight from the QP's own
//!   [`TxBatch`] (packets built in place, coalesced into GSO datagrams), or,
//!   in busy-poll mode, leaves the post for the poster's next poll
//!   ([`Engine::post_done`]).
//! * **Receive path** — whoever holds the receive lock: the engine thread (blocking mode: it
//!   sleeps in `ppoll` on the socket and the next timer) or a CQ poller (busy-poll mode: every
//!   `poll_cq` also receives). Datagrams are taken only under that lock, so one QP's packets
//!   are handled in arrival order; the endpoint verifies, demultiplexes and checks each
//!   ([`Endpoint::handle_datagram`]).
//! * **Timers** — the engine thread wakes for the earliest QP deadline, or active pollers
//!   fire them.
//!
//! The code: this file holds the engine and its [`EndpointIo`]; `receive.rs` the progress
//! calls and the receive loop, `doorbell.rs` posts left for a poll, `run.rs` the engine
//! thread's loop, `thread.rs` the busy-poll hand-over.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::async_event::AsyncEvents;
use super::clock::Clock;
use super::counters::EngineCounters;
use super::endpoint::{Endpoint, EndpointIo, Gone, QpBody, QpCell, RxWork};
use super::port::Port;
use super::udp::{MAX_DATAGRAM, RxBatch, TxBatch, UdpPort};
use crate::mem::{Invalidation, MemoryTable};
use crate::params::{
    DOORBELL_GRACE, DOORBELL_MAX, DOORBELL_NAP_MAX, DOORBELL_RETRIES, ENGINE_RETRY, ENGINE_SPIN,
    ENGINE_SPIN_MAX, POLLER_ACTIVE, RX_BATCH, SPINNER_GRACE, SPINNER_SKIPS, SPINNER_TAKEOVERS,
    WAKER_DELAY, WAKER_PUSH,
};
use crate::rc::{ModifyError, PostError, QpAttr, QpAttrMask, RecvWr, SendWr};
use crate::wire::AddressVector;

mod doorbell;
mod receive;
mod run;
mod thread;

pub use thread::spawn;

/// How the engine waits for packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// The engine thread sleeps until a packet or a timer (low CPU, about one thread wake-up of
    /// added latency).
    Blocking,
    /// Polling a CQ receives and processes packets in the polling thread (low latency); the
    /// engine thread only runs timers and picks up packets nobody polled for.
    BusyPoll,
}

/// One device's datapath: its core, and the I/O and threads that drive it.
#[derive(Debug)]
pub struct Engine {
    ep: Endpoint,
    port: Port,
    rx: Mutex<RxState>,
    clock: Clock,
    mode: PollMode,
    stop: AtomicBool,
    /// When a CQ poller last drove progress (engine clock), for busy-poll mode.
    last_poll: AtomicU64,
    /// When an application thread last called a progress verb (polled a CQ), not counting
    /// posts (engine clock): an application that posts and then waits by spinning on memory
    /// (a WRITE landing) calls none.
    last_progress: AtomicU64,
    /// Wakes the engine thread: a timer that active pollers keep pushing into the future
    /// (busy-poll mode), so that it fires only once they have gone quiet; `stop` fires it
    /// at once.
    waker: OwnedFd,
    /// When pollers last pushed `waker` back (engine clock).
    waker_armed: AtomicU64,
    /// Busy-poll mode: completion channels whose descriptor also watches the socket
    /// ([`crate::net::cq::ChannelCore::watching`]), and whether they currently do: only while
    /// no application thread busy-polls (see `Engine::poller_active`).
    channels: Mutex<Vec<std::sync::Weak<crate::net::cq::ChannelCore>>>,
    channels_watch: AtomicBool,
    /// Wakes the engine thread at once (an eventfd): a poller is about to sleep until a
    /// completion event (busy-poll mode), so the thread takes the receive path now.
    kick: OwnedFd,
    /// When the engine thread, asleep, looks at the timers next (engine clock; 0 while it is
    /// awake or leaves the timers to pollers): a timer armed before then wakes it.
    timer_watch: AtomicU64,
    /// Posts were left for a poll ([`Engine::post_done`]) and the engine thread looks at them
    /// from time to time until the queue is empty: posters leaving more do not wake it.
    doorbell_watch: AtomicBool,
    /// Busy-poll mode: application threads waiting for a CQ event that watch the socket
    /// themselves ([`Engine::waiting_on_socket`]); meanwhile the engine thread leaves the
    /// socket to them.
    socket_waiters: AtomicU32,
    /// Busy-poll mode: active polls in a row that found datagrams more than SPINNER_GRACE
    /// after the application's previous poll, with no post in between (an application that
    /// polls only now and then, `Engine::note_find`); at RARE_POLLER_FINDS the engine thread is
    /// asked to watch the socket (`spinner_wanted`) as it does for a memory spinner.
    late_finds: AtomicU32,
    /// Polls that found nothing since the last of `late_finds` (many: a busy poller that was
    /// off its CPU for a while, not an application that polls now and then).
    empty_polls: AtomicU32,
    spinner_wanted: AtomicBool,
    /// A send was posted since the last active poll: the application is busy with the device
    /// (a long post of large messages is not a gap between polls).
    posted: AtomicBool,
    /// Busy-poll mode: when an active poll's receive last emptied the socket (engine clock;
    /// 0: no such receive since the application's last post, or its skips are used up), and
    /// how many empty polls skipped the socket since (`DRAIN_SKIP`, `Engine::skips_socket`).
    drained_at: AtomicU64,
    drain_skips: AtomicU32,
}

/// The receive lock's contents: the socket's batch and the endpoint's receive state.
struct RxState {
    batch: RxBatch,
    work: RxWork,
    /// The last receive ended with the socket empty (not at its round limit).
    drained: bool,
}

impl std::fmt::Debug for RxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxState").finish()
    }
}

impl Engine {
    /// An engine on a bound port, on the real clock.
    pub fn new(
        port: UdpPort,
        mem: Arc<MemoryTable>,
        mode: PollMode,
        gso: bool,
    ) -> io::Result<Engine> {
        port.set_nonblocking(true)?;
        Engine::with_port(Port::Udp(port), mem, (mode, gso), Clock::real())
    }

    /// An engine on any port (a memory network's, for deterministic tests), with its clock;
    /// `mode` and `gso` as for [`Engine::new`].
    pub fn with_port(
        port: Port,
        mem: Arc<MemoryTable>,
        (mode, gso): (PollMode, bool),
        clock: Clock,
    ) -> io::Result<Engine> {
        // SAFETY: timerfd_create takes two integers and returns a new descriptor or -1.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let waker = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let kick = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Engine {
            ep: Endpoint::new(port.local_addr(), mem, gso),
            port,
            rx: Mutex::new(RxState {
                batch: RxBatch::new(RX_BATCH, MAX_DATAGRAM),
                work: RxWork::default(),
                drained: false,
            }),
            clock,
            mode,
            stop: AtomicBool::new(false),
            last_poll: AtomicU64::new(0),
            last_progress: AtomicU64::new(0),
            waker,
            waker_armed: AtomicU64::new(0),
            channels: Mutex::new(Vec::new()),
            channels_watch: AtomicBool::new(true),
            kick,
            timer_watch: AtomicU64::new(0),
            doorbell_watch: AtomicBool::new(false),
            socket_waiters: AtomicU32::new(0),
            late_finds: AtomicU32::new(0),
            empty_polls: AtomicU32::new(0),
            spinner_wanted: AtomicBool::new(false),
            posted: AtomicBool::new(false),
            drained_at: AtomicU64::new(0),
            drain_skips: AtomicU32::new(0),
        })
    }

    /// Nanoseconds since the engine started: the transport's clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// The device core.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The local address.
    pub fn local_ip(&self) -> IpAddr {
        self.ep.local_ip()
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.port.local_addr()
    }

    /// The memory table.
    pub fn mem(&self) -> &Arc<MemoryTable> {
        self.ep.mem()
    }

    /// The poll mode.
    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// The device's counters.
    pub fn counters(&self) -> &EngineCounters {
        &self.ep.counters
    }

    /// The device's asynchronous events.
    pub fn events(&self) -> &AsyncEvents {
        &self.ep.events
    }

    /// See [`Endpoint::av_to`].
    pub fn av_to(&self, peer: IpAddr) -> AddressVector {
        self.ep.av_to(peer)
    }

    /// Register a QP for demultiplexing.
    pub fn add_qp(&self, cell: Arc<QpCell>) {
        self.ep.add_qp(cell);
    }

    /// Forget a QP.
    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpCell>> {
        let cell = self.ep.remove_qp(qpn);
        // Let go of the receive path's cached reference now if it is free (else the next
        // packet replaces it).
        if let Ok(mut rx) = self.rx.try_lock() {
            rx.work.forget_last_qp();
        }
        cell
    }

    /// QPs registered.
    pub fn qp_count(&self) -> usize {
        self.ep.qp_count()
    }

    /// True if a QP with this number exists.
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.ep.has_qp(qpn)
    }

    /// Modify a QP: [`Endpoint::modify_qp`]; the caller counts as an active poller.
    pub fn modify_qp(
        &self,
        cell: &Arc<QpCell>,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), ModifyError> {
        self.ep.modify_qp(cell, attr, mask, self)?;
        self.mark_active(self.now());
        Ok(())
    }

    /// Post one send work request: [`Endpoint::post_send`].
    pub fn post_send(&self, cell: &Arc<QpCell>, wr: &SendWr<'_>) -> Result<(), PostError> {
        let res = self.ep.post_send(cell, wr, self);
        self.note_post();
        res
    }

    /// A send was posted (see `posted`); a store only when the flag changes. The application
    /// answered what it drained: its next polls look at the socket again (`drained_at`).
    fn note_post(&self) {
        if !self.posted.load(Ordering::Relaxed) {
            self.posted.store(true, Ordering::Relaxed);
        }
        if self.drained_at.load(Ordering::Relaxed) != 0 {
            self.drained_at.store(0, Ordering::Relaxed);
        }
    }

    /// Post a list of send work requests: [`Endpoint::post_send_list`]; the caller counts as
    /// an active poller.
    pub fn post_send_list(
        &self,
        cell: &Arc<QpCell>,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let res = self.ep.post_send_list(cell, wrs, self);
        self.mark_active(self.now());
        self.note_post();
        res
    }

    /// Post a receive work request: [`Endpoint::post_recv`].
    pub fn post_recv(&self, cell: &Arc<QpCell>, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.ep.post_recv(cell, wr)
    }

    /// Take a QP out of the device: [`Endpoint::destroy_qp`].
    pub fn destroy_qp(&self, cell: &Arc<QpCell>) {
        self.ep.destroy_qp(cell, self);
        // Let go of the receive path's cached reference now if it is free (else the next
        // packet replaces it).
        if let Ok(mut rx) = self.rx.try_lock() {
            rx.work.forget_last_qp();
        }
    }

    /// Drive a (locked) QP after a post, packet or timeout: [`Endpoint::drive`].
    pub fn drive(&self, cell: &Arc<QpCell>, body: &mut QpBody, now: u64) {
        self.ep.drive(cell, body, now, self);
    }

    /// Move a QP's completions to its CQs: [`Endpoint::drain_completions`].
    pub fn drain_completions(&self, cell: &QpCell, body: &mut QpBody) {
        self.ep.drain_completions(cell, body);
    }

    /// Send the QP's held acknowledgements now: [`Endpoint::flush_held`].
    pub fn flush_held(&self, body: &mut QpBody) {
        self.ep.flush_held(body, self);
    }

    /// True when QPs wait in the pending-transmit queue.
    pub fn has_pending_transmit(&self) -> bool {
        self.ep.has_pending_transmit()
    }

    /// Serve the pending-transmit queue once round: [`Endpoint::serve_pending_transmit`].
    pub fn serve_pending_transmit(&self) -> usize {
        self.ep.serve_pending_transmit(self)
    }

    /// Fire due timers: [`Endpoint::run_timers`].
    pub fn run_timers(&self) -> Option<u64> {
        self.ep.run_timers(self)
    }

    /// Tear down the users of invalidated regions: [`Endpoint::tear_down_users`].
    pub fn tear_down_users(&self) -> usize {
        self.ep.tear_down_users(self)
    }

    /// Route the memory table's invalidations and access violations to this engine.
    pub fn watch_invalidations(self: &Arc<Self>) {
        let (a, b): (Weak<Engine>, Weak<Engine>) = (Arc::downgrade(self), Arc::downgrade(self));
        self.mem().set_device_notify(
            Some(Arc::new(move |inv: Invalidation| {
                if let Some(e) = a.upgrade() {
                    e.note_gone(Gone::Region(inv));
                }
            })),
            Some(Arc::new(move |qpn, key| {
                if let Some(e) = b.upgrade() {
                    e.note_gone(Gone::Access { qpn, key });
                }
            })),
        );
    }

    /// Queue `g` for the engine thread and wake it. Takes no QP lock (the caller may hold one).
    fn note_gone(&self, g: Gone) {
        self.ep.note_gone(g);
        self.kick_thread();
    }

    /// Note that an application thread is busy with the device (busy-poll mode: called after
    /// posts, which a poller makes between its polls).
    pub fn mark_active(&self, now: u64) {
        if self.mode == PollMode::BusyPoll {
            self.poller_active(now);
        }
    }

    /// The device's socket (readable when datagrams wait).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.port.raw_fd()
    }
}

/// The engine drives its endpoint: its clock, its port, and its thread to wake.
impl EndpointIo for Engine {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn send(&self, tx: &mut TxBatch) -> io::Result<()> {
        self.port.send(tx).map(drop)
    }

    fn wake(&self) {
        self.kick_thread();
    }

    fn deadline_lowered(&self, t: u64) {
        // The engine thread sleeps past it: wake it (once: a later, earlier deadline finds
        // the watch cleared or lowered by then).
        if t < self.timer_watch.load(Ordering::SeqCst) {
            self.timer_watch.store(0, Ordering::SeqCst);
            self.kick_thread();
        }
    }
}
