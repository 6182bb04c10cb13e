//! Whole devices on a simulated network: [`DeviceNet`] opens `softrdma::verbs` devices on a
//! [`MemoryNet`] with a shared virtual clock and no engine threads, and moves their datagrams
//! through seeded [`Faults`]. Unlike [`crate::World`], which drives bare transport QPs, this
//! runs the device's whole datapath: demultiplexing and the peer check, ICRC verification
//! with IPv4-identification solving, held acknowledgements (busy-poll mode), GSO datagrams
//! and payloads lent from registered memory. A GSO datagram may also be split into its
//! segments in flight (`split`), as a receiver without GRO sees it: each segment then carries
//! the identification of a lone datagram, and the receiver must solve for the one its ICRC
//! was computed with.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use softrdma::net::{Clock, Datagram, MemoryNet};
use softrdma::verbs::{Device, DeviceConfig, PinMode, PollMode, VerbsError, WatchMode};

use crate::{Faults, Rng};

/// What the network did, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceNetStats {
    /// Datagrams sent by the devices.
    pub sent: u64,
    /// Delivered (copies included).
    pub delivered: u64,
    /// Dropped by the loss fault.
    pub lost: u64,
    /// Extra copies.
    pub duplicated: u64,
    /// Delayed past later ones.
    pub reordered: u64,
    /// One bit flipped.
    pub corrupted: u64,
    /// GSO datagrams split into their segments.
    pub split: u64,
    /// Datagrams for an address no device has.
    pub unroutable: u64,
}

/// Picks datagrams to drop ([`DeviceNet::drop_if`]).
pub type DropFilter = Box<dyn FnMut(&Datagram) -> bool>;

/// Devices on one seeded network with one virtual clock.
pub struct DeviceNet {
    net: Arc<MemoryNet>,
    clock: Arc<AtomicU64>,
    rng: Rng,
    faults: Faults,
    /// Probability that a GSO datagram is split into its segments.
    pub split: f64,
    in_flight: Vec<(u64, u64, Datagram)>,
    seq: u64,
    devices: Vec<Device>,
    /// Drops the datagrams it picks (before any other fault): a scenario's targeted loss.
    pub drop_if: Option<DropFilter>,
    /// The longest step of the clock when nothing moved (1 ms by default; the time between
    /// two polls of an application that spins on its CQs, when it matters when they come).
    pub max_step_ns: u64,
    /// What the network did.
    pub stats: DeviceNetStats,
}

impl DeviceNet {
    /// An empty network; `seed` decides every fault.
    pub fn new(seed: u64, faults: Faults) -> DeviceNet {
        DeviceNet {
            net: MemoryNet::new(),
            clock: Arc::new(AtomicU64::new(1)),
            rng: Rng::new(seed),
            faults,
            split: 0.0,
            in_flight: Vec::new(),
            seq: 0,
            devices: Vec::new(),
            drop_if: None,
            max_step_ns: 1_000_000,
            stats: DeviceNetStats::default(),
        }
    }

