//! The per-device engine: drives the sans-IO transport with a real socket and a real clock.
//!
//! * **Send path** — in the posting thread: `post_send` locks the QP, posts, and transmits
//!   what the transport produces straight from the QP's own [`TxBatch`] (packets built in
//!   place, coalesced into GSO datagrams).
//! * **Receive path** — whoever holds the receive lock: the engine thread (blocking mode: it
//!   sleeps in `ppoll` on the socket and the next timer) or a CQ poller (busy-poll mode: every
//!   `poll_cq` also receives). Datagrams are taken only under that lock, so one QP's packets
//!   are handled in arrival order. Each packet's ICRC is verified (see [`Engine::verify`]), the
//!   QP is found by destination QPN, the packet is accepted only from the address the QP is
//!   connected to (and, once latched, the peer's UDP source port: see
//!   [`QpBody::peer_src_port`]), and the QP's answers go out in one batch.
//! * **Timers** — the engine thread wakes for the earliest QP deadline.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use super::async_event::AsyncEvents;
use super::cq::CqCore;
use super::udp::{MAX_DATAGRAM, Received, RxBatch, TxBatch, UdpPort};
use crate::mem::MemoryTable;
use crate::rc::requester::LEND_MAX_PIECES;
use crate::rc::{Gather, Qp, Srq};
use crate::wire::{ICRC_LEN, IcrcContext, IcrcPrefix, IdDelta, IpHeader, Packet};

mod teardown;

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

/// Datapath counters, readable at run time like a NIC's.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Datagrams received.
    pub rx_datagrams: AtomicU64,
    /// RoCEv2 packets received (segments).
    pub rx_packets: AtomicU64,
    /// Packets dropped for a bad ICRC or malformed headers.
    pub rx_bad: AtomicU64,
    /// Packets whose ICRC matched only for an IPv4 identification found by solving (third-party
    /// senders whose identification is not known in advance).
    pub rx_icrc_solved: AtomicU64,
    /// Packets for an unknown QP.
    pub rx_unknown_qp: AtomicU64,
    /// Packets from an address other than the QP's peer: another IP, or another UDP source
    /// port than the one latched (see [`QpBody::peer_src_port`]).
    pub rx_wrong_peer: AtomicU64,
    /// Datagrams sent (a GSO datagram counts once).
    pub tx_datagrams: AtomicU64,
    /// Packets sent.
    pub tx_packets: AtomicU64,
    /// Send errors.
    pub tx_errors: AtomicU64,
    /// Packets sent zero-copy: their payload went from the region to the socket without
    /// passing through the transmit buffer.
    pub tx_zero_copy: AtomicU64,
    /// Times the engine thread woke up (a timer, a packet, or its waker).
    pub thread_wakeups: AtomicU64,
    /// Times the engine thread received for the device (always in blocking mode; in
    /// busy-poll mode only while no application thread polls).
    pub thread_receives: AtomicU64,
    /// Scans of the QPs' timers (each reads every QP's published deadline).
    pub timer_scans: AtomicU64,
    /// QPs ended by an access violation: moved to the error state because a region they used
    /// was invalidated, or because their own access met an invalidated key or vanished memory
    /// (one `AsyncEvent::QpAccessError` each).
    pub access_violations: AtomicU64,
}

/// A QP's mutable half.
#[derive(Debug)]
pub struct QpBody {
    /// The transport state machine.
    pub qp: Qp,
    /// Where its packets go (set from the address vector on INIT→RTR).
    pub peer: Option<SocketAddr>,
    /// The UDP source port the peer sends this QP's packets from, latched from the first
    /// packet from the peer's IP that the transport accepted as progress (an in-order request,
    /// or an acknowledgement or response for outstanding work: [`Qp::progress_mark`] moved);
    /// from then on packets from any other port are dropped (`rx_wrong_peer`). RoCEv2 leaves
    /// the source port to the sender: softrdma sends from its device's port, Linux rxe from a
    /// port of its own per QP, stable for the QP's life. Cleared when the address vector is
    /// set again.
    pub peer_src_port: Option<u16>,
    tx: TxBatch,
    /// Payload lent for the packet being built (moves into `tx`).
    gather: Gather,
    deltas: Vec<IdDelta>,
    held_ack: HeldAck,
    /// In the engine's pending-transmit queue: answers are left over from a drive that spent
    /// its budget (see [`RESPONSE_BUDGET`]).
    tx_queued: bool,
}

/// Answers (READ response packets, acknowledgements) a QP sends per drive at most: a READ
/// response stream of up to 2 GiB (16 of them outstanding) is sent a slice at a time, the
/// rest from the engine's pending-transmit queue, round-robin with the device's other QPs
/// and with receiving, so that no drive holds the receive path or a QP lock for long.
/// 64 packets are 256 KiB at a 4096-byte MTU, about 50-100 us of copying here.
pub const RESPONSE_BUDGET: usize = 64;

/// How long a held acknowledgement may wait for a newer one to replace it (busy-poll mode).
const ACK_DELAY: u64 = 15_000;

/// When a QP's transport began holding back a positive acknowledgement (busy-poll mode). The
/// acknowledgement itself stays queued in the transport, unbuilt: acknowledgements are
/// cumulative, so a newer one replaces it there, and it is built only when it is sent.
#[derive(Debug, Default)]
struct HeldAck {
    since: Option<u64>,
}

impl HeldAck {
    fn due(&self, now: u64) -> bool {
        self.since
            .is_some_and(|t| now.saturating_sub(t) >= ACK_DELAY)
    }

    /// When the held acknowledgement (if any) is due.
    fn due_at(&self) -> Option<u64> {
        self.since.map(|t| t.saturating_add(ACK_DELAY))
    }

    /// Note whether the transport holds one after a drive at `now`.
    fn note(&mut self, holds: bool, now: u64) {
        if !holds {
            self.since = None;
        } else if self.since.is_none() {
            self.since = Some(now);
        }
    }
}

/// Called when an SRQ's limit event fires, with the SRQ's id.
pub type SrqLimitHook = Arc<dyn Fn(u32) + Send + Sync>;

/// A shared receive queue with its lock.
pub struct SrqCore {
    /// The queue.
    pub srq: Mutex<Srq>,
    /// Told when the SRQ's limit event fires (see [`Srq::arm_limit`]).
    pub limit_hook: Mutex<Option<SrqLimitHook>>,
    /// Limit events fired.
    pub limit_events: AtomicU64,
}

