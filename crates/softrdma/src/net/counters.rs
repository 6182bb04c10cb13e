//! The device's datapath counters, readable at run time like a NIC's: the endpoint counts
//! packets, the engine its thread's wake-ups.

use std::sync::atomic::AtomicU64;

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
    /// port than the one latched (see [`QpBody::peer_src_port`](crate::net::QpBody::peer_src_port)).
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
    /// ([`Engine::post_done`](crate::net::Engine::post_done)).
    pub posts_deferred: AtomicU64,
    /// Send work requests posted while another thread held the QP, queued in its inbox
    /// instead of waiting for the lock (see `net::endpoint::inbox`).
    pub posts_inboxed: AtomicU64,
    /// Requests from an inbox that the QP no longer took when they reached it (it was reset
    /// or modified meanwhile by another thread).
    pub posts_dropped: AtomicU64,
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
