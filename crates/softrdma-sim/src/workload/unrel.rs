//! What the UD and UC workloads share: the seed's network, the report, the ledger that
//! follows every packet through the network (each copy accounted for once), the run loop,
//! the checks of every step, and posting.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use softrdma::mem::Access;
use softrdma::rc::unreliable::grh_source;
use softrdma::rc::{
    GRH_LEN, PostError, QpCounters, RecvWr, SendFlags, SendWr, Sge, UdDest, UnrelCounters,
    WorkCompletion, WrOpcode,
};
use softrdma::wire::HeaderRepr;

use crate::net::{Faults, NetEvent, NetStats, Partition};
use crate::rng::Rng;
use crate::world::{Fate, QpRef, TraceEvent, World};

/// What one UD or UC seed did.
#[derive(Clone, Debug, Default)]
pub struct UnrelReport {
    /// The seed.
    pub seed: u64,
    /// Datagrams (UD) or messages (UC) posted.
    pub ops: u64,
    /// Receive completions (UD: datagrams delivered, a network duplicate's second copy
    /// included; UC: SENDs and WRITEs with immediate received), plus, for UC, WRITEs without
    /// immediate found whole in place.
    pub completed: u64,
    /// Of `completed`: a second delivery of one datagram or message (only ever of a
    /// network duplicate).
    pub duplicates: u64,
    /// Payload bytes of `completed`.
    pub bytes: u64,
    /// Datagrams or messages the network kept from completing (a copy lost, partitioned or
    /// corrupted, or, for UC, packets out of order).
    pub network_lost: u64,
    /// Datagrams or messages that reached their receiver whole and were dropped there, by
    /// reason: the receivers' counters, summed.
    pub drops: UnrelCounters,
    /// Packets a QP refused before its transport looked at them (wrong QP type or state).
    pub wrong_qp: u64,
    /// Packets for a QPN no QP at the receiving host has.
    pub unroutable: u64,
    /// UD datagrams addressed to an address no host has.
    pub no_route: u64,
    /// Posts refused as they should be (a UD message longer than the MTU).
    pub refused_posts: u64,
    /// Simulation steps.
    pub steps: u64,
    /// Virtual time at the end (ns).
    pub virtual_ns: u64,
    /// Network counters.
    pub net: NetStats,
    /// Packets refused by the ICRC check.
    pub icrc_rejected: u64,
    /// Invariant violations (empty when the seed passes).
    pub violations: Vec<String>,
    /// One-line description of the configuration.
    pub config: String,
}

/// Record a violation (the first 8 of a seed), with the time and step it was seen at.
pub(super) fn note(report: &mut UnrelReport, w: &World, s: String) {
    if report.violations.len() < 8 {
        report
            .violations
            .push(format!("t={}ns step={}: {s}", w.now, w.stats.steps));
    }
}

/// The seed's fault rates: 15 % of seeds run on a perfect network, the others with up to
/// 20 % of faults (loss, duplication, reordering, corruption in random proportions).
pub(super) fn pick_faults(rng: &mut Rng) -> Faults {
    let level = if rng.chance(0.15) {
        0.0
    } else {
        rng.unit() * 0.2
    };
    let wts: Vec<f64> = (0..4).map(|_| rng.unit()).collect();
    let sum: f64 = wts.iter().sum::<f64>().max(1e-9);
    Faults {
        loss: level * wts[0] / sum,
        duplicate: level * wts[1] / sum,
        reorder: level * wts[2] / sum,
        corrupt: level * wts[3] / sum,
        latency_ns: rng.range(1_000, 5_000),
        jitter_ns: rng.below(500),
        reorder_delay_ns: rng.range(1_000, 20_000),
    }
}

/// A partition between two hosts over part of the run, in 10 % of seeds.
pub(super) fn maybe_partition(rng: &mut Rng, w: &mut World) -> bool {
    let n = w.eps.len() as u64;
    if n < 2 || !rng.chance(0.1) {
        return false;
    }
    let a = rng.below(n) as usize;
    let b = (a + 1 + rng.below(n - 1) as usize) % n as usize;
    let from = rng.below(500_000);
    let until = if rng.chance(0.3) {
        u64::MAX
    } else {
        from + rng.range(10_000, 1_000_000)
    };
    w.net.partitions.push(Partition { a, b, from, until });
    true
}