impl std::fmt::Debug for SrqCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqCore")
            .field("srq", &self.srq)
            .field("limit_events", &self.limit_events)
            .finish_non_exhaustive()
    }
}

impl SrqCore {
    /// A core around `srq`, with no hook.
    pub fn new(srq: Srq) -> SrqCore {
        SrqCore {
            srq: Mutex::new(srq),
            limit_hook: Mutex::new(None),
            limit_events: AtomicU64::new(0),
        }
    }

    /// Report a fired limit: count it and call the hook (with no SRQ lock held).
    fn limit_reached(&self, id: u32) {
        self.limit_events.fetch_add(1, Ordering::Relaxed);
        let hook = self
            .limit_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(h) = hook {
            h(id);
        }
    }
}

/// A QP as the engine holds it.
#[derive(Debug)]
pub struct QpCell {
    /// QP number.
    pub qpn: u32,
    /// Protection domain.
    pub pd: u32,
    /// The transport state and transmit batch ([`QpCell::lock`]).
    body: Mutex<QpBody>,
    /// Send completions go here.
    pub send_cq: Arc<CqCore>,
    /// Receive completions go here.
    pub recv_cq: Arc<CqCore>,
    /// Receives come from here when set.
    pub srq: Option<Arc<SrqCore>>,
    /// The transport's next deadline (engine clock; `u64::MAX`: none), published whenever
    /// the body is unlocked, so that a timer scan reads it without taking the lock: with
    /// thousands of QPs, a scan touches one word of each that is not due.
    deadline: AtomicU64,
    /// `AsyncEvent::QpAccessError` was reported for it.
    violation_reported: AtomicBool,
}

/// A locked QP ([`QpCell::lock`]): its body; unlocking publishes the transport's next
/// deadline for the timer scan.
#[derive(Debug)]
pub struct QpGuard<'a> {
    body: MutexGuard<'a, QpBody>,
    deadline: &'a AtomicU64,
}

impl std::ops::Deref for QpGuard<'_> {
    type Target = QpBody;
    fn deref(&self) -> &QpBody {
        &self.body
    }
}

impl std::ops::DerefMut for QpGuard<'_> {
    fn deref_mut(&mut self) -> &mut QpBody {
        &mut self.body
    }
}

impl Drop for QpGuard<'_> {
    fn drop(&mut self) {
        // Usually published already by the drive that ended the work (which also lowers the
        // device's deadline): then this is one load, and the line stays clean.
        let t = self.body.qp.poll_timeout().unwrap_or(u64::MAX);
        if self.deadline.load(Ordering::Relaxed) != t {
            self.deadline.store(t, Ordering::SeqCst);
        }
    }
}

impl QpCell {
    /// Wrap a new transport QP.
    pub fn new(
        qp: Qp,
        pd: u32,
        send_cq: Arc<CqCore>,
        recv_cq: Arc<CqCore>,
        srq: Option<Arc<SrqCore>>,
    ) -> QpCell {
        let max = qp.max_packet_len();
        QpCell {
            qpn: qp.qp_num(),
            pd,
            body: Mutex::new(QpBody {
                qp,
                peer: None,
                peer_src_port: None,
                tx: qp_tx_batch(max),
                gather: Gather::with_capacity(LEND_MAX_PIECES),
                deltas: Vec::with_capacity(4),
                held_ack: HeldAck::default(),
                tx_queued: false,
            }),
            send_cq,
            recv_cq,
            srq,
            deadline: AtomicU64::new(u64::MAX),
            violation_reported: AtomicBool::new(false),
        }
    }

    /// Lock the mutable half (a poisoned lock is taken over: the state is still consistent
    /// because the transport never panics midway).
    pub fn lock(&self) -> QpGuard<'_> {
        QpGuard {
            body: self.body.lock().unwrap_or_else(|e| e.into_inner()),
            deadline: &self.deadline,
        }
    }

    /// [`QpCell::lock`] when nobody holds the lock.
    pub fn try_lock(&self) -> Option<QpGuard<'_>> {
        let body = match self.body.try_lock() {
            Ok(b) => b,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(QpGuard {
            body,
            deadline: &self.deadline,
        })
    }

    /// The transport's next deadline as last published (`u64::MAX`: none).
    fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }
}

struct RxState {
    batch: RxBatch,
    work: RxWork,
}

/// What the receive path keeps between packets.
struct RxWork {
    deltas: Vec<IdDelta>,
    /// The ICRC headers of the last sender seen (most datagrams come from the same peer).
    icrc: Option<(SocketAddr, IcrcPrefix)>,
    /// QPs holding an acknowledgement back (until the end of a receive batch; in busy-poll
    /// mode up to ACK_DELAY).
    pending: Vec<Arc<QpCell>>,
    /// No acknowledgement of `pending` is due before this (engine clock), so a poll that
    /// finds nothing need not look at them.
    pending_due: u64,
    /// The QP the last packet was for, with the QP table's generation when it was looked
    /// up (valid while the table has not changed since).
    last_qp: Option<(u64, Arc<QpCell>)>,
}

/// One device's datapath.
#[derive(Debug)]
pub struct Engine {
    port: UdpPort,
    local_ip: IpAddr,
    mem: Arc<MemoryTable>,
    qps: RwLock<HashMap<u32, Arc<QpCell>>>,
    /// Bumped on every change of `qps` (invalidates the receive path's cached QP).
    qp_gen: AtomicU64,
    rx: Mutex<RxState>,
    epoch: Instant,
    mode: PollMode,
    gso: bool,
    stop: AtomicBool,
    /// When a CQ poller last drove progress (engine clock), for busy-poll mode.
    last_poll: AtomicU64,
    /// Wakes the engine thread: a timer that active pollers keep pushing into the future
    /// (busy-poll mode), so that it fires only once they have gone quiet; `stop` fires it
    /// at once.
    waker: OwnedFd,
    /// When pollers last pushed `waker` back (engine clock).
    waker_armed: AtomicU64,
    /// Wakes the engine thread at once (an eventfd): a poller is about to sleep until a
    /// completion event (busy-poll mode), so the thread takes the receive path now.
    kick: OwnedFd,
    /// When pollers next look at the transport timers (ns on the engine clock): the earliest
    /// deadline, or a rescan interval when none is pending.
    next_timer: AtomicU64,
    /// When the engine thread, asleep, looks at the timers next (engine clock; 0 while it is
    /// awake or leaves the timers to pollers): a timer armed before then wakes it.
    timer_watch: AtomicU64,
    /// QPs with answers left over from a drive that spent its budget, served a budget at a
    /// time, round-robin, by whoever drives the device (the engine thread, or pollers in
    /// busy-poll mode).
    tx_pending: Mutex<VecDeque<Arc<QpCell>>>,
    /// `tx_pending`'s length (read without the lock).
    tx_pending_len: AtomicUsize,
    /// Regions invalidated, waiting for the engine thread to tear down their users.
    invalidated: Mutex<Vec<teardown::Gone>>,
    invalidations_pending: AtomicBool,
    /// Asynchronous events for the application.
    pub events: AsyncEvents,
    /// Counters.
    pub counters: EngineCounters,
}

