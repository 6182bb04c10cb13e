//! What the UD and UC workloads share: the seed's network, the report, and the ledger that
//! follows every packet through the network (each copy accounted for once).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use softrdma::rc::unreliable::grh_source;
use softrdma::rc::{GRH_LEN, QpCounters, UnrelCounters};

use crate::net::{Faults, NetEvent, NetStats, Partition};
use crate::rng::Rng;
use crate::world::{Fate, QpRef, World};

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
