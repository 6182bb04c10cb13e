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
//!
//! The code: this file holds the types and the QP table; `transmit.rs` the send side,
//! `receive.rs` the receive side, `thread.rs` the engine thread, the timer scan and the
//! busy-poll hand-over, `teardown.rs` the QPs an invalidated region ends.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::async_event::AsyncEvents;
use super::clock::Clock;
use super::cq::CqCore;
use super::port::Port;
use super::udp::{MAX_DATAGRAM, Received, RxBatch, TxBatch, UdpPort};
use crate::mem::MemoryTable;
use crate::rc::emit::LEND_MAX_PIECES;
use crate::rc::{Gather, Qp, QpType, Srq};
use crate::wire::{ICRC_LEN, IcrcContext, IcrcPrefix, IdDeltas, IpHeader, Packet};

mod receive;
mod teardown;
mod thread;
mod transmit;

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
    /// Busy-poll mode: posts whose transmission was left for the poster's next poll
    /// ([`Engine::post_done`]).
    pub posts_deferred: AtomicU64,
    /// Times the engine thread woke up (a timer, a packet, or its waker).
    pub thread_wakeups: AtomicU64,
    /// Times the engine thread received for the device (always in blocking mode; in
    /// busy-poll mode only while no application thread polls).
    pub thread_receives: AtomicU64,
    /// Scans of the QPs' timers (each reads every QP's published deadline).
    pub timer_scans: AtomicU64,
    /// Busy-poll mode: times the engine thread found datagrams nobody had polled for and
    /// began watching the socket for an application that waits by spinning on memory.
    pub spinner_watches: AtomicU64,
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
    deltas: IdDeltas,
    held_ack: HeldAck,
    /// In the engine's pending-transmit queue: answers are left over from a drive that spent
    /// its budget (see [`RESPONSE_BUDGET`]), or posts wait for their doorbell
    /// ([`Engine::post_done`]).
    tx_queued: bool,
    /// Posts whose transmission waits for the poster's next poll ([`Engine::post_done`]).
    deferred: u32,
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
    /// The transport service (a UD QP takes datagrams from any sender, and sends each where
    /// its work request says).
    pub qp_type: QpType,
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
            qp_type: qp.qp_type(),
            pd,
            body: Mutex::new(QpBody {
                qp,
                peer: None,
                peer_src_port: None,
                tx: qp_tx_batch(max),
                gather: Gather::with_capacity(LEND_MAX_PIECES),
                deltas: IdDeltas::default(),
                held_ack: HeldAck::default(),
                tx_queued: false,
                deferred: 0,
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
    deltas: IdDeltas,
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
    port: Port,
    local_ip: IpAddr,
    mem: Arc<MemoryTable>,
    qps: RwLock<HashMap<u32, Arc<QpCell>>>,
    /// Bumped on every change of `qps` (invalidates the receive path's cached QP).
    qp_gen: AtomicU64,
    rx: Mutex<RxState>,
    clock: Clock,
    mode: PollMode,
    gso: bool,
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
    /// Posts were left for a poll ([`Engine::post_done`]) and the engine thread looks at them
    /// from time to time until the queue is empty: posters leaving more do not wake it.
    doorbell_watch: AtomicBool,
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

/// Busy-poll mode, once the engine thread has found packets nobody polled for (the
/// application waits by spinning on memory, as `ib_write_lat` does): the thread watches the
/// socket and takes a datagram when no application thread has polled a CQ for this long (ns).
const SPINNER_GRACE: u64 = 30_000;

/// Wake-ups for a datagram a poller took after all, in a row, after which the engine thread
/// stops watching the socket for memory-spinning applications (the pollers receive again).
const SPINNER_SKIPS: u32 = 8;

/// Take-overs in a row (pollers quiet for POLLER_ACTIVE, the waker fired) that found datagrams
/// waiting, after which the engine thread watches the socket for a memory-spinning
/// application: such an application stalls every round trip, a one-off (a connection set up,
/// an application pausing) does not.
const SPINNER_TAKEOVERS: u32 = 3;

/// Posts one QP leaves for the poster's next poll at most ([`Engine::post_done`]); the next
/// one transmits them all.
const DOORBELL_MAX: u32 = 128;

/// Busy-poll mode, when the engine thread receives because no application thread polls: it
/// keeps receiving until this long (ns) passes without a datagram before it sleeps again
/// (`Engine::spin_receive`).
const ENGINE_SPIN: u64 = 50_000;

/// The longest the engine thread receives in one spin before it looks at timers and the rest
/// of its loop again (ns).
const ENGINE_SPIN_MAX: u64 = 2_000_000;

/// Rounds in which the engine thread, sending posts left for a poll, tries again a QP whose
/// lock was taken.
const DOORBELL_RETRIES: usize = 8;

/// Posts left for a poll ([`Engine::post_done`]): the engine thread looks at them this often
/// (ns), and sends them once no application thread has polled for this long. Waking it for
/// every burst instead (tens of thousands of times a second on a machine whose cores two
/// spinning processes already fill) cost a third of a 64 B message rate.
const DOORBELL_GRACE: u64 = 60_000;

/// The longest nap between two looks at posts left for a poll while an active poller keeps
/// sending them itself (ns): the most a poster that stops polling in the middle of a stream
/// waits for them, beyond DOORBELL_GRACE.
const DOORBELL_NAP_MAX: u64 = 480_000;

/// After a scan of the QPs' timers, the next waits at least this long per QP of the device
/// (ns).
const TIMER_SLACK_PER_QP: u64 = 50;

/// With no timer pending, the QPs' timers are looked at again after this long: a safety net
/// only, since arming a timer lowers the device's next deadline (and wakes the engine thread
/// when it sleeps past it).
const TIMER_SCAN: u64 = 50_000_000;

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
                    deltas: IdDeltas::default(),
                    icrc: None,
                    pending: Vec::with_capacity(64),
                    pending_due: u64::MAX,
                    last_qp: None,
                },
            }),
            qp_gen: AtomicU64::new(0),
            clock,
            mode,
            gso,
            stop: AtomicBool::new(false),
            last_poll: AtomicU64::new(0),
            last_progress: AtomicU64::new(0),
            waker,
            waker_armed: AtomicU64::new(0),
            channels: Mutex::new(Vec::new()),
            channels_watch: AtomicBool::new(true),
            kick,
            next_timer: AtomicU64::new(0),
            timer_watch: AtomicU64::new(0),
            tx_pending: Mutex::new(VecDeque::new()),
            tx_pending_len: AtomicUsize::new(0),
            doorbell_watch: AtomicBool::new(false),
            invalidated: Mutex::new(Vec::new()),
            invalidations_pending: AtomicBool::new(false),
            events: AsyncEvents::default(),
            counters: EngineCounters::default(),
        })
    }

    /// Nanoseconds since the engine started: the transport's clock.
    pub fn now(&self) -> u64 {
        self.clock.now()
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

    /// The socket address an address vector sends to (an IPv4-mapped IPv6 destination is
    /// reached over IPv4 from an IPv4 device).
    pub fn av_dest(&self, av: &IcrcContext) -> SocketAddr {
        let ip = match av.ip {
            IpHeader::V4 { dst, .. } => IpAddr::V4(dst),
            IpHeader::V6 { dst, .. } => match dst.to_ipv4_mapped() {
                Some(v4) if self.local_ip.is_ipv4() => IpAddr::V4(v4),
                _ => IpAddr::V6(dst),
            },
        };
        SocketAddr::new(ip, av.dst_port)
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

    /// The device's socket (readable when datagrams wait).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.port.raw_fd()
    }
}

/// A QP's transmit batch for packets of up to `max` bytes: room for one full GSO datagram
/// plus a packet (the arena is zero pages until used, so small-MTU QPs that never fill it do
/// not pay for it).
pub fn qp_tx_batch(max: usize) -> TxBatch {
    TxBatch::new(64, MAX_DATAGRAM + max)
}