    /// Virtual nanoseconds now.
    pub fn now(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Move the virtual clock `ns` on without driving anything (an application's own work
    /// between two verbs).
    pub fn advance(&mut self, ns: u64) {
        self.clock.fetch_add(ns, Ordering::AcqRel);
    }

    /// Open a busy-poll device at `ip` (UDP port 4791, GSO on, on-demand pinning, no
    /// watcher thread), driven by [`DeviceNet::run_until`].
    pub fn open(&mut self, ip: IpAddr) -> Result<Device, VerbsError> {
        let mut cfg = DeviceConfig::new(ip);
        cfg.mode = PollMode::BusyPoll;
        cfg.pin_mode = PinMode::OnDemand;
        cfg.watch = WatchMode::Off;
        cfg.gso = true;
        let dev = Device::open_on(cfg, &self.net, Clock::Manual(Arc::clone(&self.clock)))?;
        self.devices.push(dev.clone());
        Ok(dev)
    }

    /// Drive every device, move datagrams, and advance the clock until `done` holds (checked
    /// after every pass) or `limit_ns` of virtual time passed. Returns whether `done` held.
    pub fn run_until(
        &mut self,
        limit_ns: u64,
        mut done: impl FnMut(&mut DeviceNet) -> bool,
    ) -> bool {
        let end = self.now().saturating_add(limit_ns);
        let mut same_instant = 0;
        loop {
            if done(self) {
                return true;
            }
            let now = self.now();
            if now >= end {
                return false;
            }
            let mut next = u64::MAX;
            let mut work = 0;
            for d in self.devices.clone() {
                let (n, due) = d.drive();
                work += n;
                if let Some(t) = due {
                    next = next.min(t);
                }
            }
            for d in self.net.take_sent() {
                self.stats.sent += 1;
                work += 1;
                self.launch(d);
            }
            work += self.deliver_due(now);
            if let Some(t) = self.in_flight.iter().map(|f| f.0).min() {
                next = next.min(t);
            }
            // Work at this instant: another pass at the same instant (bounded, so that a
            // device that keeps finding work cannot stop the clock).
            if work > 0 && same_instant < 256 {
                same_instant += 1;
                continue;
            }
            same_instant = 0;
            // Nothing moved: time passes to the next thing due (at least 1 us, at most
            // `max_step_ns`, so that work a device does not announce, such as a post left for a
            // poll, runs).
            let step = self.max_step_ns.max(1);
            let to = next.clamp(now + step.min(1_000), now + step).min(end);
            self.clock.store(to, Ordering::Release);
        }
    }

    /// Move every datagram sent so far straight into its destination's inbox (its socket
    /// buffer), without faults and without driving any device: what an application's next
    /// poll would find waiting. Returns how many were delivered.
    pub fn deliver_sent(&mut self) -> usize {
        let mut n = 0;
        for d in self.net.take_sent() {
            self.stats.sent += 1;
            if self.net.deliver(d) {
                self.stats.delivered += 1;
                n += 1;
            } else {
                self.stats.unroutable += 1;
            }
        }
        n
    }

    /// Give datagram `d` its fate: lost, corrupted, split, duplicated, delayed.
    fn launch(&mut self, d: Datagram) {
        if self.drop_if.as_mut().is_some_and(|f| f(&d)) || self.rng.chance(self.faults.loss) {
            self.stats.lost += 1;
            return;
        }
        let parts = if d.data.len() > d.segment && self.rng.chance(self.split) {
            self.stats.split += 1;
            d.split()
        } else {
            vec![d]
        };
        for mut p in parts {
            if self.rng.chance(self.faults.corrupt) && !p.data.is_empty() {
                let bit = self.rng.below(p.data.len() as u64 * 8);
                p.data[(bit / 8) as usize] ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
            }
            let copies = if self.rng.chance(self.faults.duplicate) {
                self.stats.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                let mut delay = self.faults.latency_ns + self.rng.below(self.faults.jitter_ns + 1);
                if self.rng.chance(self.faults.reorder) {
                    self.stats.reordered += 1;
                    delay += self.rng.below(self.faults.reorder_delay_ns + 1);
                }
                self.seq += 1;
                self.in_flight
                    .push((self.now() + delay, self.seq, p.clone()));
            }
        }
    }

    /// Deliver what is due by `now`, in order of arrival time. Returns how many.
    fn deliver_due(&mut self, now: u64) -> usize {
        let (mut due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|f| f.0 <= now);
        self.in_flight = keep;
        due.sort_by_key(|f| (f.0, f.1));
        let n = due.len();
        for (_, _, d) in due {
            if self.net.deliver(d) {
                self.stats.delivered += 1;
            } else {
                self.stats.unroutable += 1;
            }
        }
        n
    }
}
