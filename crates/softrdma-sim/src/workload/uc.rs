//! The UC workload: connected pairs of UC QPs send random SENDs and RDMA WRITEs (with and
//! without immediate, 0 B to eight MTUs, MTUs 256 to 4096) both ways over the faulty
//! network, and every copy of every packet is followed to its end.
//!
//! UC accepts a message only as an unbroken run: its packets, each once, one after the other
//! in PSN order, the first one starting the message whatever PSN the receiver expected (it
//! resynchronises there). The checker follows, per receiving QP, the copies handed to it and
//! sees each such *clean run* end; against a model of the receive queue (receives are taken
//! in posting order, and one a cut message had started goes back to the head) it predicts:
//! - a clean SEND run finds no receive: dropped, `no_recv_drops`; a receive too short for it:
//!   dropped, `len_drops` (counted at the packet that overflows it); otherwise it completes
//!   the receive at the head;
//! - a clean WRITE run the receiver refuses (no remote-write right, a bad R_Key): dropped,
//!   `access_drops`; otherwise its bytes are all in place, and with immediate it completes
//!   the receive at the head, or, finding none, is counted in `no_recv_drops`;
//! - no other packet of a clean run moves a drop counter (its first may count the cut of a
//!   message in progress, `uc_gap_drops`), and nothing is ever sent back.
//!
//! Checked as the run goes:
//! - each packet sent is the next of the message posted (opcode and position, PSN, RETH on
//!   the first, immediate and SE on the last, length);
//! - every receive completion is predicted, from the end of a clean run: so a completed
//!   message never has a hole, whatever the network did; its bytes are exactly the bytes of
//!   the message (its header names it), its length, immediate and SE are the message's;
//! - a WRITE's target holds, byte by byte, its old contents or the WRITE's bytes (never
//!   anything else), all of them once a clean run ended;
//! - every send completes successfully, in posting order; guard bytes are never touched.
//!
//! At the end: every copy is accounted for once; a message completes at most once per copy
//! the network made of its packets; every message that did not complete either was dropped
//! by a counted reason at the end of a clean run, or never had one because the network lost,
//! corrupted, duplicated or reordered a packet of it or around it. On a perfect network every
//! message completes or is counted.

use std::collections::{HashMap, VecDeque};

use softrdma::mem::Access;
use softrdma::rc::{
    Mtu, PostError, QpCap, QpType, UnrelCounters, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use softrdma::wire::{HeaderRepr, OpKind, Position, Psn, Transport};

use super::unrel::{
    self, Ledger, Message, UnrelReport, Workload, add_unrel, check_counter_delta, complete_send,
    expected_recv, fault_desc, finish_start, maybe_partition, new_world, note, qp_name,
    unrel_delta, unrel_total, workload_state,
};
use crate::rng::Rng;
use crate::world::{ConnOpts, Fate, QpRef, World};

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
const BASE: u64 = 0x3_0000;
const TAG: u32 = 0x0c5e_11da;
const HDR: usize = 16;
const MAX_INLINE: u32 = 128;

/// How the application posts receives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UcOptions {
    /// Post receives whenever the receive queue takes them, even while a message holds one
    /// (more receives outstanding than `max_recv_wr`), instead of keeping at most
    /// `max_recv_wr` outstanding.
    pub greedy_receives: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
}

impl Kind {
    fn is_write(self) -> bool {
        matches!(self, Kind::Write | Kind::WriteImm)
    }
    fn has_imm(self) -> bool {
        matches!(self, Kind::SendImm | Kind::WriteImm)
    }
    /// Completes a receive.
    fn consumes_recv(self) -> bool {
        self != Kind::Write
    }
}

/// A clean run in progress at a receiver.
#[derive(Clone, Copy, Debug)]
struct Run {
    msg: usize,
    next: u32,
    dropped: Option<&'static str>,
    recv: Option<usize>,
}