pub(super) fn fault_desc(f: &Faults) -> String {
    format!(
        "loss={:.3} dup={:.3} reorder={:.3} corrupt={:.3}",
        f.loss, f.duplicate, f.reorder, f.corrupt
    )
}

/// The drop counters that grew from `a` to `b`, field by field.
pub(super) fn unrel_delta(a: &UnrelCounters, b: &UnrelCounters) -> UnrelCounters {
    UnrelCounters {
        qkey_drops: b.qkey_drops.wrapping_sub(a.qkey_drops),
        no_recv_drops: b.no_recv_drops.wrapping_sub(a.no_recv_drops),
        len_drops: b.len_drops.wrapping_sub(a.len_drops),
        uc_gap_drops: b.uc_gap_drops.wrapping_sub(a.uc_gap_drops),
        access_drops: b.access_drops.wrapping_sub(a.access_drops),
        suspended_drops: b.suspended_drops.wrapping_sub(a.suspended_drops),
        malformed: b.malformed.wrapping_sub(a.malformed),
    }
}

pub(super) fn add_unrel(sum: &mut UnrelCounters, c: &UnrelCounters) {
    sum.qkey_drops += c.qkey_drops;
    sum.no_recv_drops += c.no_recv_drops;
    sum.len_drops += c.len_drops;
    sum.uc_gap_drops += c.uc_gap_drops;
    sum.access_drops += c.access_drops;
    sum.suspended_drops += c.suspended_drops;
    sum.malformed += c.malformed;
}

pub(super) fn unrel_total(c: &UnrelCounters) -> u64 {
    c.qkey_drops
        + c.no_recv_drops
        + c.len_drops
        + c.uc_gap_drops
        + c.access_drops
        + c.suspended_drops
        + c.malformed
}

/// The counters a handled packet may leave behind besides `packets_received`: nothing
/// else than the unreliable drop counters and `packets_dropped` may move, and nothing is
/// sent back.
pub(super) fn check_counter_delta(before: &QpCounters, after: &QpCounters) -> Result<(), String> {
    let same = QpCounters {
        packets_received: before.packets_received + 1,
        packets_dropped: after.packets_dropped,
        unrel: after.unrel,
        ..*before
    };
    if *after != same {
        return Err(format!(
            "handling one packet moved more than its receive and drop counters: {before:?} -> {after:?}"
        ));
    }
    if after.packets_dropped < before.packets_dropped {
        return Err("packets_dropped went down".into());
    }
    Ok(())
}

/// What became of one packet, from the network's log and the world's trace.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PacketFate {
    pub lost: bool,
    pub duplicated: bool,
    pub reordered: bool,
    pub corrupted: bool,
    pub partitioned: u32,
    pub arrived: u32,
    pub handled: u32,
    pub rejected: u32,
    pub unroutable: u32,
}

/// Every packet's fate, by send number.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub pkts: HashMap<u64, PacketFate>,
}

impl Ledger {
    pub fn on_net(&mut self, e: NetEvent) {
        match e {
            NetEvent::Lost(id) => self.pkts.entry(id).or_default().lost = true,
            NetEvent::Partitioned(id) => self.pkts.entry(id).or_default().partitioned += 1,
            NetEvent::Duplicated(id) => self.pkts.entry(id).or_default().duplicated = true,
            NetEvent::Reordered(id) => self.pkts.entry(id).or_default().reordered = true,
            NetEvent::Corrupted(id) => self.pkts.entry(id).or_default().corrupted = true,
        }
    }

    /// Account for a copy of `id` that left the network; an error when its fate does not
    /// fit what the network did to it.
    pub fn on_arrived(
        &mut self,
        id: u64,
        corrupted: Option<bool>,
        fate: &Fate,
    ) -> Result<(), String> {
        let f = self.pkts.entry(id).or_default();
        f.arrived += 1;
        match fate {
            Fate::IcrcRejected | Fate::Malformed => {
                f.rejected += 1;
                if corrupted.is_none() {
                    return Err(format!(
                        "packet {id} refused by the receiving host ({fate:?}) though the network did not touch it"
                    ));
                }
            }
            Fate::Unroutable => f.unroutable += 1,
            Fate::Handled { .. } => f.handled += 1,
        }
        Ok(())
    }

