//! A seeded faulty network: latency with jitter, loss, duplication, reordering (extra
//! delay), corruption of a random bit (the receiver's ICRC check must catch it) and
//! partitions between endpoints over intervals of virtual time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use softrdma::wire::IcrcContext;

use crate::rng::Rng;

/// Fault rates (probabilities per packet) and delays (ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faults {
    /// Drop.
    pub loss: f64,
    /// Deliver a second copy later.
    pub duplicate: f64,
    /// Delay by up to `reorder_delay_ns` extra, so later packets overtake it.
    pub reorder: f64,
    /// Flip one random bit.
    pub corrupt: f64,
    /// One-way latency.
    pub latency_ns: u64,
    /// Uniform jitter added to the latency (keeps order when smaller than packet spacing).
    pub jitter_ns: u64,
    /// Largest extra delay of a reordered packet.
    pub reorder_delay_ns: u64,
}

impl Faults {
    /// A perfect link with 1 us latency.
    pub const NONE: Faults = Faults {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        latency_ns: 1_000,
        jitter_ns: 0,
        reorder_delay_ns: 0,
    };
    /// Sum of the fault probabilities.
    pub fn total(&self) -> f64 {
        self.loss + self.duplicate + self.reorder + self.corrupt
    }
}

/// Endpoints `a` and `b` cannot reach each other during `[from, until)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// One side.
    pub a: usize,
    /// The other side.
    pub b: usize,
    /// Start (ns).
    pub from: u64,
    /// End (ns); `u64::MAX` for ever.
    pub until: u64,
}

/// What the network did to one packet, by its send number (see [`Network::log`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// Dropped when offered (loss, or [`Network::drop_nth`]).
    Lost(u64),
    /// A copy dropped by a partition (when offered, or when it was due).
    Partitioned(u64),
    /// A second copy was queued.
    Duplicated(u64),
    /// Delayed so that later packets overtake it.
    Reordered(u64),
    /// A bit of the first copy was flipped.
    Corrupted(u64),
}

/// A packet in flight.
#[derive(Debug)]
pub struct InFlight {
    /// Arrival time.
    pub at: u64,
    seq: u64,
    /// The packet's send number (1-based, [`NetStats::sent`] when it was offered); a
    /// duplicate carries its original's.
    pub id: u64,
    /// True for a copy that may arrive out of the path's order: the second copy of a
    /// duplicated packet, or a reordered packet.
    pub late: bool,
    /// Sending endpoint.
    pub src: usize,
    /// Receiving endpoint.
    pub dst: usize,
    /// The IP/UDP context it travels in (what the receiver's headers say).
    pub icrc: IcrcContext,
    /// The UDP payload.
    pub data: Vec<u8>,
    /// Whether a bit was flipped, and whether only in the BTH byte the ICRC masks.
    pub corrupted: Option<bool>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: the heap pops the earliest.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// What the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Packets offered.
    pub sent: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Dropped by a partition.
    pub partitioned: u64,
    /// Extra copies.
    pub duplicated: u64,
    /// Delayed out of order.
    pub reordered: u64,
    /// Bits flipped.
    pub corrupted: u64,
    /// Delivered to an endpoint.
    pub delivered: u64,
}

/// The network.
#[derive(Debug)]
pub struct Network {
    heap: BinaryHeap<InFlight>,
    seq: u64,
    rng: Rng,
    /// Fault rates.
    pub faults: Faults,
    /// Partitions.
    pub partitions: Vec<Partition>,
    /// Counters.
    pub stats: NetStats,
    /// Drop the packets with these 1-based send numbers (for scenario tests).
    pub drop_nth: Vec<u64>,
    /// When set, every packet offered is recorded here first (sender, UDP payload), like a
    /// capture taken at the senders.
    pub tap: Option<Vec<(usize, Vec<u8>)>>,
    /// When set, every fault is recorded here with the send number of its packet (a
    /// workload drains it to account for each packet).
    pub log: Option<Vec<NetEvent>>,
    /// Latest arrival per (src, dst) path: a path keeps FIFO order except for reordered packets.
    last_arrival: std::collections::HashMap<(usize, usize), u64>,
    pool: Vec<Vec<u8>>,
}

impl Network {
    /// A network with these faults, driven by `rng`.
    pub fn new(rng: Rng, faults: Faults) -> Network {
        Network {
            heap: BinaryHeap::new(),
            seq: 0,
            rng,
            faults,
            partitions: Vec::new(),
            stats: NetStats::default(),
            drop_nth: Vec::new(),
            tap: None,
            log: None,
            last_arrival: Default::default(),
            pool: Vec::new(),
        }
    }