impl std::fmt::Debug for RxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxState").finish()
    }
}

const RX_BATCH: usize = 32;

/// In busy-poll mode, pollers count as active for this long (ns) after their last progress
/// call or post; meanwhile the engine thread only runs timers. It is longer than a long post
/// list takes to transmit (1 MiB is about half a millisecond of copying), so that the engine
/// thread does not take over the receive path between a busy thread's posts and polls.
const POLLER_ACTIVE: u64 = 1_000_000;

/// How often active pollers push the engine thread's wake-up back (ns).
const WAKER_PUSH: u64 = 1_000_000;

/// How far ahead pollers set the engine thread's wake-up (ns): it fires WAKER_DELAY -
/// WAKER_PUSH to WAKER_DELAY after they went quiet, and then the thread takes over (an
/// application that polls in busy-poll mode less often than that leaves incoming requests to
/// its polls meanwhile: blocking mode suits it better). It lies beyond the scheduler tick on
/// purpose: a timer that becomes a CPU's earliest makes the kernel reprogram the CPU's timer
/// device, which in a virtual machine is an exit to the hypervisor (here 18 us per
/// `timerfd_settime` at 1.5 ms, 0.7-0.8 us at 5 ms or more), and a poller would pay it every
/// push.
const WAKER_DELAY: u64 = 5_000_000;

/// How soon the engine thread tries again when pollers had gone quiet but one still held the
/// receive path (inside a long receive).
const ENGINE_RETRY: u64 = 2_000_000;

/// After a scan of the QPs' timers, the next waits at least this long per QP of the device
/// (ns).
const TIMER_SLACK_PER_QP: u64 = 50;

/// With no timer pending, the QPs' timers are looked at again after this long: a safety net
/// only, since arming a timer lowers the device's next deadline (and wakes the engine thread
/// when it sleeps past it).
const TIMER_SCAN: u64 = 50_000_000;

