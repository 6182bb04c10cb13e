//! A QP as the endpoint holds it: the transport state machine with its transmit batch, its
//! lending gather and its held acknowledgement ([`QpBody`], behind [`QpCell::lock`]), the CQs
//! and SRQ it reports to, and the deadline it publishes for the timer scan.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::ACK_DELAY;
use super::inbox::Inbox;
use crate::net::cq::CqCore;
use crate::net::udp::{MAX_DATAGRAM, TxBatch};
use crate::params::ACK_GRACE;
use crate::rc::emit::LEND_MAX_PIECES;
use crate::rc::{Gather, PostRules, Qp, QpType, Srq};
use crate::wire::IdDeltas;

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
    pub(crate) tx: TxBatch,
    /// Payload lent for the packet being built (moves into `tx`).
    pub(crate) gather: Gather,
    pub(crate) deltas: IdDeltas,
    pub(crate) held_ack: HeldAck,
    /// In the endpoint's pending-transmit queue: answers are left over from a drive that
    /// spent its budget (see [`RESPONSE_BUDGET`](super::RESPONSE_BUDGET)), or posts wait for
    /// their doorbell ([`Engine::post_done`](crate::net::Engine::post_done)).
    pub(crate) tx_queued: bool,
    /// Posts whose transmission waits for the poster's next poll
    /// ([`Engine::post_done`](crate::net::Engine::post_done)).
    pub(crate) deferred: u32,
    /// When the application last posted to the QP (engine clock).
    pub(crate) last_post: u64,
    /// Requests in the send queue whose slots `QpCell::sq_used` counts (see `inbox.rs`).
    pub(crate) sq_counted: u32,
    /// The post rules last published to the inbox.
    pub(crate) rules_published: Option<PostRules>,
}

/// When a QP's transport began holding back a positive acknowledgement (busy-poll mode). The
/// acknowledgement itself stays queued in the transport, unbuilt: acknowledgements are
/// cumulative, so a newer one replaces it there, and it is built only when it is sent.
#[derive(Debug)]
pub(crate) struct HeldAck {
    pub(crate) since: Option<u64>,
    /// How long an application's poll that finds nothing lets this QP hold its ACK before it
    /// goes alone; see [`HeldAck::grace`].
    grace: u64,
    /// An ACK went alone when an empty poll's grace ran out, and nothing since has told
    /// whether the peer waited for it.
    early: bool,
}

impl Default for HeldAck {
    fn default() -> HeldAck {
        HeldAck {
            since: None,
            grace: ACK_GRACE,
            early: false,
        }
    }
}

impl HeldAck {
    /// The grace of an empty poll (busy-poll mode): `ACK_GRACE`, so that two sides each
    /// waiting for its send's completion (the ACK the other holds) do not each wait
    /// `ACK_DELAY`, nor a sender waiting for each send's completion before the next (a
    /// blocking zero-copy send). Doubled, up to `ACK_DELAY`, each time an early ACK proves
    /// needless: sent while this side waited for no ACK of its own, and followed by a request
    /// of this side before any of the peer's (the ACK would have ridden with it, as an RxM
    /// ping-pong's answers, which come several polls after the message). Back to `ACK_GRACE`
    /// when an early ACK goes while this side waits for the peer's ACKs (the two may wait for
    /// each other), or when the peer's next request follows one (it may have waited for it).
    pub(crate) fn grace(&self) -> u64 {
        self.grace
    }

    /// An empty poll's grace ran out and the ACK went alone; `waiting`: this side has
    /// requests the peer has not acknowledged.
    pub(crate) fn sent_early(&mut self, waiting: bool) {
        self.early = !waiting;
        if waiting {
            self.grace = ACK_GRACE;
        }
    }

    /// This side sends a request: an ACK sent early since was needless.
    pub(crate) fn posted(&mut self) {
        if self.early {
            self.early = false;
            self.grace = (self.grace * 2).min(ACK_DELAY);
        }
    }

    /// A request of the peer's arrived: it may have waited for an ACK sent early since.
    pub(crate) fn peer_posted(&mut self) {
        if self.early {
            self.early = false;
            self.grace = ACK_GRACE;
        }
    }