    /// Every copy of every packet accounted for once: a packet the network lost never
    /// arrived; any other arrived (or met a partition) once, twice when duplicated.
    pub fn check_conservation(&self) -> Result<(), String> {
        let mut ids: Vec<_> = self.pkts.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let f = &self.pkts[&id];
            let copies = f.arrived + f.partitioned;
            let want = if f.lost {
                0
            } else {
                1 + u32::from(f.duplicated)
            };
            if copies != want {
                return Err(format!(
                    "packet {id}: {copies} copies arrived or met a partition, {want} expected ({f:?})"
                ));
            }
        }
        Ok(())
    }
}

/// What a UD receive's GRH area must hold for a datagram from `src` to `dst` whose UDP
/// payload is `udp_len` bytes: 20 zero bytes, then an IPv4 header (version 4, 20 bytes,
/// the total length, UDP, a valid checksum) naming the two hosts.
pub(super) fn check_grh(
    g: &[u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_len: usize,
) -> Result<(), String> {
    let g: [u8; GRH_LEN] = g
        .try_into()
        .map_err(|_| format!("GRH area of {} bytes", g.len()))?;
    if g[..20].iter().any(|&b| b != 0) {
        return Err(format!(
            "GRH area's first 20 bytes not zero: {:02x?}",
            &g[..20]
        ));
    }
    let h = &g[20..];
    let total = u16::from_be_bytes([h[2], h[3]]) as usize;
    if h[0] != 0x45 || h[9] != 17 || total != 20 + 8 + udp_len {
        return Err(format!(
            "GRH area's IPv4 header wrong (version/IHL {:#x}, protocol {}, total length {total}, want {}): {h:02x?}",
            h[0],
            h[9],
            20 + 8 + udp_len
        ));
    }
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if sum != 0xffff {
        return Err(format!("GRH area's IPv4 header checksum wrong: {h:02x?}"));
    }
    let want = (IpAddr::V4(src), IpAddr::V4(dst));
    match grh_source(&g) {
        Some(got) if got == want => Ok(()),
        got => Err(format!(
            "GRH area names {got:?}, the datagram went {want:?}"
        )),
    }
}

/// The UDP payload length of a packet with `hdrs` bytes of BTH and extension headers and
/// `len` payload bytes (padded to four, then the ICRC).
pub(super) fn udp_len(hdrs: usize, len: usize) -> usize {
    hdrs + len.div_ceil(4) * 4 + 4
}

/// A printable name for a QP.
pub(super) fn qp_name(r: QpRef) -> String {
    format!("ep{}/qp{}", r.ep, r.qp)
}

/// A new seed's randomness and its world, on the faults the seed picks (see [`pick_faults`]),
/// tracing every packet and every network event.
pub(super) fn new_world(seed: u64) -> (Rng, Faults, World) {
    let mut rng = Rng::new(seed);
    let faults = pick_faults(&mut rng);
    let mut w = World::new(rng.next_u64(), faults);
    w.trace = Some(Vec::new());
    w.net.log = Some(Vec::new());
    (rng, faults, w)
}

/// What the shared code of a workload works with: the seed's randomness, world, ledger and
/// report, and how many messages are left to post.
pub(super) struct Parts<'a> {
    pub rng: &'a mut Rng,
    pub w: &'a mut World,
    pub ledger: &'a mut Ledger,
    pub report: &'a mut UnrelReport,
    pub to_post: usize,
}

