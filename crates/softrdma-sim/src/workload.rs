//! Random mixed workloads and the invariant checker run after every step.
//!
//! A seed fixes everything: hosts, connections, MTUs, timers, fault rates, partitions and
//! the operation mix (SEND, SEND with immediate, WRITE, WRITE with immediate, READ,
//! Compare&Swap, Fetch&Add; 0 B to 1 MiB). Checked after every step:
//! - every completion belongs to a posted WR and arrives once (ARCHITECTURE invariant 5);
//!   send completions arrive in posting order;
//! - the bytes that arrive are exactly the bytes sent (SEND, WRITE, READ), checked when the
//!   completion is seen; a receive completion also finds every earlier WRITE of that
//!   direction fully placed (invariant 1);
//! - no byte outside a registered range changes: guard bytes around every buffer (invariant 2);
//! - atomics are linearizable and executed once (invariant 3): Fetch&Add results from several
//!   QPs on one counter are all distinct, and the counter ends at the exact sum;
//! - corrupted packets never pass the ICRC check;
//! - errors only when the network is faulty (`RETRY_EXC_ERR`, then `WR_FLUSH_ERR`), and the run
//!   ends with every WR completed: nothing hangs (invariant 6).
//!
//! Invariant 4 (refused registrations change nothing) belongs to the memory subsystem.
//!
//! The unreliable services have workloads of their own, driven through the same world:
//! [`ud`] (datagrams between UD QPs, every copy of every packet accounted for) and [`uc`]
//! (SENDs and WRITEs between connected UC QPs, every completion the end of a message received
//! whole).

use std::collections::{HashMap, HashSet, VecDeque};

use softrdma::mem::Access;
use softrdma::rc::{Mtu, QpCap, RecvWr, SendFlags, SendWr, Sge, WrOpcode};

use crate::net::{Faults, NetStats, Partition};
use crate::rng::Rng;
use crate::world::{ConnOpts, QpRef, World};

mod checks;
pub mod devices;
pub mod uc;
pub mod ud;
mod unrel;

pub use uc::{UcOptions, run_uc_seed, run_uc_seed_with};
pub use ud::run_ud_seed;
pub use unrel::UnrelReport;

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const BASE: u64 = 0x1_0000;
const MAX_OUTSTANDING: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    FetchAdd,
}

#[derive(Debug)]
struct Op {
    kind: Kind,
    req: QpRef,
    resp: QpRef,
    conn: usize,
    len: usize,
    data: Vec<u8>,
    /// Key of the buffer the data ends in (responder for SEND/WRITE, requester for READ).
    dst: u32,
    /// Requester-side source or result buffer.
    local: u32,
    imm: Option<u32>,
    cas: (u64, u64, u64),
    add: u64,
    signaled: bool,
    req_done: bool,
    recv_needed: bool,
    recv_done: bool,
    /// Index among the WRITEs/receives of its direction, for invariant 1.
    writes_before: usize,
}

#[derive(Debug)]
struct Conn {
    a: QpRef,
    b: QpRef,
    dead: bool,
    mtu: u32,
}

/// What one seed did.
#[derive(Clone, Debug, Default)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Operations posted.
    pub ops: u64,
    /// Operations that completed successfully.
    pub ops_ok: u64,
    /// Operations that completed in error (only under faults).
    pub ops_err: u64,
    /// Bytes moved by successful operations.
    pub bytes: u64,
    /// Simulation steps.
    pub steps: u64,
    /// Virtual time at the end (ns).
    pub virtual_ns: u64,
    /// Network counters.
    pub net: NetStats,
    /// Packets rejected by the ICRC check.
    pub icrc_rejected: u64,
    /// Invariant violations (empty when the seed passes).
    pub violations: Vec<String>,
    /// One-line description of the configuration.
    pub config: String,
}

struct Sim {
    rng: Rng,
    w: World,
    conns: Vec<Conn>,
    ops: Vec<Op>,
    /// Per requester QP: op ids posted, in order, not yet completed.
    sq_order: HashMap<QpRef, VecDeque<usize>>,
    /// Per responder QP: op ids waiting for a receive completion, in order.
    rq_order: HashMap<QpRef, VecDeque<usize>>,
    /// Per responder QP: receives to post (op id, ready time).
    recv_later: HashMap<QpRef, VecDeque<(usize, u64)>>,
    /// Per direction (requester QP): WRITE op ids, in posting order.
    writes: HashMap<QpRef, Vec<usize>>,
    to_post: usize,
    faulty: bool,
    counter: (usize, u32, u64),
    fadd_seen: HashSet<u64>,
    fadd_sum_ok: u64,
    fadd_sum_all: u64,
    fadd_failed: bool,
    max_len: usize,
    report: SeedReport,
}