struct UcQp {
    r: QpRef,
    qpn: u32,
    peer: usize,
    mtu: u32,
    /// This QP grants remote writes to its peer.
    grants_write: bool,
    /// PSN of the next packet sent.
    psn: Psn,
    /// Messages posted and not all sent: (message, next packet).
    unsent: VecDeque<(usize, u32)>,
    unretired: VecDeque<usize>,
    /// Receives posted and not completed, in order (the head may be held by a message).
    fifo: VecDeque<usize>,
    cap: usize,
    target: usize,
    rate: f64,
    run: Option<Run>,
    /// Receive completions predicted: (message, receive).
    expect: VecDeque<(usize, usize)>,
    /// Copies handed to this QP: (message, packet, late).
    log: Vec<(usize, u32, bool)>,
    max_msg: usize,
    /// Lengths of the last SENDs posted to it: a short receive is sized at one of them or
    /// one byte less.
    recent: VecDeque<usize>,
}

struct RecvBuf {
    key: u32,
    len: usize,
    done: bool,
}

struct Msg {
    kind: Kind,
    from: usize,
    to: usize,
    len: usize,
    npkts: u32,
    data: Vec<u8>,
    imm: Option<u32>,
    solicited: bool,
    signaled: bool,
    key: u32,
    /// WRITE: the target region (0: a bad R_Key was sent) and its old byte.
    target: u32,
    fill: u8,
    rkey: u32,
    pkts: Vec<u64>,
    completions: u32,
    clean_runs: u32,
    /// WRITE: a clean run placed its bytes.
    placed: bool,
    /// Why a clean run of it was dropped (the last reason).
    dropped: Option<&'static str>,
}

struct Sim {
    rng: Rng,
    w: World,
    opts: UcOptions,
    qps: Vec<UcQp>,
    msgs: Vec<Msg>,
    recvs: Vec<RecvBuf>,
    by_pkt: HashMap<u64, (usize, u32)>,
    ledger: Ledger,
    to_post: usize,
    perfect: bool,
    report: UnrelReport,
}