/// A UD or UC workload, as the run loop, the step check and the send completions they share
/// ([`run`], [`check_step`], [`complete_send`]) see it. Its QPs are numbered from 0.
pub(super) trait Workload {
    /// What its violations call a message: "message" (UC) or "datagram" (UD).
    const UNIT: &'static str;
    /// The seed's state.
    fn parts(&mut self) -> Parts<'_>;
    /// Post one message from a random QP (false when that QP's send queue is busy).
    fn post_one(&mut self) -> bool;
    /// New receive-queue depths and posting rates: some queues run dry.
    fn repick_targets(&mut self);
    /// Post receives to the queues that are below their depth, at their rates.
    fn post_recvs(&mut self);
    /// Check what a step did: [`check_step`], and the workload's own checks.
    fn check_step(&mut self);
    /// The end-of-run accounting (after [`finish_start`]).
    fn finish(&mut self);
    /// A packet sent (`TraceEvent::Sent`).
    fn on_sent(
        &mut self,
        id: Option<u64>,
        from: QpRef,
        to: Option<usize>,
        hdr: Option<HeaderRepr>,
        payload_len: usize,
    );
    /// A copy of a packet that left the network (`TraceEvent::Arrived`).
    fn on_arrived(&mut self, id: u64, corrupted: Option<bool>, late: bool, fate: Fate);
    /// A receive completion.
    fn on_recv_wc(&mut self, at: QpRef, wc: WorkCompletion);
    /// A send completion (see [`complete_send`]).
    fn on_send_wc(&mut self, at: QpRef, wc: WorkCompletion);
    /// How many QPs the workload has.
    fn qp_count(&self) -> usize;
    /// The index of QP `r`, if it is the workload's.
    fn qp_index(&self, r: QpRef) -> Option<usize>;
    /// QP `i`.
    fn qp_ref(&self, i: usize) -> QpRef;
    /// The messages QP `i` posted whose send has not completed, in posting order.
    fn unretired(&mut self, i: usize) -> &mut VecDeque<usize>;
    /// The receive completions QP `i` is to see, in order: (message, receive).
    fn expect(&mut self, i: usize) -> &mut VecDeque<(usize, usize)>;
    /// Whether message `m` was posted signaled.
    fn signaled(&self, m: usize) -> bool;
    /// Message `m`'s send completed: give its send buffer back.
    fn retire(&mut self, m: usize);
}

/// The state half of a [`Workload`] impl, for a `Sim` whose fields are `rng`, `w`, `ledger`,
/// `report`, `to_post` (see [`Parts`]), `qps` (each QP with `r`, `unretired` and `expect`)
/// and the messages `$msgs` (each with `signaled`); `$unit` is [`Workload::UNIT`].
macro_rules! workload_state {
    ($unit:literal, $msgs:ident) => {
        const UNIT: &'static str = $unit;

        fn parts(&mut self) -> $crate::workload::unrel::Parts<'_> {
            $crate::workload::unrel::Parts {
                rng: &mut self.rng,
                w: &mut self.w,
                ledger: &mut self.ledger,
                report: &mut self.report,
                to_post: self.to_post,
            }
        }

        fn qp_count(&self) -> usize {
            self.qps.len()
        }

        fn qp_ref(&self, i: usize) -> $crate::world::QpRef {
            self.qps[i].r
        }

        fn unretired(&mut self, i: usize) -> &mut ::std::collections::VecDeque<usize> {
            &mut self.qps[i].unretired
        }

        fn expect(&mut self, i: usize) -> &mut ::std::collections::VecDeque<(usize, usize)> {
            &mut self.qps[i].expect
        }

        fn signaled(&self, m: usize) -> bool {
            self.$msgs[m].signaled
        }
    };
}
pub(super) use workload_state;