    /// Whether an ACK sent early waits for its verdict.
    pub(crate) fn early(&self) -> bool {
        self.early
    }

    pub(crate) fn due(&self, now: u64) -> bool {
        self.held_for(now, ACK_DELAY)
    }

    /// True when one is held and has been for at least `d` at `now`.
    pub(crate) fn held_for(&self, now: u64, d: u64) -> bool {
        self.since.is_some_and(|t| now.saturating_sub(t) >= d)
    }

    /// When the held acknowledgement (if any) is due.
    pub(crate) fn due_at(&self) -> Option<u64> {
        self.since.map(|t| t.saturating_add(ACK_DELAY))
    }

    /// Note whether the transport holds one after a drive at `now`.
    pub(crate) fn note(&mut self, holds: bool, now: u64) {
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
    pub(crate) fn limit_reached(&self, id: u32) {
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

/// A QP as the endpoint holds it.
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
    pub(crate) deadline: AtomicU64,
    /// `AsyncEvent::QpAccessError` was reported for it.
    pub(crate) violation_reported: AtomicBool,
    /// `AsyncEvent::QpFatal` was reported for it.
    pub(crate) fatal_reported: AtomicBool,
    /// Send work requests posted while the QP was held (see `inbox.rs`).
    pub(crate) inbox: Mutex<Inbox>,
    /// Requests waiting in `inbox` (read without its lock).
    pub(crate) inbox_len: AtomicUsize,
    /// The QP is in the endpoint's pending-transmit queue for its inbox.
    pub(crate) inbox_queued: AtomicBool,
    /// Send-queue slots taken: requests in the send queue and in the inbox (never below the
    /// true count; slots of completed requests are given back under the lock).
    pub(crate) sq_used: AtomicU32,
    /// The send queue's depth (`max_send_wr`).
    pub(crate) sq_depth: u32,
}

/// A locked QP ([`QpCell::lock`]): its body; unlocking publishes the transport's next
/// deadline for the timer scan.
#[derive(Debug)]
pub struct QpGuard<'a> {
    body: MutexGuard<'a, QpBody>,
    cell: &'a QpCell,
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
        if self.cell.deadline.load(Ordering::Relaxed) != t {
            self.cell.deadline.store(t, Ordering::SeqCst);
        }
        // What a poster checks its requests against while another thread holds the QP.
        self.cell.publish_rules(&mut self.body);
        self.cell.sync_sq_slots(&mut self.body);
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
        let sq_depth = u32::try_from(qp.send_queue_capacity()).unwrap_or(u32::MAX);
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
                last_post: 0,
                sq_counted: 0,
                rules_published: None,
            }),
            send_cq,
            recv_cq,
            srq,
            deadline: AtomicU64::new(u64::MAX),
            violation_reported: AtomicBool::new(false),
            fatal_reported: AtomicBool::new(false),
            inbox: Mutex::new(Inbox::default()),
            inbox_len: AtomicUsize::new(0),
            inbox_queued: AtomicBool::new(false),
            sq_used: AtomicU32::new(0),
            sq_depth,
        }
    }

    /// Lock the mutable half (a poisoned lock is taken over: the state is still consistent
    /// because the transport never panics midway).
    pub fn lock(&self) -> QpGuard<'_> {
        QpGuard {
            body: self.body.lock().unwrap_or_else(|e| e.into_inner()),
            cell: self,
        }
    }

    /// [`QpCell::lock`] when nobody holds the lock.
    pub fn try_lock(&self) -> Option<QpGuard<'_>> {
        let body = match self.body.try_lock() {
            Ok(b) => b,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(QpGuard { body, cell: self })
    }

    /// The transport's next deadline as last published (`u64::MAX`: none).
    pub(crate) fn deadline(&self) -> u64 {
        self.deadline.load(Ordering::Relaxed)
    }
}

/// A QP's transmit batch for packets of up to `max` bytes: room for one full GSO datagram
/// plus a packet (the arena is zero pages until used, so small-MTU QPs that never fill it do
/// not pay for it).
pub fn qp_tx_batch(max: usize) -> TxBatch {
    TxBatch::new(64, MAX_DATAGRAM + max)
}
