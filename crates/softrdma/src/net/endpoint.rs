//! The device core, sans-IO: everything a device does with packets except moving them.
//!
//! An [`Endpoint`] owns the QP table and demultiplexing, the peer check, ICRC verification
//! with IPv4-identification solving, the acknowledgement policy, the transmit loop (building
//! each QP's packets into its [`TxBatch`], lending payloads, fixing the ICRCs of GSO
//! segments), the pending-transmit queue, the timer scan and the events (completions to the
//! CQs, SRQ limits, access violations). It reads no clock and owns no socket: time comes in
//! as an argument, and batches go out through an [`EndpointIo`] its driver passes to every
//! call that may send. The engine ([`crate::net::Engine`]) is one driver: a UDP socket or a
//! memory network's port, a real or virtual clock, a thread and the polling heuristics.
//!
//! The code: this file holds the endpoint and its QP table; `qp.rs` a QP as the endpoint
//! holds it; `receive.rs` verification, demultiplexing and the peer check; `transmit.rs`
//! driving a QP's transport into its batch, the pending-transmit queue and held
//! acknowledgements; `timers.rs` the timer scan; `teardown.rs` the QPs an invalidated region
//! ends; `verbs.rs` what the verbs do to a QP (modify, post, destroy).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::async_event::AsyncEvents;
use super::counters::EngineCounters;
use super::udp::TxBatch;
use crate::mem::MemoryTable;
pub use crate::params::{ACK_DELAY, RESPONSE_BUDGET};
use crate::params::{TIMER_SCAN, TIMER_SLACK_PER_QP};
use crate::wire::{AddressVector, IcrcPrefix, IdDeltas};

mod inbox;
mod qp;
mod receive;
mod teardown;
mod timers;
mod transmit;
mod verbs;

pub use inbox::Inbox;
pub use qp::{QpBody, QpCell, QpGuard, SrqCore, SrqLimitHook, qp_tx_batch};
pub(crate) use teardown::Gone;
pub use transmit::fix_icrc_for_id;

/// What an endpoint needs from its driver: the clock, a way to send, and a way to be called
/// back. Passed to every endpoint call that may send or queue work, so that the endpoint
/// itself does no I/O (a test drives it with a recording sink and a hand-set clock).
pub trait EndpointIo {
    /// The clock (ns), read where one call spans much work (serving the pending-transmit
    /// queue, a timer scan).
    fn now(&self) -> u64;
    /// Send a batch's datagrams; the batch is empty afterwards, sent or not (the transport
    /// recovers lost packets).
    fn send(&self, tx: &mut TxBatch) -> io::Result<()>;
    /// Work was queued that a later pass serves (answers left over, a region to tear down):
    /// a driver asleep should wake.
    fn wake(&self);
    /// The device's earliest deadline fell to `t` (engine clock): a driver asleep past it
    /// should wake.
    fn deadline_lowered(&self, t: u64);
}

/// What the receive path keeps between packets (the driver holds it under its receive lock,
/// so that one QP's packets are handled in arrival order).
#[derive(Debug)]
pub struct RxWork {
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
    /// The QP whose packets last took a receive: the next idle poll warms the cache for its
    /// next receive buffer (`Endpoint::warm_next_recv`).
    warm_recv: Option<u32>,
}

impl Default for RxWork {
    fn default() -> RxWork {
        RxWork {
            deltas: IdDeltas::default(),
            icrc: None,
            pending: Vec::with_capacity(64),
            pending_due: u64::MAX,
            last_qp: None,
            warm_recv: None,
        }
    }
}

impl RxWork {
    /// When the earliest acknowledgement held on this receive path falls due (None: none is
    /// held).
    pub fn held_ack_due(&self) -> Option<u64> {
        (!self.pending.is_empty()).then_some(self.pending_due)
    }

    /// Let go of the cached QP (it may have left the table).
    pub fn forget_last_qp(&mut self) {
        self.last_qp = None;
    }
}

/// One device's core: its QPs and what they share.
#[derive(Debug)]
pub struct Endpoint {
    local: SocketAddr,
    mem: Arc<MemoryTable>,
    gso: bool,
    qps: RwLock<HashMap<u32, Arc<QpCell>>>,
    /// Bumped on every change of `qps` (invalidates the receive path's cached QP).
    qp_gen: AtomicU64,
    /// When the QPs' timers are next looked at (ns on the engine clock): the earliest
    /// deadline, or a rescan interval when none is pending.
    next_timer: AtomicU64,
    /// QPs with answers left over from a drive that spent its budget, or posts left for a
    /// poll, served a budget at a time, round-robin, by whoever drives the device.
    tx_pending: Mutex<VecDeque<Arc<QpCell>>>,
    /// `tx_pending`'s length (read without the lock).
    tx_pending_len: AtomicUsize,
    /// Regions invalidated, waiting for the driver to tear down their users.
    invalidated: Mutex<Vec<Gone>>,
    invalidations_pending: AtomicBool,
    /// Asynchronous events for the application.
    pub events: AsyncEvents,
    /// Counters.
    pub counters: EngineCounters,
}

impl Endpoint {
    /// An endpoint for a device bound to `local`, sending GSO datagrams when `gso` is set.
    pub fn new(local: SocketAddr, mem: Arc<MemoryTable>, gso: bool) -> Endpoint {
        Endpoint {
            local,
            mem,
            gso,
            qps: RwLock::new(HashMap::new()),
            qp_gen: AtomicU64::new(0),
            next_timer: AtomicU64::new(0),
            tx_pending: Mutex::new(VecDeque::new()),
            tx_pending_len: AtomicUsize::new(0),
            invalidated: Mutex::new(Vec::new()),
            invalidations_pending: AtomicBool::new(false),
            events: AsyncEvents::default(),
            counters: EngineCounters::default(),
        }
    }

    /// The local address.
    pub fn local_ip(&self) -> IpAddr {
        self.local.ip()
    }

    /// The memory table.
    pub fn mem(&self) -> &Arc<MemoryTable> {
        &self.mem
    }

    /// The address vector from this device to the device at `peer` (which listens on the
    /// same UDP port as this one: a device sends from the port it listens on).
    pub fn av_to(&self, peer: IpAddr) -> AddressVector {
        let port = self.local.port();
        AddressVector::new(self.local.ip(), peer, port, port)
    }

    /// Register a QP for demultiplexing.
    pub fn add_qp(&self, cell: Arc<QpCell>) {
        cell.lock().tx.set_gso(self.gso);
        let mut qps = self.qps.write().unwrap_or_else(|e| e.into_inner());
        qps.insert(cell.qpn, cell);
        self.qp_gen.fetch_add(1, Ordering::Release);
    }

    /// Forget a QP (a receive path's cached reference to it goes at its next packet, or
    /// with [`RxWork::forget_last_qp`]).
    pub fn remove_qp(&self, qpn: u32) -> Option<Arc<QpCell>> {
        let mut qps = self.qps.write().unwrap_or_else(|e| e.into_inner());
        let cell = qps.remove(&qpn);
        self.qp_gen.fetch_add(1, Ordering::Release);
        cell
    }

    /// The QP with this number, if the device has it.
    pub(crate) fn cell(&self, qpn: u32) -> Option<Arc<QpCell>> {
        self.qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn)
            .cloned()
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
}

#[cfg(test)]
mod tests;