/// Run a seed for at most `max_steps` steps: messages are posted in bursts (a burst starts
/// at a step with chance `burst` and posts `rng.range(1, most)` messages), receives as the
/// queues take them, every step is checked, time passes when nothing is in flight; then
/// [`Workload::finish`].
pub(super) fn run<S: Workload>(s: &mut S, max_steps: u64, burst: f64, most: u64) {
    let mut idle = 0u32;
    loop {
        let p = s.parts();
        if p.to_post > 0 && p.rng.chance(burst) {
            for _ in 0..s.parts().rng.range(1, most) {
                if s.parts().to_post == 0 || !s.post_one() {
                    break;
                }
            }
        }
        if s.parts().rng.chance(0.01) {
            s.repick_targets();
        }
        s.post_recvs();
        let busy = s.parts().w.step();
        s.check_step();
        let p = s.parts();
        if !p.report.violations.is_empty() {
            break;
        }
        if !busy {
            if p.to_post == 0 {
                break;
            }
            // Nothing in flight: let time pass before the next messages.
            p.w.now += p.rng.range(1_000, 20_000);
            idle += 1;
            if idle > 100_000 {
                note(p.report, p.w, "no progress".into());
                break;
            }
        }
        if p.w.stats.steps >= max_steps {
            note(p.report, p.w, format!("still busy after {max_steps} steps"));
            break;
        }
    }
    s.finish();
}

/// The checks of a step every workload makes: each packet traced and each completion to the
/// workload, each network event to the ledger, the sends the QPs finished without a
/// completion retired ([`settle_unsignaled`]), the guard bytes, and no ICRC escape.
pub(super) fn check_step<S: Workload>(s: &mut S) {
    let p = s.parts();
    let trace = p.w.trace.as_mut().map(std::mem::take).unwrap_or_default();
    for ev in trace {
        match ev {
            TraceEvent::Sent {
                id,
                from,
                to,
                hdr,
                payload_len,
            } => s.on_sent(id, from, to, hdr, payload_len),
            TraceEvent::Arrived {
                id,
                corrupted,
                fate,
                late,
                ..
            } => s.on_arrived(id, corrupted, late, fate),
        }
    }
    let p = s.parts();
    let log = p.w.net.log.as_mut().map(std::mem::take).unwrap_or_default();
    for e in log {
        p.ledger.on_net(e);
    }
    while let Some(c) = s.parts().w.completions.pop_front() {
        if c.wc.is_recv() {
            s.on_recv_wc(c.at, c.wc);
        } else {
            s.on_send_wc(c.at, c.wc);
        }
    }
    settle_unsignaled(s);
    let p = s.parts();
    for i in 0..p.w.eps.len() {
        if let Err(e) = p.w.eps[i].mem.check_guards() {
            note(p.report, p.w, e);
        }
    }
    if let Some(e) = p.w.icrc_escape.take() {
        note(p.report, p.w, e);
    }
}

/// Retire the messages of every QP whose send queue is empty: their sends completed without
/// a completion, which only an unsignaled one may.
fn settle_unsignaled<S: Workload>(s: &mut S) {
    for fi in 0..s.qp_count() {
        let r = s.qp_ref(fi);
        if s.unretired(fi).is_empty() || s.parts().w.qp(r).send_queue_len() != 0 {
            continue;
        }
        let ids: Vec<usize> = s.unretired(fi).drain(..).collect();
        for id in ids {
            if s.signaled(id) {
                let p = s.parts();
                let what = S::UNIT;
                note(
                    p.report,
                    p.w,
                    format!("signaled {what} {id} retired without a completion"),
                );
            }
            s.retire(id);
        }
    }
}

/// A send completion on `at`: the messages posted before the one it names retire with it
/// (they were unsignaled, or it is a violation). Returns the QP's index and the message
/// named, which the caller checks and retires; `None` (noted) for a completion of no QP of
/// the workload or of no message outstanding there.
pub(super) fn complete_send<S: Workload>(
    s: &mut S,
    at: QpRef,
    wc: &WorkCompletion,
) -> Option<(usize, usize)> {
    let what = S::UNIT;
    let Some(fi) = s.qp_index(at) else {
        let p = s.parts();
        let e = format!("send completion on {}: {wc:?}", qp_name(at));
        note(p.report, p.w, e);
        return None;
    };
    let id = wc.wr_id as usize;
    let Some(pos) = s.unretired(fi).iter().position(|&x| x == id) else {
        let p = s.parts();
        let e = format!(
            "completion for unknown or completed {what} {id} on {}: {wc:?}",
            qp_name(at)
        );
        note(p.report, p.w, e);
        return None;
    };
    let earlier: Vec<usize> = s.unretired(fi).drain(..=pos).collect();
    for &e in &earlier[..earlier.len() - 1] {
        if s.signaled(e) {
            let p = s.parts();
            let m = format!("{what} {id} completed before signaled {what} {e}");
            note(p.report, p.w, m);
        }
        s.retire(e);
    }
    Some((fi, id))
}