fn pick_kind(r: &mut Rng) -> Kind {
    match r.below(100) {
        0..20 => Kind::Send,
        20..30 => Kind::SendImm,
        30..50 => Kind::Write,
        50..60 => Kind::WriteImm,
        60..80 => Kind::Read,
        80..87 => Kind::Cas,
        _ => Kind::FetchAdd,
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let level = if rng.chance(0.15) {
            0.0
        } else {
            rng.unit() * 0.2
        };
        let wts: Vec<f64> = (0..4).map(|_| rng.unit()).collect();
        let sum: f64 = wts.iter().sum::<f64>().max(1e-9);
        let faults = Faults {
            loss: level * wts[0] / sum,
            duplicate: level * wts[1] / sum,
            reorder: level * wts[2] / sum,
            corrupt: level * wts[3] / sum,
            latency_ns: rng.range(1_000, 5_000),
            jitter_ns: rng.below(500),
            reorder_delay_ns: rng.range(1_000, 20_000),
        };
        let mut w = World::new(rng.next_u64(), faults);
        let neps = rng.range(2, 3) as usize;
        for _ in 0..neps {
            w.add_endpoint();
        }
        let mut partitioned = false;
        if rng.chance(0.1) {
            let other = rng.range(1, neps as u64 - 1) as usize;
            let from = rng.below(2_000_000);
            let until = if rng.chance(0.3) {
                u64::MAX
            } else {
                from + rng.range(10_000, 3_000_000)
            };
            w.net.partitions.push(Partition {
                a: 0,
                b: other,
                from,
                until,
            });
            partitioned = true;
        }
        let nconns = rng.range(1, 3) as usize;
        let mut conns = Vec::new();
        let cap = QpCap {
            max_send_wr: 32,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 128,
        };
        let mut mtus = Vec::new();
        for _ in 0..nconns {
            let other = rng.range(1, neps as u64 - 1) as usize;
            let a = w.create_qp(0, cap, None);
            let b = w.create_qp(other, cap, None);
            let mtu = Mtu::ALL[rng.below(5) as usize];
            let opts = ConnOpts {
                mtu,
                timeout: rng.range(6, 12) as u8,
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: rng.range(1, 8) as u8,
                max_rd_atomic: rng.range(1, 8) as u8,
                access: ALL,
                psn_a: rng.below(1 << 24) as u32,
                psn_b: rng.below(1 << 24) as u32,
            };
            w.connect(a, b, opts);
            mtus.push(mtu.bytes());
            conns.push(Conn {
                a,
                b,
                dead: false,
                mtu: mtu.bytes(),
            });
        }
        let v0 = rng.next_u64() >> 8;
        let ck = w.eps[0].mem.reg_mr(1, BASE, 8, ALL);
        w.eps[0].mem.fill(ck, 0, &v0.to_ne_bytes());
        // Bound message sizes so go-back-N under heavy loss stays cheap: at most about
        // 16 / (fault rate) packets per message (1 MiB on clean links).
        let eff = faults.total();
        let min_mtu = *mtus.iter().min().unwrap_or(&4096) as usize;
        let max_len = if eff < 0.005 {
            1 << 20
        } else {
            ((16.0 / eff) as usize * min_mtu).clamp(4096, 1 << 20)
        };
        let n_ops = rng.range(24, 96) as usize;
        let config = format!(
            "eps={neps} conns={nconns} mtus={mtus:?} loss={:.3} dup={:.3} reorder={:.3} corrupt={:.3} partition={partitioned} ops={n_ops} max_len={max_len}",
            faults.loss, faults.duplicate, faults.reorder, faults.corrupt
        );
        Sim {
            rng,
            w,
            conns,
            ops: Vec::new(),
            sq_order: HashMap::new(),
            rq_order: HashMap::new(),
            recv_later: HashMap::new(),
            writes: HashMap::new(),
            to_post: n_ops,
            faulty: eff > 0.0 || partitioned,
            counter: (0, ck, v0),
            fadd_seen: HashSet::new(),
            fadd_sum_ok: 0,
            fadd_sum_all: 0,
            fadd_failed: false,
            max_len,
            report: SeedReport {
                seed: 0,
                config,
                ..SeedReport::default()
            },
        }
    }

    fn violation(&mut self, s: String) {
        if self.report.violations.len() < 8 {
            self.report.violations.push(format!(
                "t={}ns step={}: {s}",
                self.w.now, self.w.stats.steps
            ));
        }
    }

    fn pick_len(&mut self, mtu: u32) -> usize {
        let r = &mut self.rng;
        let n = match r.below(100) {
            0..10 => 0,
            10..50 => r.range(1, 256) as usize,
            50..75 => r.range(257, 4 * mtu as u64) as usize,
            75..93 => r.range(1, 64 * 1024) as usize,
            _ => r.range(64 * 1024, 1 << 20) as usize,
        };
        n.min(self.max_len)
    }

    /// Post one new operation if some QP has room.
    fn post_one(&mut self) -> bool {
        if self.to_post == 0 {
            return false;
        }
        let c = self.rng.below(self.conns.len() as u64) as usize;
        if self.conns[c].dead {
            self.to_post -= 1;
            return true;
        }
        let kind = pick_kind(&mut self.rng);
        let forward = self.rng.chance(0.5);
        let (mut req, mut resp) = if forward {
            (self.conns[c].a, self.conns[c].b)
        } else {
            (self.conns[c].b, self.conns[c].a)
        };
        if kind == Kind::FetchAdd {
            // Fetch&Add always targets the shared counter on host 0.
            (req, resp) = (self.conns[c].b, self.conns[c].a);
        }
        if self.w.qp(req).send_queue_len() >= MAX_OUTSTANDING {
            return false;
        }
        let mtu = self.conns[c].mtu;
        let len = match kind {
            Kind::Cas | Kind::FetchAdd => 8,
            _ => self.pick_len(mtu),
        };
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data);
        let id = self.ops.len();
        let signaled = !self.rng.chance(0.2);
        let imm =
            matches!(kind, Kind::SendImm | Kind::WriteImm).then(|| self.rng.next_u64() as u32);
        let (rm, lm) = (&self.w.eps[resp.ep].mem, &self.w.eps[req.ep].mem);
        let mut op = Op {
            kind,
            req,
            resp,
            conn: c,
            len,
            data,
            dst: 0,
            local: 0,
            imm,
            cas: (0, 0, 0),
            add: 0,
            signaled,
            req_done: false,
            recv_needed: matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm),
            recv_done: false,
            writes_before: self.writes.get(&req).map_or(0, |v| v.len()),
        };
        let inline = kind == Kind::Send && len <= 128 && self.rng.chance(0.3);
        let wr_op = match kind {
            Kind::Send | Kind::SendImm => {
                op.local = lm.reg_mr(1, BASE, len, ALL);
                lm.fill(op.local, 0, &op.data);
                let slack = self.rng.below(64) as usize;
                op.dst = rm.reg_mr(1, BASE, len + slack, ALL);
                match imm {
                    Some(imm) => WrOpcode::SendWithImm { imm },
                    None => WrOpcode::Send,
                }
            }
            Kind::Write | Kind::WriteImm => {
                op.local = lm.reg_mr(1, BASE, len, ALL);
                lm.fill(op.local, 0, &op.data);
                op.dst = rm.reg_mr(1, BASE, len, ALL);
                match imm {
                    Some(imm) => WrOpcode::RdmaWriteWithImm {
                        remote_addr: BASE,
                        rkey: op.dst,
                        imm,
                    },
                    None => WrOpcode::RdmaWrite {
                        remote_addr: BASE,
                        rkey: op.dst,
                    },
                }
            }
            Kind::Read => {
                let src = rm.reg_mr(1, BASE, len, ALL);
                rm.fill(src, 0, &op.data);
                op.local = src;
                op.dst = lm.reg_mr(1, BASE, len, ALL);
                WrOpcode::RdmaRead {
                    remote_addr: BASE,
                    rkey: src,
                }
            }
            Kind::Cas => {
                let v0 = self.rng.next_u64();
                let compare = if self.rng.chance(0.5) {
                    v0
                } else {
                    self.rng.next_u64()
                };
                let swap = self.rng.next_u64();
                op.cas = (v0, compare, swap);
                op.dst = rm.reg_mr(1, BASE, 8, ALL);
                rm.fill(op.dst, 0, &v0.to_ne_bytes());
                op.local = lm.reg_mr(1, BASE, 8, ALL);
                WrOpcode::AtomicCmpAndSwp {
                    remote_addr: BASE,
                    rkey: op.dst,
                    compare,
                    swap,
                }
            }
            Kind::FetchAdd => {
                op.add = self.rng.range(1, 1000);
                op.local = lm.reg_mr(1, BASE, 8, ALL);
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr: BASE,
                    rkey: self.counter.1,
                    add: op.add,
                }
            }
        };
        // The READ's data lands in `dst`, fetched from the remote `local`... keep the SGE on
        // the requester's buffer in every case.
        let local_key = if kind == Kind::Read { op.dst } else { op.local };
        let sge = [Sge {
            addr: BASE,
            length: len as u32,
            lkey: local_key,
        }];
        let flags = if signaled {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        let mut wr = SendWr {
            wr_id: id as u64,
            opcode: wr_op,
            send_flags: flags,
            sg_list: &sge,
            inline_data: None,
            ud: None,
        };
        if inline {
            wr = wr.inline(&op.data);
        }
        let posted = self.w.qp(req).post_send(&wr);
        if posted.is_err() {
            // Full: free the buffers and try again later.
            for (ep, k) in [
                (req.ep, op.local),
                (resp.ep, op.dst),
                (req.ep, op.dst),
                (resp.ep, op.local),
            ] {
                if k != 0 && k != self.counter.1 {
                    self.w.eps[ep].mem.dereg(k);
                }
            }
            return false;
        }
        self.to_post -= 1;
        self.report.ops += 1;
        if kind == Kind::FetchAdd {
            self.fadd_sum_all += op.add;
        }
        if kind == Kind::Write || kind == Kind::WriteImm {
            self.writes.entry(req).or_default().push(id);
        }
        self.sq_order.entry(req).or_default().push_back(id);
        if op.recv_needed {
            self.rq_order.entry(resp).or_default().push_back(id);
            let delay = if self.rng.chance(0.1) {
                self.rng.below(300_000)
            } else {
                0
            };
            let q = self.recv_later.entry(resp).or_default();
            let ready = q.back().map_or(0, |x| x.1).max(self.w.now + delay);
            q.push_back((id, ready));
        }
        self.ops.push(op);
        true
    }

    fn post_due_recvs(&mut self) -> Option<u64> {
        let now = self.w.now;
        let mut next: Option<u64> = None;
        let keys: Vec<QpRef> = self.recv_later.keys().copied().collect();
        for r in keys {
            while let Some(&(id, ready)) = self.recv_later[&r].front() {
                if ready > now {
                    next = Some(next.map_or(ready, |n| n.min(ready)));
                    break;
                }
                let op = &self.ops[id];
                let sge = [Sge {
                    addr: BASE,
                    length: self.w.eps[r.ep].mem.contents(op.dst).len() as u32,
                    lkey: op.dst,
                }];
                let sg: &[Sge] = if op.kind == Kind::WriteImm { &[] } else { &sge };
                if self
                    .w
                    .qp(r)
                    .post_recv(&RecvWr {
                        wr_id: id as u64,
                        sg_list: sg,
                    })
                    .is_err()
                {
                    break;
                }
                self.recv_later.get_mut(&r).map(|q| q.pop_front());
            }
        }
        next
    }

    fn run(&mut self, max_steps: u64) {
        let mut idle = 0u32;
        loop {
            while self.post_one() {}
            let next_recv = self.post_due_recvs();
            if self.w.step() {
                idle = 0;
            } else {
                if let Some(t) = next_recv {
                    self.w.now = self.w.now.max(t);
                    continue;
                }
                idle += 1;
                if idle > 10_000 {
                    self.violation("idle with work left: a hang".into());
                    break;
                }
                if self.to_post > 0 && self.conns.iter().any(|c| !c.dead) {
                    self.check_step();
                    continue;
                }
                self.check_step();
                if self.to_post == 0 || self.conns.iter().all(|c| c.dead) {
                    break;
                }
            }
            self.check_step();
            if self.w.stats.steps >= max_steps {
                self.violation(format!("still busy after {max_steps} steps"));
                break;
            }
            if !self.report.violations.is_empty() {
                break;
            }
        }
        self.finish();
    }

    fn finish(&mut self) {
        self.check_step();
        // Nothing hangs: every posted WR completed, every needed receive arrived.
        for (id, op) in self.ops.iter().enumerate() {
            let conn_dead = self.conns[op.conn].dead;
            if !op.req_done {
                let s = format!("WR {id} {:?} ({} B) never completed", op.kind, op.len);
                self.report.violations.push(s);
                break;
            }
            if op.recv_needed && !op.recv_done && !conn_dead {
                let s = format!("op {id} {:?}: receive never completed", op.kind);
                self.report.violations.push(s);
                break;
            }
        }
        let (ep, key, v0) = self.counter;
        let end = self.w.eps[ep].mem.read_u64(key, 0) - v0;
        let exact = !self.fadd_failed && end != self.fadd_sum_ok;
        let bounded = self.fadd_failed && (end < self.fadd_sum_ok || end > self.fadd_sum_all);
        if exact || bounded {
            self.report.violations.push(format!(
                "counter moved by {end}; successful Fetch&Adds sum to {}, all to {}",
                self.fadd_sum_ok, self.fadd_sum_all
            ));
        }
        self.report.steps = self.w.stats.steps;
        self.report.virtual_ns = self.w.now;
        self.report.net = self.w.net.stats;
        self.report.icrc_rejected = self.w.stats.icrc_rejected;
    }
}

/// Run one seed to completion with at most `max_steps` steps.
pub fn run_seed(seed: u64, max_steps: u64) -> SeedReport {
    let mut s = Sim::new(seed);
    s.report.seed = seed;
    s.run(max_steps);
    s.report
}
