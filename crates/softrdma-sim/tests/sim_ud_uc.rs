//! The seeded simulation suites of the unreliable services: random UD datagrams and random
//! UC SENDs and WRITEs over a network with 0-20 % loss, duplication, reordering and
//! corruption, and partitions, with every invariant checked as the run goes (see
//! `softrdma_sim::workload::ud` and `softrdma_sim::workload::uc`).
//!
//! `SOFTRDMA_SEEDS=N` changes the seed count of each suite (default 1000);
//! `SOFTRDMA_SEED_BASE=B` the first seed. A failing seed is printed with the command that
//! replays it alone, e.g.
//! `SOFTRDMA_SEED=1234 cargo test -p softrdma-sim --test sim_ud_uc -- one_ud_seed --nocapture`.

use std::time::Instant;

use softrdma_sim::workload::{UcOptions, UnrelReport, run_uc_seed, run_uc_seed_with, run_ud_seed};

const MAX_STEPS: u64 = 1_000_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn describe(what: &str, r: &UnrelReport) -> String {
    format!(
        "{what} seed {}: {} posted, {} completed ({} duplicates), {} kept by the network, {} B, {} steps, {:.3} ms virtual, {} packets ({} lost, {} partitioned, {} dup, {} reordered, {} corrupted -> {} ICRC rejects), drops {:?}, {} refused by a QP, {} unroutable, {} no route [{}]",
        r.seed,
        r.ops,
        r.completed,
        r.duplicates,
        r.network_lost,
        r.bytes,
        r.steps,
        r.virtual_ns as f64 / 1e6,
        r.net.sent,
        r.net.lost,
        r.net.partitioned,
        r.net.duplicated,
        r.net.reordered,
        r.net.corrupted,
        r.icrc_rejected,
        r.drops,
        r.wrong_qp,
        r.unroutable,
        r.no_route,
        r.config
    )
}

#[derive(Default)]
struct Totals {
    ops: u64,
    completed: u64,
    duplicates: u64,
    network_lost: u64,
    bytes: u64,
    steps: u64,
    pkts: u64,
    lost: u64,
    dup: u64,
    reordered: u64,
    corrupted: u64,
    rejected: u64,
    qkey: u64,
    no_recv: u64,
    len: u64,
    gap: u64,
    access: u64,
    malformed: u64,
    wrong_qp: u64,
    unroutable: u64,
    no_route: u64,
    refused_posts: u64,
}

impl Totals {
    fn add(&mut self, r: &UnrelReport) {
        self.ops += r.ops;
        self.completed += r.completed;
        self.duplicates += r.duplicates;
        self.network_lost += r.network_lost;
        self.bytes += r.bytes;
        self.steps += r.steps;
        self.pkts += r.net.sent;
        self.lost += r.net.lost + r.net.partitioned;
        self.dup += r.net.duplicated;
        self.reordered += r.net.reordered;
        self.corrupted += r.net.corrupted;
        self.rejected += r.icrc_rejected;
        self.qkey += r.drops.qkey_drops;
        self.no_recv += r.drops.no_recv_drops;
        self.len += r.drops.len_drops;
        self.gap += r.drops.uc_gap_drops;
        self.access += r.drops.access_drops;
        self.malformed += r.drops.malformed;
        self.wrong_qp += r.wrong_qp;
        self.unroutable += r.unroutable;
        self.no_route += r.no_route;
        self.refused_posts += r.refused_posts;
    }
}

fn suite(what: &str, test: &str, run: impl Fn(u64) -> UnrelReport) {
    let n = env_u64("SOFTRDMA_SEEDS").unwrap_or(1000);
    let base = env_u64("SOFTRDMA_SEED_BASE").unwrap_or(0);
    let t0 = Instant::now();
    let mut t = Totals::default();
    let mut failed = Vec::new();
    for seed in base..base + n {
        let r = run(seed);
        t.add(&r);
        if !r.violations.is_empty() {
            eprintln!("FAILED {}", describe(what, &r));
            for v in &r.violations {
                eprintln!("    {v}");
            }
            eprintln!(
                "    reproduce: SOFTRDMA_SEED={seed} cargo test -p softrdma-sim --test sim_ud_uc -- {test} --nocapture"
            );
            failed.push(seed);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let unit = if what == "UD" {
        "datagrams"
    } else {
        "messages"
    };
    println!(
        "{what}: {n} seeds in {secs:.2} s: {} {unit} posted, {} completed ({} of them second deliveries of a network duplicate), {} kept from completing by the network; {:.1} MB, {} steps, {} packets; {:.0} {unit}/s, {:.0} packets/s",
        t.ops,
        t.completed,
        t.duplicates,
        t.network_lost,
        t.bytes as f64 / 1e6,
        t.steps,
        t.pkts,
        t.ops as f64 / secs,
        t.pkts as f64 / secs
    );
    println!(
        "{what}: faults injected: {} lost or partitioned, {} duplicated, {} reordered, {} corrupted ({} rejected by the ICRC check)",
        t.lost, t.dup, t.reordered, t.corrupted, t.rejected
    );
    println!(
        "{what}: receiver drops: {} Q_Key, {} no receive, {} receive too short, {} UC gap, {} access, {} malformed; {} refused by a QP of another type, {} for no QP, {} to no host; {} posts refused as too long",
        t.qkey,
        t.no_recv,
        t.len,
        t.gap,
        t.access,
        t.malformed,
        t.wrong_qp,
        t.unroutable,
        t.no_route,
        t.refused_posts
    );
    assert!(
        failed.is_empty(),
        "{what}: {} failing seeds: {failed:?}",
        failed.len()
    );
}

#[test]
fn ud_seeds() {
    suite("UD", "one_ud_seed", |s| run_ud_seed(s, MAX_STEPS));
}

#[test]
fn uc_seeds() {
    suite("UC", "one_uc_seed", |s| run_uc_seed(s, MAX_STEPS));
}

fn one(what: &str, run: impl Fn(u64) -> UnrelReport) {
    let Some(seed) = env_u64("SOFTRDMA_SEED") else {
        return;
    };
    let r = run(seed);
    println!("{}", describe(what, &r));
    for v in &r.violations {
        println!("    {v}");
    }
    assert!(r.violations.is_empty());
}

#[test]
fn one_ud_seed() {
    one("UD", |s| run_ud_seed(s, MAX_STEPS));
}

#[test]
fn one_uc_seed() {
    one("UC", |s| run_uc_seed(s, MAX_STEPS));
}

#[test]
fn one_uc_greedy_seed() {
    let opts = UcOptions {
        greedy_receives: true,
    };
    one("UC greedy", |s| run_uc_seed_with(s, MAX_STEPS, opts));
}

/// The UC workload with an application that posts receives whenever the receive queue takes
/// them: while a message holds a receive, the queue takes `max_recv_wr` more, and when that
/// message is cut the receive it held is given back to a full queue and discarded (never
/// completed, never flushed); the next message completes the receive posted after it.
#[test]
fn uc_greedy_seeds() {
    let opts = UcOptions {
        greedy_receives: true,
    };
    suite("UC greedy", "one_uc_greedy_seed", |s| {
        run_uc_seed_with(s, MAX_STEPS, opts)
    });
}