/// A receive completion on `at`: the QP's index and the (message, receive) it was predicted
/// to be; `None` (noted) for one on no QP of the workload, or one that nothing received
/// (`received` says what was not: "message received whole", "datagram delivered").
pub(super) fn expected_recv<S: Workload>(
    s: &mut S,
    at: QpRef,
    wc: &WorkCompletion,
    received: &str,
) -> Option<(usize, (usize, usize))> {
    let Some(ri) = s.qp_index(at) else {
        let p = s.parts();
        let e = format!("receive completion on {}: {wc:?}", qp_name(at));
        note(p.report, p.w, e);
        return None;
    };
    let Some(x) = s.expect(ri).pop_front() else {
        let p = s.parts();
        let e = format!(
            "receive completion on {} with no {received}: {wc:?}",
            qp_name(at)
        );
        note(p.report, p.w, e);
        return None;
    };
    Some((ri, x))
}

/// The start of the end-of-run accounting: a last step check, the run's figures into the
/// report. False when a violation stopped the run (the accounting would only add noise);
/// otherwise nothing may be left in flight.
pub(super) fn finish_start<S: Workload>(s: &mut S) -> bool {
    s.check_step();
    let p = s.parts();
    p.report.steps = p.w.stats.steps;
    p.report.virtual_ns = p.w.now;
    p.report.net = p.w.net.stats;
    p.report.icrc_rejected = p.w.stats.icrc_rejected;
    if !p.report.violations.is_empty() {
        return false;
    }
    if p.w.net.in_flight() != 0 {
        let e = format!("{} packets still in flight", p.w.net.in_flight());
        note(p.report, p.w, e);
    }
    true
}

/// A message to post (see [`post_send`]).
pub(super) struct Message<'a> {
    /// Its `wr_id`.
    pub id: usize,
    pub op: WrOpcode,
    pub data: &'a [u8],
    pub inline: bool,
    pub signaled: bool,
    pub solicited: bool,
    /// UD: where it goes.
    pub ud: Option<UdDest>,
}

/// Post `m` on QP `from`: its data inline, or from a region at `base` registered for it with
/// `access` and filled with it. Returns the region's key (0 for inline data) and what the
/// post came to.
pub(super) fn post_send(
    w: &mut World,
    from: QpRef,
    (base, access): (u64, Access),
    m: Message<'_>,
) -> (u32, Result<(), PostError>) {
    let len = m.data.len();
    let mem = &w.eps[from.ep].mem;
    let key = if m.inline {
        0
    } else {
        let k = mem.reg_mr(1, base, len.max(1), access);
        mem.fill(k, 0, m.data);
        k
    };
    let sge = [Sge {
        addr: base,
        length: len as u32,
        lkey: key,
    }];
    let mut flags = SendFlags::NONE;
    if m.signaled {
        flags = flags | SendFlags::SIGNALED;
    }
    if m.solicited {
        flags = flags | SendFlags::SOLICITED;
    }
    let mut wr = SendWr::new(m.id as u64, m.op).flags(flags);
    if let Some(ud) = m.ud {
        wr = wr.ud(ud);
    }
    wr = if m.inline {
        wr.inline(m.data)
    } else {
        wr.sg(&sge)
    };
    (key, w.qp(from).post_send(&wr))
}

/// Post receive `id`, `len` bytes at `base` in region `key` (no scatter entry when `len` is
/// 0), with `post`.
pub(super) fn post_recv(
    id: usize,
    (base, key, len): (u64, u32, usize),
    post: impl FnOnce(&RecvWr<'_>) -> Result<(), PostError>,
) -> Result<(), PostError> {
    let sge = [Sge {
        addr: base,
        length: len as u32,
        lkey: key,
    }];
    post(&RecvWr {
        wr_id: id as u64,
        sg_list: if len == 0 { &[] } else { &sge },
    })
}