impl Engine {
    /// An engine on a bound port.
    pub fn new(
        port: UdpPort,
        mem: Arc<MemoryTable>,
        mode: PollMode,
        gso: bool,
    ) -> io::Result<Engine> {
        port.set_nonblocking(true)?;
        let local_ip = port.local_addr().ip();
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
            port,
            local_ip,
            mem,
            qps: RwLock::new(HashMap::new()),
            rx: Mutex::new(RxState {
                batch: RxBatch::new(RX_BATCH, MAX_DATAGRAM),
                work: RxWork {
                    deltas: Vec::new(),
                    icrc: None,
                    pending: Vec::with_capacity(64),
                    pending_due: u64::MAX,
                    last_qp: None,
                },
            }),
            qp_gen: AtomicU64::new(0),
            epoch: Instant::now(),
            mode,
            gso,
            stop: AtomicBool::new(false),
            last_poll: AtomicU64::new(0),
            waker,
            waker_armed: AtomicU64::new(0),
            kick,
            next_timer: AtomicU64::new(0),
            timer_watch: AtomicU64::new(0),
            tx_pending: Mutex::new(VecDeque::new()),
            tx_pending_len: AtomicUsize::new(0),
            invalidated: Mutex::new(Vec::new()),
            invalidations_pending: AtomicBool::new(false),
            events: AsyncEvents::default(),
            counters: EngineCounters::default(),
        })
    }

    /// Nanoseconds since the engine started: the transport's clock.
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The local address.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.port.local_addr()
    }

    /// The memory table.
    pub fn mem(&self) -> &Arc<MemoryTable> {
        &self.mem
    }

    /// The poll mode.
    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// The IP/UDP context for packets from this device to `peer` from UDP port `src_port`.
    pub fn path_to(&self, peer: IpAddr, src_port: u16) -> IcrcContext {
        match (self.local_ip, peer) {
            (IpAddr::V4(l), IpAddr::V4(p)) => IcrcContext::v4(l, p, src_port),
            (IpAddr::V6(l), IpAddr::V6(p)) => IcrcContext::v6(l, p, src_port),
            (IpAddr::V6(l), IpAddr::V4(p)) => IcrcContext::v6(l, p.to_ipv6_mapped(), src_port),
            (IpAddr::V4(l), IpAddr::V6(p)) => match p.to_ipv4_mapped() {
                Some(p4) => IcrcContext::v4(l, p4, src_port),
                None => IcrcContext::v6(l.to_ipv6_mapped(), p, src_port),
            },
        }
    }

    /// Register a QP for demultiplexing.
    pub fn add_qp(&self, cell: Arc<QpCell>) {
        cell.lock().tx.set_gso(self.gso);
        let mut qps = self.qps.write().unwrap_or_else(|e| e.into_inner());
        qps.insert(cell.qpn, cell);
        self.qp_gen.fetch_add(1, Ordering::Release);
    }

    /// Forget a QP.
    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpCell>> {
        let mut qps = self.qps.write().unwrap_or_else(|e| e.into_inner());
        let cell = qps.remove(&qpn);
        self.qp_gen.fetch_add(1, Ordering::Release);
        drop(qps);
        // Let go of the receive path's cached reference now if it is free (else the next
        // packet replaces it).
        if let Ok(mut rx) = self.rx.try_lock() {
            rx.work.last_qp = None;
        }
        cell
    }

    /// QPs registered.
    pub fn qp_count(&self) -> usize {
        self.qps.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True if a QP with this number exists.
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&qpn)
    }

    /// Note that an application thread is busy with the device (busy-poll mode: called after
    /// posts, which a poller makes between its polls).
    pub fn mark_active(&self, now: u64) {
        if self.mode == PollMode::BusyPoll {
            self.poller_active(now);
        }
    }

    /// A poller is active at `now`: the engine thread stays off the receive path, and asleep
    /// (its wake-up is pushed back every WAKER_PUSH, so that it fires only after pollers have
    /// been quiet for a few milliseconds).
    fn poller_active(&self, now: u64) {
        self.last_poll.store(now, Ordering::Relaxed);
        if self.mode == PollMode::BusyPoll
            && now.saturating_sub(self.waker_armed.load(Ordering::Relaxed)) >= WAKER_PUSH
        {
            self.waker_armed.store(now, Ordering::Relaxed);
            self.wake_in(WAKER_DELAY);
        }
    }

    /// The device's socket (readable when datagrams wait).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.port.raw_fd()
    }

    /// An application thread is about to sleep until a completion event (it armed a CQ):
    /// in busy-poll mode nobody would receive meanwhile until the engine thread's wake-up
    /// fires (milliseconds), so pollers count as quiet from now and the thread is woken to
    /// take the receive path at once. A poll after this (of a CQ that is not armed) makes the
    /// poller active again.
    pub fn poller_sleeping(&self) {
        if self.mode != PollMode::BusyPoll {
            return;
        }
        self.last_poll.store(0, Ordering::Relaxed);
        // The next active poll pushes the wake-up back at once.
        self.waker_armed.store(0, Ordering::Relaxed);
        self.kick_thread();
    }

    /// (Re)arm the engine thread's wake-up to fire `ns` from now.
    fn wake_in(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (ns % 1_000_000_000).max(1) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec and the old value is not asked for.
        let _ = unsafe {
            libc::timerfd_settime(self.waker.as_raw_fd(), 0, &spec, std::ptr::null_mut())
        };
    }

    /// Transmit whatever `cell`'s transport has ready (answers up to [`RESPONSE_BUDGET`], the
    /// rest later from the pending-transmit queue) and move its completions to the CQs.
    /// Called with the QP locked, after every post, packet and timeout.
    pub fn drive(&self, cell: &Arc<QpCell>, body: &mut QpBody, now: u64) {
        self.drive_inner(cell, body, now, false);
    }

    /// [`Engine::drive`]; with `defer_acks`, plain acknowledgements are held back (the
    /// newest replacing older ones) to go out after ACK_DELAY, which keeps an
    /// acknowledgement's system call off a busy poller's critical path. Returns when the
    /// held acknowledgement, if any, is due.
    fn drive_inner(
        &self,
        cell: &Arc<QpCell>,
        body: &mut QpBody,
        now: u64,
        defer_acks: bool,
    ) -> Option<u64> {
        if let Some(dst) = body.peer {
            // A held acknowledgement stays held through this drive's requests, and so does a
            // new one in busy-poll mode.
            let hold = defer_acks || body.held_ack.since.is_some();
            let sent = self.build(body, dst, now, hold);
            // Requests and answers go first. Outside packet handling (a post, a timer), a
            // held ACK goes out behind them, as a datagram of its own in the same system
            // call: the peer may be waiting for it (a signaled send completes only with it),
            // and the request it follows is already on its way. Never from packet handling:
            // the next progress call sends a due one, after the application has seen what
            // arrived.
            if !defer_acks && body.held_ack.since.is_some() && (sent > 0 || body.held_ack.due(now))
            {
                body.tx.end_datagram();
                self.build(body, dst, now, false);
            }
            self.flush(&mut body.tx);
            body.held_ack.note(body.qp.holds_ack(), now);
            self.queue_if_left(cell, body);
        }
        self.drain_completions(cell, body);
        self.publish_deadline(cell, body);
        body.held_ack.due_at()
    }

    /// Build everything the QP has ready for `dst` into its batch (sending full batches),
    /// leaving a lone positive acknowledgement queued with `hold_ack`; the caller flushes.
    /// Returns the packets built.
    fn build(&self, body: &mut QpBody, dst: SocketAddr, now: u64, hold_ack: bool) -> usize {
        let QpBody {
            qp,
            tx,
            gather,
            deltas,
            ..
        } = body;
        let mut built_n = 0;
        let mut answers = 0;
        let mut zero_copy = 0;
        let max = qp.max_packet_len();
        let v4 = dst.is_ipv4();
        let mem: &MemoryTable = &self.mem;
        // Payloads lent in an earlier run are lent again (the region may have changed since).
        gather.forget_anchor();
        loop {
            // A transmit poll that cannot produce anything costs as much as one that does
            // (it runs cold, after the kernel's receive path, on a latency's critical path).
            // Answers first, up to the budget; requests are bounded by the send window.
            let answer = answers < RESPONSE_BUDGET && qp.has_response_work();
            if !answer && !qp.has_request_work() {
                break;
            }
            let answer = answer && !(hold_ack && qp.holds_ack());
            if !tx.has_room(max) {
                self.flush(tx);
            }
            // Request and READ response payloads from memory the engine keeps alive are
            // lent, not copied: the kernel copies them from the region during the send.
            let built = tx.push_packet_gather(dst, max, gather, |buf, g| {
                if answers < RESPONSE_BUDGET {
                    qp.poll_transmit_gather(now, mem, buf, g, hold_ack)
                } else {
                    qp.poll_request_gather(now, mem, buf, g)
                }
                .unwrap_or(0)
            });
            match built {
                Some((0, _, _)) => break,
                Some((wire, n, k)) => {
                    built_n += 1;
                    answers += usize::from(answer);
                    zero_copy += usize::from(wire > n);
                    if k > 0 && v4 {
                        fix_icrc_for_id(deltas, tx.last_packet_mut(n), wire, k);
                    }
                }
                None => {
                    if tx.is_empty() {
                        break; // cannot happen: an empty batch has room for a packet
                    }
                    self.flush(tx);
                }
            }
        }
        if zero_copy > 0 {
            self.counters
                .tx_zero_copy
                .fetch_add(zero_copy as u64, Ordering::Relaxed);
        }
        built_n
    }

    /// Answers left over (a drive spent its budget): the engine serves them later.
    fn queue_if_left(&self, cell: &Arc<QpCell>, body: &mut QpBody) {
        if body.qp.has_response_work() && !body.qp.holds_ack() && !body.tx_queued {
            body.tx_queued = true;
            self.queue_transmit(cell);
        }
    }

    /// Put a QP with answers left over into the pending-transmit queue, and wake the engine
    /// thread if it may be asleep (the queue was empty).
    fn queue_transmit(&self, cell: &Arc<QpCell>) {
        let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(Arc::clone(cell));
        let was_empty = self.tx_pending_len.fetch_add(1, Ordering::Release) == 0;
        drop(q);
        if was_empty {
            self.kick_thread();
        }
    }

    /// True when QPs wait in the pending-transmit queue.
    pub fn has_pending_transmit(&self) -> bool {
        self.tx_pending_len.load(Ordering::Acquire) > 0
    }

    /// Serve the pending-transmit queue once round: each QP queued now sends up to
    /// [`RESPONSE_BUDGET`] answers and goes to the back of the queue if it has more. A QP
    /// whose lock is taken (being driven elsewhere) waits for the next round. Returns the QPs
    /// served.
    pub fn serve_pending_transmit(&self) -> usize {
        let n = self.tx_pending_len.load(Ordering::Acquire);
        let mut served = 0;
        for _ in 0..n {
            let cell = {
                let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
                let Some(c) = q.pop_front() else { break };
                self.tx_pending_len.fetch_sub(1, Ordering::Release);
                c
            };
            let mut body = match cell.try_lock() {
                Some(b) => b,
                None => {
                    let mut q = self.tx_pending.lock().unwrap_or_else(|e| e.into_inner());
                    q.push_back(Arc::clone(&cell));
                    self.tx_pending_len.fetch_add(1, Ordering::Release);
                    continue;
                }
            };
            body.tx_queued = false;
            let now = self.now();
            self.drive(&cell, &mut body, now);
            served += 1;
        }
        served
    }

    /// Wake the engine thread at once (its eventfd).
    fn kick_thread(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd; a full counter (never
        // reached: the engine thread drains it) would only make this write fail.
        let _ = unsafe { libc::write(self.kick.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Send the QP's held acknowledgement (and whatever else it has ready) now.
    fn release_ack(&self, body: &mut QpBody, now: u64) {
        if let Some(dst) = body.peer {
            self.build(body, dst, now, false);
            self.flush(&mut body.tx);
        }
        body.held_ack.note(body.qp.holds_ack(), now);
        // Requests built with it arm the retransmission timer (the QP's own deadline is
        // published when it is unlocked).
        self.timers_changed(body.qp.poll_timeout());
    }

    /// Move a QP's completions to its CQs without transmitting (after a post that cannot
    /// produce packets, such as a receive: acknowledgements waiting in the batch then still
    /// leave with the QP's next request).
    pub fn drain_completions(&self, cell: &QpCell, body: &mut QpBody) {
        // Work that invalidated a key completes only once every byte lent from its region has
        // been handed to the socket (this QP's batch is flushed before completions are
        // drained; another QP's, by the drive that built it, which needs no lock held here).
        while let Some(key) = body.qp.pop_invalidated() {
            self.mem.wait_unlent(key);
        }
        while let Some(wc) = body.qp.poll_send_completion() {
            cell.send_cq.push(wc);
        }
        while let Some(wc) = body.qp.poll_recv_completion() {
            cell.recv_cq.push(wc);
        }
    }

    /// Send the QP's held acknowledgement, and the one of requests executed without AckReq,
    /// now (before the QP goes away: its peer is waiting for them).
    pub fn flush_held(&self, body: &mut QpBody) {
        body.qp.ack_now();
        self.release_ack(body, self.now());
    }

    /// Send held acknowledgements that are due (all of them with `all`); QPs still holding
    /// one stay on the list.
    fn flush_pending(&self, rx: &mut RxState, all: bool) {
        if !rx.work.pending.is_empty() {
            self.flush_pending_at(rx, all, self.now());
        }
    }

    fn flush_pending_at(&self, rx: &mut RxState, all: bool, now: u64) {
        let w = &mut rx.work;
        if w.pending.is_empty() || (!all && now < w.pending_due) {
            return;
        }
        let mut next = u64::MAX;
        w.pending.retain(|cell| {
            let mut body = cell.lock();
            if all || body.held_ack.due(now) {
                self.release_ack(&mut body, now);
                self.publish_deadline(cell, &body);
                self.queue_if_left(cell, &mut body);
            }
            next = next.min(body.held_ack.due_at().unwrap_or(u64::MAX));
            body.held_ack.since.is_some()
        });
        w.pending_due = next;
    }

    fn flush(&self, tx: &mut TxBatch) {
        if tx.is_empty() {
            return;
        }
        let (d, p) = (tx.len() as u64, tx.packets() as u64);
        match self.port.send(tx) {
            Ok(_) => {
                self.counters.tx_datagrams.fetch_add(d, Ordering::Relaxed);
                self.counters.tx_packets.fetch_add(p, Ordering::Relaxed);
            }
            Err(e) => {
                // Lost packets are recovered by the transport's retransmission.
                self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("send failed: {e}");
            }
        }
    }

    /// Receive and process what is queued on the socket, if no other thread is doing so.
    /// Returns the number of packets processed. Also runs due timers when `timers` is set.
    pub fn progress(&self, timers: bool) -> usize {
        self.progress_as(timers, true)
    }

    /// [`Engine::progress`]; an `active` poller keeps the engine thread off the receive path
    /// (busy-poll mode), one that is about to sleep until a completion event (its CQ is armed)
    /// does not.
    pub fn progress_as(&self, timers: bool, active: bool) -> usize {
        // The poller counts as active even when it finds the receive path taken: otherwise an
        // engine thread that stepped in while pollers were quiet would keep it (and compete
        // with spinning pollers for the cores) for as long as they keep finding it taken.
        let now = self.now();
        if active {
            self.poller_active(now);
        }
        if self.has_pending_transmit() {
            self.serve_pending_transmit();
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        // A thread about to sleep holds back no acknowledgement: nobody might send it for a
        // while.
        let defer_acks = self.mode == PollMode::BusyPoll && active;
        let mut done = self.receive_at(&mut rx, defer_acks, active, now);
        // Active pollers also fire due timers, so that the engine thread can stay asleep
        // instead of preempting them; what is queued goes first (`drain_before_timers`).
        let scan = timers || now >= self.next_timer.load(Ordering::Relaxed);
        if scan {
            done += self.drain_before_timers(&mut rx);
        }
        drop(rx);
        if scan {
            self.run_timers();
        }
        done
    }

    /// Receive and handle up to a few batches of datagrams. Plain acknowledgements are held
    /// while a batch is handled, so that a QP sends one (the newest) per batch; with
    /// `defer_acks` (busy-poll mode) they stay held for up to ACK_DELAY, else they go out
    /// at the end of each batch.
    fn receive(&self, rx: &mut RxState, defer_acks: bool) -> usize {
        self.receive_at(rx, defer_acks, false, self.now())
    }

    /// [`Engine::receive`] with the clock already read; a `poller` (an application thread)
    /// counts as active at every batch, so that a long receive does not look like a quiet
    /// poller to the engine thread.
    fn receive_at(&self, rx: &mut RxState, defer_acks: bool, poller: bool, now: u64) -> usize {
        if !defer_acks {
            self.flush_pending_at(rx, true, now);
        }
        let mut done = 0;
        let mut now = now;
        for round in 0..8 {
            let n = match self.port.recv(&mut rx.batch) {
                Ok(n) => n,
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            self.counters
                .rx_datagrams
                .fetch_add(n as u64, Ordering::Relaxed);
            // The caller's clock reading is fresh for the first batch.
            if round > 0 {
                now = self.now();
                if poller {
                    self.poller_active(now);
                }
            }
            for i in 0..n {
                if let Some(d) = rx.batch.get(i) {
                    done += self.handle_datagram(now, &d, &mut rx.work);
                }
            }
            if !defer_acks {
                self.flush_pending(rx, true);
            }
            if n < RX_BATCH {
                break;
            }
        }
        if defer_acks {
            // Busy-poll mode: a due acknowledgement goes out from a poll that found nothing,
            // in time the poller would spin away anyway. A poll that found packets hands them
            // to the application first (a system call ahead of them delays what it waits
            // for); in a stream that never leaves the socket empty, acknowledgements go out
            // once overdue by another ACK_DELAY.
            let slack = if done > 0 { ACK_DELAY } else { 0 };
            self.flush_pending_at(rx, false, now.saturating_sub(slack));
        }
        if done > 0 {
            self.counters
                .rx_packets
                .fetch_add(done as u64, Ordering::Relaxed);
        }
        done
    }

    /// Handle one datagram as if the socket had just delivered it from `d.src` at `now`:
    /// verification, demultiplexing, the peer check and the transport, as for a datagram
    /// received; acknowledgements go out at the end, as in blocking mode. The receive path
    /// without the socket, for tests and fuzzing. Returns the packets the datagram held.
    pub fn handle_received(&self, now: u64, d: &Received<'_>) -> usize {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        self.counters.rx_datagrams.fetch_add(1, Ordering::Relaxed);
        let done = self.handle_datagram(now, d, &mut rx.work);
        self.flush_pending_at(&mut rx, true, now);
        self.counters
            .rx_packets
            .fetch_add(done as u64, Ordering::Relaxed);
        done
    }

    /// Verify a received packet's ICRC. The IPv4 identification is not visible to a UDP
    /// socket; softrdma senders use 0 for a lone packet and k for the k-th segment of a GSO
    /// datagram, so that is tried first (a full 32-bit check). Otherwise (a third-party sender
    /// such as Linux rxe, which numbers its datagrams) the identification is solved for, which
    /// leaves 16 check bits; such packets are counted in `rx_icrc_solved`.
    pub fn verify<'a>(
        &self,
        src: SocketAddr,
        k: usize,
        seg: &'a [u8],
        deltas: &mut Vec<IdDelta>,
        prefix: &mut Option<(SocketAddr, IcrcPrefix)>,
    ) -> Option<Packet<'a>> {
        let id = (k & 0xffff) as u16;
        // The covered headers of the last sender's packets, computed once per sender.
        let base = match prefix {
            Some((s, p)) if *s == src => *p,
            _ => {
                let ip = match (src.ip(), self.local_ip) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => IpHeader::V4 {
                        src: s,
                        dst: d,
                        id: 0,
                        dont_fragment: true,
                    },
                    (IpAddr::V6(s), IpAddr::V6(d)) => IpHeader::V6 { src: s, dst: d },
                    _ => {
                        self.counters.rx_bad.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                };
                let p = IcrcPrefix::new(IcrcContext {
                    ip,
                    src_port: src.port(),
                    dst_port: self.port.local_addr().port(),
                });
                *prefix = Some((src, p));
                p
            }
        };
        let ctx = base.with_id(id);
        let v4 = matches!(ctx.context().ip, IpHeader::V4 { .. });
        match Packet::parse_verified(&ctx, seg) {
            Ok(p) => return Some(p),
            Err(crate::wire::Error::BadIcrc { carried, computed }) if v4 => {
                let d = delta_for(deltas, seg.len() - ICRC_LEN);
                if d.solve(computed ^ d.delta(id), carried).is_some() {
                    self.counters.rx_icrc_solved.fetch_add(1, Ordering::Relaxed);
                    return Packet::parse(seg).ok();
                }
            }
            Err(_) => {}
        }
        self.counters.rx_bad.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Handle the packets of one received datagram; returns how many it held. Its segments
    /// usually belong to one QP, which stays locked across them and is driven once, after
    /// the last of them; a plain acknowledgement it produces is held (the QP joins
    /// `w.pending`).
    fn handle_datagram(&self, now: u64, d: &Received<'_>, w: &mut RxWork) -> usize {
        let mut done = 0;
        let mut segs = d.segments().enumerate();
        // A verified packet for another QP than the one just handled.
        let mut carry: Option<Packet<'_>> = None;
        loop {
            let pkt = match carry.take() {
                Some(p) => p,
                None => {
                    let Some((k, seg)) = segs.next() else { break };
                    done += 1;
                    match self.verify(d.src, k, seg, &mut w.deltas, &mut w.icrc) {
                        Some(p) => p,
                        None => continue,
                    }
                }
            };
            let qpn = pkt.hdr.bth.dest_qp;
            let Some(cell) = self.find_qp(qpn, &mut w.last_qp) else {
                continue;
            };
            let mut body = cell.lock();
            if body.peer.map(|p| p.ip()) != Some(d.src.ip())
                || body.peer_src_port.is_some_and(|p| p != d.src.port())
            {
                self.counters.rx_wrong_peer.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Not latched yet: the first datagram whose packets the transport accepts as
            // progress names the peer's source port.
            let mark = body
                .peer_src_port
                .is_none()
                .then(|| body.qp.progress_mark());
            self.handle_packet(now, &cell, &mut body, &pkt);
            for (k, seg) in segs.by_ref() {
                done += 1;
                let Some(p) = self.verify(d.src, k, seg, &mut w.deltas, &mut w.icrc) else {
                    continue;
                };
                if p.hdr.bth.dest_qp != qpn {
                    carry = Some(p);
                    break;
                }
                self.handle_packet(now, &cell, &mut body, &p);
            }
            if mark.is_some_and(|m| m != body.qp.progress_mark()) {
                body.peer_src_port = Some(d.src.port());
            }
            let due = self.drive_inner(&cell, &mut body, now, true);
            drop(body);
            if let Some(t) = due {
                w.pending_due = w.pending_due.min(t);
                if !w.pending.iter().any(|c| c.qpn == cell.qpn) {
                    w.pending.push(cell);
                }
            }
        }
        done
    }

    /// The QP with this number (counted when there is none): `last` when it is that QP and
    /// the table has not changed since it was looked up.
    fn find_qp(&self, qpn: u32, last: &mut Option<(u64, Arc<QpCell>)>) -> Option<Arc<QpCell>> {
        if let Some((generation, cell)) = last.as_ref()
            && cell.qpn == qpn
            && *generation == self.qp_gen.load(Ordering::Acquire)
        {
            return Some(Arc::clone(cell));
        }
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let generation = self.qp_gen.load(Ordering::Acquire);
        let Some(cell) = qps.get(&qpn).cloned() else {
            drop(qps);
            self.counters.rx_unknown_qp.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        drop(qps);
        *last = Some((generation, Arc::clone(&cell)));
        Some(cell)
    }

    /// Hand one verified packet to its (locked) QP.
    fn handle_packet(&self, now: u64, cell: &QpCell, body: &mut QpBody, pkt: &Packet<'_>) {
        match &cell.srq {
            Some(s) => {
                let mut srq = s.srq.lock().unwrap_or_else(|e| e.into_inner());
                body.qp.handle_packet(now, pkt, &*self.mem, Some(&mut srq));
                let fired = srq.take_limit_event().then(|| srq.id());
                drop(srq);
                if let Some(id) = fired {
                    s.limit_reached(id);
                }
            }
            None => body.qp.handle_packet(now, pkt, &*self.mem, None),
        }
    }

    /// Fire due timers of every QP; returns the earliest deadline still pending.
    pub fn run_timers(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        // QP bodies are locked under the table's read lock; no path takes the table's write
        // lock while holding a body, so this cannot deadlock.
        let qps = self.qps.read().unwrap_or_else(|e| e.into_inner());
        let now = self.now();
        self.counters.timer_scans.fetch_add(1, Ordering::Relaxed);
        // Deadlines armed from now on lower this again (after publishing their QP's, which
        // this scan then sees, or lowering it after this store): none is lost.
        self.next_timer.store(u64::MAX, Ordering::SeqCst);
        for cell in qps.values() {
            // Most QPs are not due: their published deadline says so without their lock.
            let d = cell.deadline();
            if d > now {
                if d != u64::MAX {
                    next = Some(next.map_or(d, |n: u64| n.min(d)));
                }
                continue;
            }
            // A due QP whose lock is held is being worked on (a post or a packet): its timers
            // are looked at again shortly rather than making this thread wait for it.
            let Some(mut body) = cell.try_lock() else {
                next = Some(next.map_or(now + 1_000_000, |n: u64| n.min(now + 1_000_000)));
                continue;
            };
            if let Some(t) = body.qp.poll_timeout()
                && t <= now
            {
                body.qp.handle_timeout(now);
                self.drive(cell, &mut body, now);
            }
            if let Some(t) = body.qp.poll_timeout() {
                next = Some(next.map_or(t, |n: u64| n.min(t)));
            }
        }
        // A scan costs every QP of the device: the next one waits at least as long as this
        // one took per QP (TIMER_SLACK_PER_QP each), so that thousands of QPs whose timers
        // fall due one after another (a burst posted at once) do not make every wake-up a
        // scan. A timer fires at most that much late (0.8 ms with 16,000 QPs).
        let slack = now + qps.len() as u64 * TIMER_SLACK_PER_QP;
        let next = next.map(|t| t.max(slack));
        // A scan by a poller may find a deadline earlier than the one the engine thread
        // sleeps for: that wakes it (the thread's own scans find the watch cleared).
        self.timers_changed(Some(next.unwrap_or(now + TIMER_SCAN)));
        next
    }

    /// Take what is queued on the socket before a timer scan (bounded): a thread that was
    /// off the CPU wakes up late both to its timers and to the acknowledgements that would
    /// have stopped them, and a scan first would retransmit what the peer has already
    /// acknowledged (with thousands of QPs, a storm of them). Returns the packets handled.
    fn drain_before_timers(&self, rx: &mut RxState) -> usize {
        /// Receive calls at most (each takes up to 8 batches of `RX_BATCH` datagrams).
        const ROUNDS: usize = 32;
        let mut done = 0;
        for _ in 0..ROUNDS {
            match self.receive(rx, false) {
                0 => break,
                n => done += n,
            }
        }
        done
    }

    /// True when no application thread has polled for `POLLER_ACTIVE`.
    fn pollers_quiet(&self) -> bool {
        self.now()
            .saturating_sub(self.last_poll.load(Ordering::Relaxed))
            > POLLER_ACTIVE
    }

    /// The receive path for the engine thread, when it is the thread's turn: always in
    /// blocking mode (an application thread that calls `progress` meanwhile is waited for,
    /// not spun against), in busy-poll mode only once pollers have gone quiet and if free.
    fn thread_rx(&self, pollers_quiet: bool) -> Option<MutexGuard<'_, RxState>> {
        match self.mode {
            PollMode::Blocking => Some(self.rx.lock().unwrap_or_else(|e| e.into_inner())),
            PollMode::BusyPoll if pollers_quiet => self.rx.try_lock().ok(),
            PollMode::BusyPoll => None,
        }
    }

    /// Note that a QP's timers changed (a post or a packet may arm one): the next progress
    /// call looks at them.
    pub fn timers_changed(&self, deadline: Option<u64>) {
        let Some(t) = deadline else { return };
        if t >= self.next_timer.load(Ordering::Relaxed) {
            return;
        }
        let was = self.next_timer.fetch_min(t, Ordering::SeqCst);
        // The engine thread sleeps past it: wake it (once: a later, earlier deadline finds
        // the watch cleared or lowered by then).
        if t < was && t < self.timer_watch.load(Ordering::SeqCst) {
            self.timer_watch.store(0, Ordering::SeqCst);
            self.kick_thread();
        }
    }

    /// Publish a QP's next deadline (for the timer scan) and lower the device's.
    fn publish_deadline(&self, cell: &QpCell, body: &QpBody) {
        let t = body.qp.poll_timeout();
        cell.deadline.store(t.unwrap_or(u64::MAX), Ordering::SeqCst);
        self.timers_changed(t);
    }

    /// Ask the engine thread to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_in(1);
    }

    /// The engine thread's loop: until stopped, wait for packets (blocking mode) or for the
    /// next timer, then make progress.
    pub fn run(&self) {
        const IDLE: u64 = 50_000_000; // wake at least every 50 ms (a safety net: `stop` wakes it)
        // Busy-poll mode: the socket woke this thread but a poller had the packets (it was
        // active again, or still inside a long receive); the next wait does not watch the
        // socket, so that a steady stream of packets cannot keep waking the thread to spin
        // against the pollers for the cores.
        let mut woken_for_nothing = false;
        // Pollers had gone quiet but the receive path was taken: nobody may push the waker
        // again, so the next wait is short.
        let mut retry = false;
        while !self.stop.load(Ordering::Acquire) {
            self.tear_down_users();
            // The scan of every QP's timers runs only once the earliest deadline is due (drives
            // lower `next_timer` whenever they arm one): a wake-up for a packet costs nothing
            // per QP of the device.
            let due = self.next_timer.load(Ordering::Relaxed);
            let next = if self.now() >= due {
                if let Some(mut rx) = self.thread_rx(self.pollers_quiet()) {
                    self.drain_before_timers(&mut rx);
                }
                self.run_timers()
            } else {
                Some(due)
            };
            let now = self.now();
            let wait = next.map_or(IDLE, |t| t.saturating_sub(now)).min(IDLE);
            // Answers left over from budgeted drives: look at the socket, do not sleep.
            let wait = if self.has_pending_transmit() { 0 } else { wait };
            // In busy-poll mode pollers receive; the thread steps in only when nobody has
            // polled for a while, and otherwise sleeps instead of competing for packets.
            let watch_socket = match self.mode {
                PollMode::Blocking => true,
                PollMode::BusyPoll => {
                    !woken_for_nothing
                        && now.saturating_sub(self.last_poll.load(Ordering::Relaxed))
                            > POLLER_ACTIVE
                }
            };
            // While pollers are active they fire timers themselves, and keep pushing the
            // waker back: the thread sleeps until they have gone quiet (or `stop`).
            let wait = match (watch_socket, retry) {
                (true, _) => wait,
                (false, true) => ENGINE_RETRY,
                (false, false) => IDLE,
            };
            // While this thread keeps the timers (it watches the socket), a timer armed
            // before it would wake kicks it; one armed between reading the deadline above and
            // this is seen here.
            let wait = if watch_socket {
                let now = self.now();
                self.timer_watch.store(now + wait, Ordering::SeqCst);
                let due = self.next_timer.load(Ordering::SeqCst);
                wait.min(due.saturating_sub(now))
            } else {
                wait
            };
            let ts = libc::timespec {
                tv_sec: (wait / 1_000_000_000) as i64,
                tv_nsec: (wait % 1_000_000_000) as i64,
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.waker.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.kick.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.port.raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let nfds = if watch_socket { 3 } else { 2 };
            // SAFETY: `fds` holds `nfds` valid pollfds and `ts` is a valid timeout.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), nfds, &ts, std::ptr::null()) };
            self.timer_watch.store(0, Ordering::SeqCst);
            let ready = n > 0 && fds[2].revents != 0;
            for fd in &fds[..2] {
                if n > 0 && fd.revents != 0 {
                    let mut ticks = [0u8; 8];
                    // SAFETY: reads at most 8 bytes into a live buffer from our timerfd or
                    // eventfd (both non-blocking: nothing to read is an error we ignore).
                    let _ = unsafe { libc::read(fd.fd, ticks.as_mut_ptr().cast(), 8) };
                }
            }
            self.counters.thread_wakeups.fetch_add(1, Ordering::Relaxed);
            // Receive only when it is this thread's turn: always in blocking mode, and in
            // busy-poll mode once pollers have gone quiet (competing with an active poller
            // only adds lock hand-offs and reorders nothing for the better).
            let pollers_quiet = self.pollers_quiet();
            // While pollers are active they hold the receive path (and send held ACKs when
            // due); this thread keeps off the receive lock, so that being preempted while
            // holding it can never stall them.
            woken_for_nothing = false;
            retry = false;
            match self.thread_rx(pollers_quiet) {
                Some(mut rx) => {
                    // Progress without marking a poller active.
                    self.counters
                        .thread_receives
                        .fetch_add(1, Ordering::Relaxed);
                    self.receive(&mut rx, false);
                    drop(rx);
                    // One round of left-over answers between two receives.
                    self.serve_pending_transmit();
                }
                // A poller holds the receive path (a poller inside a long receive has not
                // marked itself active for a while), or was active again by the time this
                // thread ran.
                None => {
                    woken_for_nothing = ready || pollers_quiet;
                    retry = pollers_quiet;
                }
            }
        }
    }
}

fn delta_for(deltas: &mut Vec<IdDelta>, body_len: usize) -> &IdDelta {
    if let Some(i) = deltas.iter().position(|d| d.body_len() == body_len) {
        return &deltas[i];
    }
    if deltas.len() >= 8 {
        deltas.remove(0);
    }
    deltas.push(IdDelta::new(body_len));
    deltas.last().expect("just pushed")
}

/// Give a packet of `wire` bytes (a whole UDP payload) the ICRC for IPv4 identification
/// `id`; `pkt` holds its last bytes, the ICRC among them (the packet's bytes in the transmit
/// arena: all of them, or the tail behind a lent payload).
fn fix_icrc_for_id(deltas: &mut Vec<IdDelta>, pkt: &mut [u8], wire: usize, id: u16) {
    let n = pkt.len();
    if n < ICRC_LEN || wire < n {
        return;
    }
    let d = delta_for(deltas, wire - ICRC_LEN).delta(id);
    let mut c = [0u8; 4];
    c.copy_from_slice(&pkt[n - ICRC_LEN..]);
    let icrc = u32::from_le_bytes(c) ^ d;
    pkt[n - ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
}

/// A QP's transmit batch for packets of up to `max` bytes: room for one full GSO datagram
/// plus a packet (the arena is zero pages until used, so small-MTU QPs that never fill it do
/// not pay for it).
pub fn qp_tx_batch(max: usize) -> TxBatch {
    TxBatch::new(64, MAX_DATAGRAM + max)
}

/// Start the engine thread.
pub fn spawn(engine: Arc<Engine>) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("softrdma-engine".into())
        .spawn(move || engine.run())
}