fn position(k: u32, n: u32) -> Position {
    match (k == 0, k + 1 == n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl Sim {
    fn new(seed: u64, opts: UcOptions) -> Sim {
        let (mut rng, faults, mut w) = new_world(seed);
        let neps = rng.range(2, 3) as usize;
        for _ in 0..neps {
            w.add_endpoint();
        }
        let npairs = rng.range(1, 3) as usize;
        let mut qps = Vec::new();
        let mut mtus = Vec::new();
        let mut no_write = 0;
        for _ in 0..npairs {
            let ea = rng.below(neps as u64) as usize;
            let eb = (ea + 1 + rng.below(neps as u64 - 1) as usize) % neps;
            let mtu = Mtu::ALL[rng.below(5) as usize];
            mtus.push(mtu.bytes());
            let mut refs = Vec::new();
            for ep in [ea, eb] {
                let cap = QpCap {
                    max_send_wr: 16,
                    max_recv_wr: rng.range(2, 12) as u32,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: MAX_INLINE,
                };
                refs.push((w.create_qp_of(ep, QpType::Uc, cap, None), cap.max_recv_wr));
            }
            let grants = rng.chance(0.92);
            no_write += usize::from(!grants);
            let o = ConnOpts {
                mtu,
                access: if grants { RW } else { Access::LOCAL_WRITE },
                psn_a: rng.below(1 << 24) as u32,
                psn_b: rng.below(1 << 24) as u32,
                ..ConnOpts::default()
            };
            w.connect(refs[0].0, refs[1].0, o);
            let base = qps.len();
            for (i, &(r, cap)) in refs.iter().enumerate() {
                qps.push(UcQp {
                    r,
                    qpn: w.qp(r).qp_num(),
                    peer: base + 1 - i,
                    mtu: mtu.bytes(),
                    grants_write: grants,
                    psn: Psn::new(if i == 0 { o.psn_a } else { o.psn_b }),
                    unsent: VecDeque::new(),
                    unretired: VecDeque::new(),
                    fifo: VecDeque::new(),
                    cap: cap as usize,
                    target: 0,
                    rate: 0.0,
                    run: None,
                    expect: VecDeque::new(),
                    log: Vec::new(),
                    max_msg: 8 * mtu.bytes() as usize,
                    recent: VecDeque::new(),
                });
            }
        }
        let partitioned = maybe_partition(&mut rng, &mut w);
        let n_ops = rng.range(40, 200) as usize;
        let perfect = faults.total() == 0.0 && !partitioned;
        let config = format!(
            "eps={neps} pairs={npairs} mtus={mtus:?} no_write_pairs={no_write} {} partition={partitioned} messages={n_ops}{}",
            fault_desc(&faults),
            if opts.greedy_receives {
                " greedy_receives"
            } else {
                ""
            }
        );
        let mut s = Sim {
            rng,
            w,
            opts,
            qps,
            msgs: Vec::new(),
            recvs: Vec::new(),
            by_pkt: HashMap::new(),
            ledger: Ledger::default(),
            to_post: n_ops,
            perfect,
            report: UnrelReport {
                seed,
                config,
                ..UnrelReport::default()
            },
        };
        s.repick_targets();
        s
    }

    fn pick_len(&mut self, mtu: u32) -> usize {
        let (r, m) = (&mut self.rng, u64::from(mtu));
        (match r.below(100) {
            0..8 => 0,
            8..38 => r.range(1, m),
            38..85 => r.range(m + 1, 4 * m),
            _ => r.range(4 * m + 1, 8 * m),
        }) as usize
    }

    /// A WRITE's target: every byte old or the WRITE's, all the WRITE's when `whole`.
    fn check_target(&mut self, m: usize, whole: bool) {
        let g = &self.msgs[m];
        if g.target == 0 {
            return;
        }
        let ep = self.qps[g.to].r.ep;
        let c = self.w.eps[ep].mem.contents(g.target);
        let bad = c[..g.len]
            .iter()
            .zip(&g.data)
            .position(|(&x, &d)| x != d && (whole || x != g.fill));
        if let Some(i) = bad {
            let s = format!(
                "WRITE {m} ({} B): target byte {i} is {:#04x}, want {:#04x}{}",
                g.len,
                c[i],
                g.data[i],
                if whole { "" } else { " or the old value" }
            );
            note(&mut self.report, &self.w, s);
        }
    }

    fn complete(&mut self, m: usize) {
        let g = &mut self.msgs[m];
        g.completions += 1;
        self.report.completed += 1;
        self.report.bytes += g.len as u64;
        if g.completions > 1 {
            self.report.duplicates += 1;
        }
    }

    /// Why message `m`, which never had a clean run, could not have one: the network lost,
    /// corrupted or duplicated a packet of it, or a copy out of order came among its packets.
    fn network_reason(&self, m: usize) -> Option<String> {
        let g = &self.msgs[m];
        for (k, id) in g.pkts.iter().enumerate() {
            let f = self.ledger.pkts.get(id).copied().unwrap_or_default();
            if f.handled != 1 {
                return Some(format!(
                    "packet {k} reached the receiver {} times",
                    f.handled
                ));
            }
        }
        let log = &self.qps[g.to].log;
        let at: Vec<usize> = (0..g.npkts)
            .filter_map(|k| log.iter().position(|&(x, y, _)| x == m && y == k))
            .collect();
        let (lo, hi) = (at.iter().min()?, at.iter().max()?);
        log[*lo..=*hi]
            .iter()
            .any(|&(_, _, late)| late)
            .then(|| "a copy out of order came among its packets".into())
    }
}

impl Workload for Sim {
    workload_state!("message", msgs);

    fn repick_targets(&mut self) {
        let extra = usize::from(self.opts.greedy_receives);
        for q in &mut self.qps {
            q.target = if self.rng.chance(0.1) {
                0
            } else {
                self.rng.range(1, (q.cap + extra) as u64) as usize
            };
            q.rate = 0.05 + self.rng.unit() * 0.9;
        }
    }

    fn post_recvs(&mut self) {
        for qi in 0..self.qps.len() {
            let q = &self.qps[qi];
            if q.fifo.len() >= q.target || !self.rng.chance(q.rate) {
                continue;
            }
            let max = q.max_msg;
            let near = (!q.recent.is_empty()).then(|| {
                let i = self.rng.below(q.recent.len() as u64) as usize;
                q.recent[i].saturating_sub(self.rng.below(2) as usize)
            });
            let len = match (self.rng.below(100), near) {
                (0..86, _) => max + self.rng.below(64) as usize,
                (86..94, Some(n)) => n,
                (86..98, _) => self.rng.below(max as u64) as usize,
                _ => 0,
            };
            let r = q.r;
            let mem = &self.w.eps[r.ep].mem;
            let key = mem.reg_mr(1, BASE, len.max(1), RW);
            let id = self.recvs.len();
            let w = &mut self.w;
            match unrel::post_recv(id, (BASE, key, len), |wr| w.qp(r).post_recv(wr)) {
                Ok(()) => {}
                Err(PostError::QueueFull) if self.opts.greedy_receives => {
                    self.w.eps[r.ep].mem.dereg(key);
                    continue;
                }
                Err(e) => {
                    note(
                        &mut self.report,
                        &self.w,
                        format!(
                            "post_recv on {} with {} outstanding refused: {e}",
                            qp_name(r),
                            self.qps[qi].fifo.len()
                        ),
                    );
                    self.w.eps[r.ep].mem.dereg(key);
                    continue;
                }
            }
            self.recvs.push(RecvBuf {
                key,
                len,
                done: false,
            });
            self.qps[qi].fifo.push_back(id);
        }
    }

    fn post_one(&mut self) -> bool {
        let fi = self.rng.below(self.qps.len() as u64) as usize;
        let (from, ti) = (self.qps[fi].r, self.qps[fi].peer);
        if self.w.qp(from).send_queue_len() >= 12 {
            return false;
        }
        let to = self.qps[ti].r;
        let kind = match self.rng.below(100) {
            0..35 => Kind::Send,
            35..50 => Kind::SendImm,
            50..80 => Kind::Write,
            _ => Kind::WriteImm,
        };
        let mtu = self.qps[fi].mtu;
        let len = self.pick_len(mtu);
        let id = self.msgs.len();
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data);
        let fill = self.rng.next_u64() as u8;
        if kind.is_write() {
            // A written byte never looks like an old one.
            for b in &mut data {
                if *b == fill {
                    *b ^= 0x80;
                }
            }
        }
        if len >= HDR {
            let h = [
                id as u32,
                len as u32,
                TAG ^ id as u32 ^ len as u32,
                self.qps[fi].qpn,
            ];
            for (i, v) in h.iter().enumerate() {
                data[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            if kind.is_write() {
                for b in &mut data[..HDR] {
                    if *b == fill {
                        *b ^= 0x80;
                    }
                }
            }
        }
        let imm = kind.has_imm().then_some(TAG ^ id as u32);
        let solicited = self.rng.chance(0.3);
        let signaled = self.rng.chance(0.8);
        let inline = len as u32 <= MAX_INLINE && self.rng.chance(0.25);
        let (target, rkey) = if kind.is_write() {
            if self.rng.chance(0.03) {
                (0, 0x00ee_ee00 | self.rng.below(256) as u32)
            } else {
                let m = &self.w.eps[to.ep].mem;
                let k = m.reg_mr(1, BASE, len.max(1), RW);
                m.fill(k, 0, &vec![fill; len.max(1)]);
                (k, k)
            }
        } else {
            (0, 0)
        };
        let op = match (kind, imm) {
            (Kind::Send, _) => WrOpcode::Send,
            (Kind::SendImm, Some(imm)) => WrOpcode::SendWithImm { imm },
            (Kind::WriteImm, Some(imm)) => WrOpcode::RdmaWriteWithImm {
                remote_addr: BASE,
                rkey,
                imm,
            },
            _ => WrOpcode::RdmaWrite {
                remote_addr: BASE,
                rkey,
            },
        };
        let m = Message {
            id,
            op,
            data: &data,
            inline,
            signaled,
            solicited,
            ud: None,
        };
        let (key, posted) = unrel::post_send(&mut self.w, from, (BASE, RW), m);
        if let Err(e) = posted {
            note(
                &mut self.report,
                &self.w,
                format!("post_send of message {id} ({len} B) refused: {e}"),
            );
            return false;
        }
        let npkts = (len.div_ceil(mtu as usize)).max(1) as u32;
        self.msgs.push(Msg {
            kind,
            from: fi,
            to: ti,
            len,
            npkts,
            data,
            imm,
            solicited,
            signaled,
            key,
            target,
            fill,
            rkey,
            pkts: Vec::new(),
            completions: 0,
            clean_runs: 0,
            placed: false,
            dropped: None,
        });
        self.qps[fi].unsent.push_back((id, 0));
        self.qps[fi].unretired.push_back(id);
        if !kind.is_write() {
            let r = &mut self.qps[ti].recent;
            if r.len() >= 8 {
                r.pop_front();
            }
            r.push_back(len);
        }
        self.to_post -= 1;
        self.report.ops += 1;
        true
    }

    fn check_step(&mut self) {
        unrel::check_step(self);
    }

    fn qp_index(&self, r: QpRef) -> Option<usize> {
        self.qps.iter().position(|q| q.r == r)
    }

    fn on_sent(
        &mut self,
        id: Option<u64>,
        from: QpRef,
        _to: Option<usize>,
        hdr: Option<HeaderRepr>,
        plen: usize,
    ) {
        let Some(fi) = self.qp_index(from) else {
            note(
                &mut self.report,
                &self.w,
                format!("a packet from unknown {}", qp_name(from)),
            );
            return;
        };
        let Some(&(m, k)) = self.qps[fi].unsent.front() else {
            note(
                &mut self.report,
                &self.w,
                format!("{} sent a packet with no message posted", qp_name(from)),
            );
            return;
        };
        let psn = self.qps[fi].psn;
        self.qps[fi].psn = psn.add(1);
        let g = &self.msgs[m];
        let pos = position(k, g.npkts);
        let mtu = self.qps[fi].mtu as usize;
        let want_len = (g.len - (k as usize * mtu).min(g.len)).min(mtu);
        let kind = if g.kind.is_write() {
            OpKind::Write
        } else {
            OpKind::Send
        };
        let peer = self.qps[self.qps[fi].peer].qpn;
        let ok = hdr.is_some_and(|h| {
            let info = h.bth.opcode.info();
            info.is_some_and(|i| {
                i.transport == Transport::Uc && i.kind == kind && i.position == pos
            }) && h.bth.dest_qp == peer
                && h.bth.psn == psn
                && h.immdt == if pos.ends() { g.imm } else { None }
                && h.bth.se
                    == (pos.ends() && g.solicited && (!g.kind.is_write() || g.imm.is_some()))
                && match (g.kind.is_write() && pos.starts(), h.reth) {
                    (true, Some(r)) => {
                        r.va == BASE && r.rkey == g.rkey && r.dma_len as usize == g.len
                    }
                    (false, None) => true,
                    _ => false,
                }
                && h.deth.is_none()
                && plen == want_len
        });
        if !ok {
            let s = format!(
                "message {m} {:?} ({} B) packet {k}/{} (PSN {psn:?}) sent as {hdr:?} with {plen} B",
                g.kind, g.len, g.npkts
            );
            note(&mut self.report, &self.w, s);
        }
        match id {
            Some(id) => {
                self.msgs[m].pkts.push(id);
                self.by_pkt.insert(id, (m, k));
            }
            None => note(
                &mut self.report,
                &self.w,
                format!("message {m}'s packet {k} went nowhere"),
            ),
        }
        let q = &mut self.qps[fi].unsent;
        if k + 1 >= self.msgs[m].npkts {
            q.pop_front();
        } else if let Some(f) = q.front_mut() {
            f.1 = k + 1;
        }
    }

    fn on_arrived(&mut self, id: u64, corrupted: Option<bool>, late: bool, fate: Fate) {
        if let Err(e) = self.ledger.on_arrived(id, corrupted, &fate) {
            note(&mut self.report, &self.w, e);
        }
        let Some(&(m, k)) = self.by_pkt.get(&id) else {
            note(
                &mut self.report,
                &self.w,
                format!("packet {id} arrived, never sent by a UC QP"),
            );
            return;
        };
        let (qp, before, after) = match fate {
            Fate::IcrcRejected | Fate::Malformed => return,
            Fate::Unroutable => {
                note(
                    &mut self.report,
                    &self.w,
                    format!("message {m}'s packet {k} found no QP"),
                );
                return;
            }
            Fate::Handled { qp, before, after } => (qp, before, after),
        };
        let ri = self.msgs[m].to;
        if self.qps[ri].r != qp {
            note(
                &mut self.report,
                &self.w,
                format!("message {m} handed to {}: misaddressed", qp_name(qp)),
            );
            return;
        }
        if let Err(e) = check_counter_delta(&before, &after) {
            note(
                &mut self.report,
                &self.w,
                format!("message {m} packet {k}: {e}"),
            );
        }
        if after.packets_dropped != before.packets_dropped {
            note(
                &mut self.report,
                &self.w,
                format!("message {m} packet {k} refused by its QP: {after:?}"),
            );
        }
        let delta = unrel_delta(&before.unrel, &after.unrel);
        self.qps[ri].log.push((m, k, late));
        let cont = self.qps[ri].run.is_some_and(|r| r.msg == m && r.next == k);
        if k == 0 {
            self.qps[ri].run = Some(Run {
                msg: m,
                next: 0,
                dropped: None,
                recv: None,
            });
        } else if !cont {
            self.qps[ri].run = None;
        }
        let Some(mut run) = self.qps[ri].run else {
            // Not part of a clean run: whatever the receiver does, it completes nothing (a
            // completion would find no prediction).
            return;
        };
        let g = &self.msgs[m];
        let last = k + 1 == g.npkts;
        let mut want = UnrelCounters::default();
        if run.dropped.is_none() {
            if g.kind.is_write() {
                if k == 0 && (!self.qps[ri].grants_write || (g.len > 0 && g.target == 0)) {
                    want.access_drops = 1;
                    run.dropped = Some("access");
                }
                if run.dropped.is_none() && last && g.kind == Kind::WriteImm {
                    match self.qps[ri].fifo.front() {
                        Some(&rv) => run.recv = Some(rv),
                        None => {
                            want.no_recv_drops = 1;
                            run.dropped = Some("no receive");
                        }
                    }
                }
            } else {
                if k == 0 {
                    match self.qps[ri].fifo.front() {
                        Some(&rv) => run.recv = Some(rv),
                        None => {
                            want.no_recv_drops = 1;
                            run.dropped = Some("no receive");
                        }
                    }
                }
                if let (None, Some(rv)) = (run.dropped, run.recv) {
                    let end = ((k as usize + 1) * self.qps[ri].mtu as usize).min(g.len);
                    if end > self.recvs[rv].len {
                        want.len_drops = 1;
                        run.dropped = Some("receive too short");
                    }
                }
            }
        }
        let gap_ok = delta.uc_gap_drops == 0 || (k == 0 && delta.uc_gap_drops == 1);
        let rest = UnrelCounters {
            uc_gap_drops: 0,
            ..delta
        };
        if rest != want || !gap_ok {
            let s = format!(
                "message {m} {:?} ({} B) packet {k}/{} in a clean run at {}: the rules say {want:?}, the counters moved by {delta:?}",
                g.kind,
                g.len,
                g.npkts,
                qp_name(qp)
            );
            note(&mut self.report, &self.w, s);
        }
        run.next = k + 1;
        self.qps[ri].run = Some(run);
        if !last {
            return;
        }
        self.qps[ri].run = None;
        let kind = g.kind;
        let g = &mut self.msgs[m];
        g.clean_runs += 1;
        if let Some(why) = run.dropped {
            g.dropped = Some(why);
        }
        if kind.is_write() && run.dropped != Some("access") {
            g.placed = true;
            self.check_target(m, true);
        }
        if run.dropped.is_none() && kind.consumes_recv() {
            self.qps[ri].fifo.pop_front();
            let rv = run.recv.unwrap_or(usize::MAX);
            self.qps[ri].expect.push_back((m, rv));
        }
        if run.dropped.is_none() && kind == Kind::Write {
            self.complete(m);
        }
    }

    fn on_recv_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let Some((ri, (m, rv))) = expected_recv(self, at, &wc, "message received whole") else {
            return;
        };
        let g = &self.msgs[m];
        let want = WorkCompletion {
            wr_id: rv as u64,
            status: WcStatus::Success,
            opcode: if g.kind == Kind::WriteImm {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            },
            byte_len: g.len as u32,
            imm_data: g.imm,
            invalidated_rkey: None,
            qp_num: self.qps[ri].qpn,
            src_qp: self.qps[g.from].qpn,
            solicited: g.solicited,
            grh: None,
        };
        if wc != want {
            note(
                &mut self.report,
                &self.w,
                format!(
                    "message {m} {:?} ({} B): completion {wc:?}, want {want:?}",
                    g.kind, g.len
                ),
            );
        }
        if g.kind == Kind::WriteImm {
            self.check_target(m, true);
        } else if let Some(b) = self.recvs.get(rv) {
            let c = self.w.eps[at.ep].mem.contents(b.key);
            if c.len() < g.len || c[..g.len] != g.data[..] {
                note(
                    &mut self.report,
                    &self.w,
                    format!(
                        "message {m} {:?} ({} B) received with other bytes",
                        g.kind, g.len
                    ),
                );
            } else if g.len >= HDR {
                let word = |i: usize| {
                    u32::from_le_bytes(c[4 * i..4 * i + 4].try_into().unwrap_or_default())
                };
                let (id, len) = (word(0), word(1));
                if id as usize != m || len as usize != g.len || word(2) != TAG ^ id ^ len {
                    note(
                        &mut self.report,
                        &self.w,
                        format!("message {m} received with the header of {id}"),
                    );
                }
            }
        }
        if let Some(b) = self.recvs.get_mut(rv) {
            b.done = true;
            let key = b.key;
            self.w.eps[at.ep].mem.dereg(key);
        }
        self.complete(m);
    }

    fn on_send_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let Some((_, id)) = complete_send(self, at, &wc) else {
            return;
        };
        let g = &self.msgs[id];
        let want = if g.kind.is_write() {
            WcOpcode::RdmaWrite
        } else {
            WcOpcode::Send
        };
        if wc.status != WcStatus::Success || wc.opcode != want || !g.signaled {
            note(
                &mut self.report,
                &self.w,
                format!("send of message {id} {:?} completed as {wc:?}", g.kind),
            );
        }
        self.retire(id);
    }

    fn retire(&mut self, m: usize) {
        let g = &self.msgs[m];
        if self.qps[g.from].unsent.iter().any(|&(x, _)| x == m) {
            note(
                &mut self.report,
                &self.w,
                format!("message {m} completed before all its packets were sent"),
            );
        }
        if g.key != 0 {
            let ep = self.qps[g.from].r.ep;
            self.w.eps[ep].mem.dereg(g.key);
        }
    }

    fn finish(&mut self) {
        if !finish_start(self) {
            return;
        }
        let mut v = Vec::new();
        for q in &self.qps {
            if !q.unsent.is_empty() || !q.unretired.is_empty() {
                v.push(format!(
                    "{}: messages {:?} never sent or completed",
                    qp_name(q.r),
                    q.unretired
                ));
            }
            if !q.expect.is_empty() {
                v.push(format!(
                    "{}: receives of messages {:?} never completed",
                    qp_name(q.r),
                    q.expect
                ));
            }
        }
        if let Err(e) = self.ledger.check_conservation() {
            v.push(e);
        }
        let mut dropped_clean = 0u64;
        for m in 0..self.msgs.len() {
            let g = &self.msgs[m];
            if g.kind.is_write() {
                self.check_target(m, g.placed);
                let g = &self.msgs[m];
                if g.dropped == Some("access") && g.target != 0 {
                    let ep = self.qps[g.to].r.ep;
                    let c = self.w.eps[ep].mem.contents(g.target);
                    if c[..g.len].iter().any(|&x| x != g.fill) {
                        v.push(format!("WRITE {m}, refused, changed its target"));
                    }
                }
            }
            let g = &self.msgs[m];
            // A message completes at most once per copy of each of its packets.
            let fewest = g
                .pkts
                .iter()
                .map(|id| self.ledger.pkts.get(id).map_or(0, |f| f.handled))
                .min()
                .unwrap_or(0);
            if g.completions > fewest {
                v.push(format!(
                    "message {m} completed {} times; a packet of it reached the receiver {fewest} times",
                    g.completions
                ));
            }
            if g.completions > 0 {
                continue;
            }
            if g.clean_runs > 0 {
                dropped_clean += 1;
                if g.dropped.is_none() {
                    v.push(format!(
                        "message {m} {:?} arrived whole and never completed",
                        g.kind
                    ));
                }
                continue;
            }
            self.report.network_lost += 1;
            if self.perfect {
                v.push(format!(
                    "message {m} {:?} ({} B) never arrived whole on a perfect network",
                    g.kind, g.len
                ));
            } else if self.network_reason(m).is_none() {
                v.push(format!(
                    "message {m} {:?} ({} B): every packet reached the receiver once, in order, and it never completed",
                    g.kind, g.len
                ));
            }
        }
        let mut drops = UnrelCounters::default();
        for q in &self.qps {
            add_unrel(&mut drops, &self.w.eps[q.r.ep].qps[q.r.qp].counters().unrel);
            let c = self.w.eps[q.r.ep].qps[q.r.qp].counters();
            self.report.wrong_qp += c.packets_dropped;
        }
        // On a perfect network the counters name exactly the messages that did not complete.
        let dropped_counted = drops.no_recv_drops + drops.len_drops + drops.access_drops;
        if self.perfect
            && (unrel_total(&drops) != dropped_counted || dropped_counted != dropped_clean)
        {
            v.push(format!(
                "{dropped_clean} messages dropped whole, counters {drops:?}"
            ));
        }
        for s in v {
            if self.report.violations.len() < 16 {
                self.report.violations.push(s);
            }
        }
        self.report.drops = drops;
        self.report.unroutable = self.w.stats.unroutable;
    }
}

/// Run one UC seed with at most `max_steps` steps.
pub fn run_uc_seed(seed: u64, max_steps: u64) -> UnrelReport {
    run_uc_seed_with(seed, max_steps, UcOptions::default())
}

/// [`run_uc_seed`] with receive-posting options.
pub fn run_uc_seed_with(seed: u64, max_steps: u64, opts: UcOptions) -> UnrelReport {
    let mut s = Sim::new(seed, opts);
    let burst = 0.05 + s.rng.unit() * 0.4;
    unrel::run(&mut s, max_steps, burst, 3);
    s.report
}
