//! The device's tunables in one place, as rxe keeps its in `rxe_param.h`: the transport's
//! windows and timers, the device core's budgets, and the engine's polling heuristics. Each
//! module uses (and, where they are part of its API, re-exports) the values it needs; the
//! reasons for each value are in its doc. Limits a device is configured with at run time
//! (QPs, CQ entries, the send window) are in [`crate::verbs::DeviceConfig`] instead, and the
//! memory table's in [`crate::mem::MemConfig`].

// The transport (rc).

/// Most PSNs the requester keeps unacknowledged (as rxe's window).
pub const MAX_INFLIGHT_PSNS: i32 = 128;

/// The requester sets AckReq at least every this many packets of a long message (rxe's
/// `RXE_MAX_PKT_PER_ACK`).
pub const ACK_REQ_EVERY: u32 = 64;

/// How long a responder waits before acknowledging requests executed without AckReq (the
/// requester did not ask; a later requested ACK usually covers them first). Far below any
/// retransmission timeout in use (IB timeout 5, 131 us, and up; the default is 14, 67 ms).
pub const LAZY_ACK_NS: u64 = 100_000;

/// Largest message (2^31 bytes, `max_msg_sz`).
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Largest `max_rd_atomic` / `max_dest_rd_atomic` accepted (`max_qp_rd_atom` of the device).
pub const MAX_RD_ATOMIC: u8 = 16;

/// Most scatter/gather entries a work request may carry (the QP's `max_send_sge`/`max_recv_sge`
/// cap). Kept inline in the work queue entry so posting never allocates.
pub const MAX_SGE: usize = 8;

/// PSNs the window can hold ahead of its base (a power of two dividing 2^24).
pub const PSN_SET_WINDOW: u32 = 4096;

/// How far ahead of the expected PSN a request may be and still draw a NAK-sequence (a
/// packet lost in a requester's window makes the next ones arrive at most a window ahead:
/// rxe's window is 128 PSNs, a softrdma device's 1024). Farther requests are dropped and
/// counted.
pub const NAK_SEQ_WINDOW: i32 = 1024;

/// The send window (PSNs) right after a retransmission timeout.
pub const RESTART_WINDOW: i32 = 8;

/// Most hole re-requests queued at once (more holes wait for the timeout's go-back-N).
pub const MAX_REREQUESTS: usize = 64;

/// How long a requester waits before looking again at a suspended local region.
pub const LOCAL_SUSPEND_WAIT_NS: u64 = 50_000;

/// Payloads shorter than this are copied (a copy of a few hundred bytes costs less than
/// another `iovec` and the region's lend count).
pub const LEND_MIN: usize = 1024;

/// Most pieces (SGEs) of one packet's payload that are lent; a payload in more pieces is
/// copied (this bounds a GSO datagram's `iovec` count well under the kernel's 1024).
pub const LEND_MAX_PIECES: usize = 4;

// The device core (net::endpoint).

/// Answers (READ response packets, acknowledgements) a QP sends per drive at most: a READ
/// response stream of up to 2 GiB (16 of them outstanding) is sent a slice at a time, the
/// rest from the endpoint's pending-transmit queue, round-robin with the device's other QPs
/// and with receiving, so that no drive holds the receive path or a QP lock for long.
/// 64 packets are 256 KiB at a 4096-byte MTU, about 50-100 us of copying here.
pub const RESPONSE_BUDGET: usize = 64;

/// Times one drive of a QP moves requests posted meanwhile through its inbox into its send
/// queue and sends them (each round's send is when other threads post through the inbox);
/// requests posted after the last round reach the pending-transmit queue instead.
pub const INBOX_ROUNDS: usize = 4;

/// How long a held acknowledgement may wait for a newer one to replace it (busy-poll mode).
pub const ACK_DELAY: u64 = 15_000;

/// How long a held acknowledgement waits for the application's answer to carry it once the
/// application polls and finds nothing (busy-poll mode, ns). A poll that finds nothing means
/// the application has taken what arrived and waits for more, perhaps for this very
/// acknowledgement's counterpart: a peer whose send completes only with it (UCX's zero-copy
/// sends, every request of perftest's latency tests) and that holds back, in turn, the ACK
/// this side waits for. A ping-pong's answer is posted well within it (perftest's in under
/// 1 us), so its ACK still rides along.
pub const ACK_GRACE: u64 = 2_000;

/// After a scan of the QPs' timers, the next waits at least this long per QP of the device
/// (ns).
pub const TIMER_SLACK_PER_QP: u64 = 50;

/// With no timer pending, the QPs' timers are looked at again after this long: a safety net
/// only, since arming a timer lowers the device's next deadline (and wakes the driver when it
/// sleeps past it).
pub const TIMER_SCAN: u64 = 50_000_000;

// The engine's polling heuristics (net::engine).

pub const RX_BATCH: usize = 32;

/// In busy-poll mode, pollers count as active for this long (ns) after their last progress
/// call or post; meanwhile the engine thread only runs timers. It is longer than a long post
/// list takes to transmit (1 MiB is about half a millisecond of copying), so that the engine
/// thread does not take over the receive path between a busy thread's posts and polls.
pub const POLLER_ACTIVE: u64 = 1_000_000;