    fn cut(&self, a: usize, b: usize, t: u64) -> bool {
        self.partitions.iter().any(|p| {
            ((p.a == a && p.b == b) || (p.a == b && p.b == a)) && p.from <= t && t < p.until
        })
    }

    fn note(&mut self, e: NetEvent) {
        if let Some(l) = &mut self.log {
            l.push(e);
        }
    }

    /// Put copy `id` of a packet (`bytes`, flipping one bit when `corrupted` is set) in flight
    /// from `r.src` to `r.dst`, arriving at `at`; `late` marks a reordered or duplicated copy.
    fn enqueue(
        &mut self,
        at: u64,
        r: Route,
        bytes: &[u8],
        corrupted: Option<bool>,
        id: u64,
        late: bool,
    ) {
        let Route { src, dst, icrc } = r;
        let mut data = self.pool.pop().unwrap_or_default();
        data.clear();
        data.extend_from_slice(bytes);
        if corrupted.is_some() {
            let bit = self.rng.below(data.len() as u64 * 8) as usize;
            data[bit / 8] ^= 1 << (bit % 8);
            let masked = bit / 8 == 4;
            self.seq += 1;
            self.heap.push(InFlight {
                at,
                seq: self.seq,
                id,
                late,
                src,
                dst,
                icrc,
                data,
                corrupted: Some(masked),
            });
            return;
        }
        self.seq += 1;
        self.heap.push(InFlight {
            at,
            seq: self.seq,
            id,
            late,
            src,
            dst,
            icrc,
            data,
            corrupted: None,
        });
    }

    /// Offer a packet at time `now`; returns its send number (1-based).
    pub fn send(
        &mut self,
        now: u64,
        src: usize,
        dst: usize,
        icrc: IcrcContext,
        bytes: &[u8],
    ) -> u64 {
        self.stats.sent += 1;
        let id = self.stats.sent;
        if let Some(t) = &mut self.tap {
            t.push((src, bytes.to_vec()));
        }
        let f = self.faults;
        if self.cut(src, dst, now) {
            self.stats.partitioned += 1;
            self.note(NetEvent::Partitioned(id));
            return id;
        }
        if self.drop_nth.contains(&self.stats.sent) || self.rng.chance(f.loss) {
            self.stats.lost += 1;
            self.note(NetEvent::Lost(id));
            return id;
        }
        let mut at = now
            + f.latency_ns
            + if f.jitter_ns > 0 {
                self.rng.below(f.jitter_ns)
            } else {
                0
            };
        let last = self.last_arrival.entry((src, dst)).or_insert(0);
        at = at.max(*last);
        *last = at;
        let reordered = self.rng.chance(f.reorder);
        if reordered {
            self.stats.reordered += 1;
            self.note(NetEvent::Reordered(id));
            at += 1 + self.rng.below(f.reorder_delay_ns.max(1));
        }
        let corrupt = self.rng.chance(f.corrupt);
        if corrupt {
            self.stats.corrupted += 1;
            self.note(NetEvent::Corrupted(id));
        }
        let c = corrupt.then_some(false);
        let route = Route { src, dst, icrc };
        self.enqueue(at, route, bytes, c, id, reordered);
        if self.rng.chance(f.duplicate) {
            self.stats.duplicated += 1;
            self.note(NetEvent::Duplicated(id));
            let later = at + 1 + self.rng.below(f.reorder_delay_ns.max(f.latency_ns).max(1));
            self.enqueue(later, route, bytes, None, id, true);
        }
        id
    }

    /// When the next packet arrives.
    pub fn next_arrival(&self) -> Option<u64> {
        self.heap.peek().map(|p| p.at)
    }

    /// Take the next packet due at or before `now` (dropping it if a partition now cuts its path).
    pub fn pop_due(&mut self, now: u64) -> Option<InFlight> {
        while self.heap.peek().is_some_and(|p| p.at <= now) {
            let p = self.heap.pop()?;
            if self.cut(p.src, p.dst, p.at) {
                self.stats.partitioned += 1;
                self.note(NetEvent::Partitioned(p.id));
                self.recycle(p.data);
                continue;
            }
            self.stats.delivered += 1;
            return Some(p);
        }
        None
    }

    /// Give a packet buffer back for reuse.
    pub fn recycle(&mut self, v: Vec<u8>) {
        if self.pool.len() < 4096 {
            self.pool.push(v);
        }
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.heap.len()
    }
}

/// Where a packet goes in the simulated network: from node `src` to node `dst`, with the ICRC
/// context of that path.
#[derive(Clone, Copy, Debug)]
struct Route {
    src: usize,
    dst: usize,
    icrc: IcrcContext,
}