/// How often active pollers push the engine thread's wake-up back (ns).
pub const WAKER_PUSH: u64 = 1_000_000;

/// How far ahead pollers set the engine thread's wake-up (ns): it fires WAKER_DELAY -
/// WAKER_PUSH to WAKER_DELAY after they went quiet, and then the thread takes over (an
/// application that polls in busy-poll mode less often than that leaves incoming requests to
/// its polls meanwhile: blocking mode suits it better). It lies beyond the scheduler tick on
/// purpose: a timer that becomes a CPU's earliest makes the kernel reprogram the CPU's timer
/// device, which in a virtual machine is an exit to the hypervisor (here 18 us per
/// `timerfd_settime` at 1.5 ms, 0.7-0.8 us at 5 ms or more), and a poller would pay it every
/// push.
pub const WAKER_DELAY: u64 = 5_000_000;

/// How soon the engine thread tries again when pollers had gone quiet but one still held the
/// receive path (inside a long receive).
pub const ENGINE_RETRY: u64 = 2_000_000;

/// Busy-poll mode: after a poll's receive that emptied the socket, the next
/// [`DRAIN_SKIPS`] polls that find their CQ empty, within this long (ns, from the start of
/// that poll) and before the application posts, do not look at the socket again. An
/// application drains its CQ after a message (polls until empty, often twice over:
/// libfabric's RxM polls its one CQ twice more before it answers, 1-2 us after the receive
/// began) and each such look was a system call that found nothing on the way to its answer,
/// where polling a NIC's CQ costs nothing; what arrives meanwhile waits for two cheap polls
/// of a tight loop, or at most this long.
pub const DRAIN_SKIP: u64 = 5_000;

/// Empty polls after a draining receive that skip the socket (see [`DRAIN_SKIP`]).
pub const DRAIN_SKIPS: u32 = 2;

/// Busy-poll mode, once the engine thread has found packets nobody polled for (the
/// application waits by spinning on memory, as `ib_write_lat` does): the thread watches the
/// socket and takes a datagram when no application thread has polled a CQ for this long (ns).
pub const SPINNER_GRACE: u64 = 30_000;

/// Wake-ups for a datagram a poller took after all, in a row, after which the engine thread
/// stops watching the socket for memory-spinning applications (the pollers receive again).
pub const SPINNER_SKIPS: u32 = 8;

/// Take-overs in a row (pollers quiet for POLLER_ACTIVE, the waker fired) that found datagrams
/// waiting, after which the engine thread watches the socket for a memory-spinning
/// application: such an application stalls every round trip, a one-off (a connection set up,
/// an application pausing) does not.
pub const SPINNER_TAKEOVERS: u32 = 3;

/// Busy-poll mode: polls that found nothing, between two that found datagrams waiting since
/// more than SPINNER_GRACE after the application's previous poll, above which the poller is
/// taken for a busy one that was off its CPU rather than an application that polls only now
/// and then (`Engine::note_find`).
pub const RARE_POLLER_EMPTY_MAX: u32 = 64;

/// Busy-poll mode: such late finds in a row after which the engine thread watches the socket
/// for an application that polls only now and then (`Engine::note_find`).
pub const RARE_POLLER_FINDS: u32 = 8;

/// Posts one QP leaves for the poster's next poll at most ([`Engine::post_done`](crate::net::Engine::post_done)); the next
/// one transmits them all.
pub const DOORBELL_MAX: u32 = 128;

/// Busy-poll mode, when the engine thread receives because no application thread polls: it
/// keeps receiving until this long (ns) passes without a datagram before it sleeps again
/// (`Engine::spin_receive`).
pub const ENGINE_SPIN: u64 = 50_000;

/// The longest the engine thread receives in one spin before it looks at timers and the rest
/// of its loop again (ns).
pub const ENGINE_SPIN_MAX: u64 = 2_000_000;

/// Rounds in which the engine thread, sending posts left for a poll, tries again a QP whose
/// lock was taken.
pub const DOORBELL_RETRIES: usize = 8;

/// Posts left for a poll ([`Engine::post_done`](crate::net::Engine::post_done)): the engine thread looks at them this often
/// (ns), and sends them once no application thread has polled for this long. Waking it for
/// every burst instead (tens of thousands of times a second on a machine whose cores two
/// spinning processes already fill) cost a third of a 64 B message rate.
pub const DOORBELL_GRACE: u64 = 60_000;

/// The longest nap between two looks at posts left for a poll while an active poller keeps
/// sending them itself (ns): the most a poster that stops polling in the middle of a stream
/// waits for them, beyond DOORBELL_GRACE.
pub const DOORBELL_NAP_MAX: u64 = 480_000;

/// The longest the engine thread sleeps (ns): a safety net (`stop` wakes it).
pub const ENGINE_IDLE: u64 = 50_000_000;

/// [`crate::verbs::Cq::poll_spinning`] yields the CPU on every `YIELD_EVERY`-th empty poll
/// of a thread (counted, never reset). A yield is a system call: after every empty poll it
/// delayed a completion that arrived meanwhile by its length, and a spinning application
/// (perftest) polls back to back.
pub const YIELD_EVERY: u32 = 16;
