//! The UD workload: hosts with UD QPs (some on an SRQ) send random datagrams to one another
//! over the faulty network, and every copy of every packet is followed to its end.
//!
//! A seed fixes the hosts (2-4, one or two UD QPs each, a port MTU each), the Q_Keys (two
//! values shared among the QPs), the faults and partitions, the datagrams (0 B to the port
//! MTU, SEND or SEND with immediate, solicited or not, signaled or not, from a buffer or
//! inline) with their Q_Key (the receiver's, a wrong one, or one with the high bit set: the
//! sender's own) and their destination (mostly a UD QP, sometimes a QP of another type, a
//! QPN no host has, an address no host has), and the receives (posted at random rates to
//! queues of random depths, so that queues run dry; a few too short).
//!
//! A network duplicate is a new datagram to UD: nothing tells the receiver it saw it before
//! (UD has no sequence), so it is delivered again when a receive is there for it. The checks
//! allow exactly that: a datagram is delivered at most once per copy the network handed on.
//!
//! Checked as the run goes, for every packet copy the receiving host handles, against a model
//! of the receive queues (the rules of `softrdma::rc::unreliable`: a datagram longer than the
//! receiver's MTU is malformed; one whose Q_Key is not the QP's is dropped; one that finds no
//! receive is dropped; one longer than the receive at the head (GRH area included) is
//! dropped and the receive stays; otherwise it takes the head receive):
//! - the packet a QP sends is the datagram posted (opcode, destination QPN, PSN, Q_Key,
//!   source QP, immediate, SE, length) and goes to the host its address vector names;
//! - the receiver's counters move by exactly the drop the model predicts, or not at all when
//!   the datagram is delivered, and nothing is ever sent back;
//! - a receive completion is the one predicted: the receive at the head, `grh`, the sender's
//!   QPN as `src_qp`, 40 + payload bytes, the immediate and SE sent; its GRH area holds an
//!   IPv4 header naming the sender's and the receiver's addresses; its payload is the
//!   datagram's bytes (its tag names it); the rest of the buffer is untouched;
//! - so no datagram is ever delivered corrupted, misaddressed, with a wrong Q_Key, or more
//!   often than the network copied it;
//! - every send completes successfully, in posting order; guard bytes are never touched.
//!
//! At the end, every copy is accounted for once: offered = delivered + lost or partitioned
//! by the network + refused for a flipped bit + not routable + counted drops.

use std::collections::{HashMap, VecDeque};

use softrdma::mem::Access;
use softrdma::rc::{
    GRH_LEN, Mtu, NetworkHdr, PostError, QpCap, QpType, SendWr, Sge, UdDest, UnrelCounters,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use softrdma::wire::{HeaderRepr, Opcode, Psn};

use super::unrel::{
    self, Ledger, Message, UnrelReport, Workload, add_unrel, check_counter_delta, check_grh,
    complete_send, expected_recv, fault_desc, finish_start, maybe_partition, new_world, note,
    qp_name, udp_len, unrel_delta, workload_state,
};
use crate::rng::Rng;
use crate::world::{Fate, QpRef, World};

const ACCESS: Access = Access(Access::LOCAL_WRITE.0);
const BASE: u64 = 0x2_0000;
const TAG: u32 = 0xd47a_9ee5;
const MAX_INLINE: u32 = 128;

struct UdQp {
    r: QpRef,
    qpn: u32,
    qkey: u32,
    mtu: u32,
    queue: usize,
    /// PSN of the next datagram.
    psn: Psn,
    /// Datagrams posted and not yet seen on the wire, in order.
    unsent: VecDeque<usize>,
    /// Datagrams whose send WQE has not completed, in order.
    unretired: VecDeque<usize>,
    /// Receive completions predicted and not yet seen: (datagram, receive).
    expect: VecDeque<(usize, usize)>,
}

/// A receive queue: a QP's own or an SRQ.
struct Queue {
    ep: usize,
    srq: Option<usize>,
    qp: Option<QpRef>,
    fifo: VecDeque<usize>,
    cap: usize,
    target: usize,
    rate: f64,
    /// Lengths of the last datagrams posted to its QPs: a short receive is sized for one of
    /// them (GRH area included) or one byte less.
    recent: VecDeque<usize>,
}

struct RecvBuf {
    key: u32,
    len: usize,
    fill: u8,
    done: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// A UD QP of the workload (index).
    Qp(usize),
    /// A QP of another type or state.
    Decoy(QpRef),
    /// A host, and a QPN it has not.
    NoQp(usize),
    /// An address no host has.
    NoRoute,
}

struct Dgram {
    from: usize,
    dest: Dest,
    remote_qpn: u32,
    len: usize,
    data: Vec<u8>,
    imm: Option<u32>,
    solicited: bool,
    signaled: bool,
    /// The Q_Key the packet carries (the sender's own for a high-bit Q_Key).
    qkey: u32,
    key: u32,
    pkt: Option<u64>,
    delivered: u32,
}

/// What a receiver does with a datagram, by the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Deliver(usize),
    Malformed,
    Qkey,
    NoRecv,
    Len,
}

struct Sim {
    rng: Rng,
    w: World,
    qps: Vec<UdQp>,
    queues: Vec<Queue>,
    recvs: Vec<RecvBuf>,
    dgrams: Vec<Dgram>,
    by_pkt: HashMap<u64, usize>,
    ledger: Ledger,
    decoys: Vec<QpRef>,
    qkeys: [u32; 2],
    to_post: usize,
    big_recv: usize,
    report: UnrelReport,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let (mut rng, faults, mut w) = new_world(seed);
        let neps = rng.range(2, 4) as usize;
        let same_mtu = rng.chance(0.7);
        let mtu0 = Mtu::ALL[rng.below(5) as usize];
        let k0 = rng.next_u64() as u32 & 0x7fff_ffff;
        let qkeys = [k0, k0 ^ (1 + rng.below(0x7fff_fffe) as u32)];
        let mut qps = Vec::new();
        let mut queues = Vec::new();
        let mut mtus = Vec::new();
        for _ in 0..neps {
            let ep = w.add_endpoint();
            let mtu = if same_mtu {
                mtu0
            } else {
                Mtu::ALL[rng.below(5) as usize]
            };
            mtus.push(mtu.bytes());
            let srq = rng.chance(0.3).then(|| {
                let cap = rng.range(4, 16) as usize;
                let s = w.add_srq(ep, cap);
                queues.push(Queue {
                    ep,
                    srq: Some(s),
                    qp: None,
                    fifo: VecDeque::new(),
                    cap,
                    target: 0,
                    rate: 0.0,
                    recent: VecDeque::new(),
                });
                queues.len() - 1
            });
            for _ in 0..rng.range(1, 2) {
                let recv_cap = rng.range(2, 16) as u32;
                let cap = QpCap {
                    max_send_wr: 16,
                    max_recv_wr: if srq.is_some() { 0 } else { recv_cap },
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: MAX_INLINE,
                };
                let on_srq = srq.map(|q| queues[q].srq.unwrap_or(0));
                let r = w.create_qp_of(ep, QpType::Ud, cap, on_srq);
                let qkey = if rng.chance(0.8) { qkeys[0] } else { qkeys[1] };
                let psn = rng.below(1 << 24) as u32;
                w.bring_up_ud(r, qkey, mtu, psn);
                let queue = match srq {
                    Some(q) => q,
                    None => {
                        queues.push(Queue {
                            ep,
                            srq: None,
                            qp: Some(r),
                            fifo: VecDeque::new(),
                            cap: recv_cap as usize,
                            target: 0,
                            rate: 0.0,
                            recent: VecDeque::new(),
                        });
                        queues.len() - 1
                    }
                };
                qps.push(UdQp {
                    r,
                    qpn: w.qp(r).qp_num(),
                    qkey,
                    mtu: mtu.bytes(),
                    queue,
                    psn: Psn::new(psn),
                    unsent: VecDeque::new(),
                    unretired: VecDeque::new(),
                    expect: VecDeque::new(),
                });
            }
        }
        // A QP of another type (never brought up) that some datagrams are sent to.
        let dep = rng.below(neps as u64) as usize;
        let decoy_type = if rng.chance(0.5) {
            QpType::Rc
        } else {
            QpType::Uc
        };
        let decoys = vec![w.create_qp_of(dep, decoy_type, QpCap::default(), None)];
        let partitioned = maybe_partition(&mut rng, &mut w);
        let n_ops = rng.range(100, 400) as usize;
        let config = format!(
            "eps={neps} ud_qps={} queues={} mtus={mtus:?} {} partition={partitioned} datagrams={n_ops}",
            qps.len(),
            queues.len(),
            fault_desc(&faults),
        );
        let big_recv = GRH_LEN + *mtus.iter().max().unwrap_or(&4096) as usize;
        let mut s = Sim {
            rng,
            w,
            qps,
            queues,
            recvs: Vec::new(),
            dgrams: Vec::new(),
            by_pkt: HashMap::new(),
            ledger: Ledger::default(),
            decoys,
            qkeys,
            to_post: n_ops,
            big_recv,
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
        let r = &mut self.rng;
        match r.below(100) {
            0..8 => 0,
            8..20 => r.range(1, 7) as usize,
            20..65 => r.range(8, 256.min(u64::from(mtu))) as usize,
            65..92 => r.range(8, u64::from(mtu)) as usize,
            _ => mtu as usize,
        }
    }

    /// A datagram longer than the port MTU is refused at posting.
    fn post_too_long(&mut self, fi: usize) -> bool {
        let (from, mtu) = (self.qps[fi].r, self.qps[fi].mtu);
        let len = mtu as usize + self.rng.range(1, 64) as usize;
        let key = self.w.eps[from.ep].mem.reg_mr(1, BASE, len, ACCESS);
        let sge = [Sge {
            addr: BASE,
            length: len as u32,
            lkey: key,
        }];
        let ud = self.w.ud_dest(from, from, self.qps[fi].qkey);
        let wr = SendWr::new(u64::MAX, WrOpcode::Send).sg(&sge).ud(ud);
        let got = self.w.qp(from).post_send(&wr);
        self.w.eps[from.ep].mem.dereg(key);
        let want = Err(PostError::MessageTooLong {
            len: len as u64,
            max: mtu,
        });
        if got != want {
            note(
                &mut self.report,
                &self.w,
                format!("a {len}-byte UD SEND on a port MTU of {mtu}: {got:?}, want {want:?}"),
            );
        }
        self.report.refused_posts += 1;
        true
    }

    /// What the rules say receiver `ri` does with datagram `d` now.
    fn predict(&self, ri: usize, d: usize) -> Outcome {
        let (q, g) = (&self.qps[ri], &self.dgrams[d]);
        if g.len > q.mtu as usize {
            return Outcome::Malformed;
        }
        if g.qkey != q.qkey {
            return Outcome::Qkey;
        }
        let Some(&head) = self.queues[q.queue].fifo.front() else {
            return Outcome::NoRecv;
        };
        if self.recvs[head].len < GRH_LEN + g.len {
            return Outcome::Len;
        }
        Outcome::Deliver(head)
    }
}

impl Workload for Sim {
    workload_state!("datagram", dgrams);

    /// New receive-queue depths and posting rates: some queues run dry.
    fn repick_targets(&mut self) {
        for q in &mut self.queues {
            q.target = if self.rng.chance(0.15) {
                0
            } else {
                self.rng.range(1, q.cap as u64) as usize
            };
            q.rate = 0.05 + self.rng.unit() * 0.9;
        }
    }

    fn post_recvs(&mut self) {
        for qi in 0..self.queues.len() {
            let q = &self.queues[qi];
            if q.fifo.len() >= q.target || !self.rng.chance(q.rate) {
                continue;
            }
            let near = (!q.recent.is_empty()).then(|| {
                let i = self.rng.below(q.recent.len() as u64) as usize;
                GRH_LEN + q.recent[i] - self.rng.below(2) as usize
            });
            let len = match (self.rng.below(1000), near) {
                (0..955, _) => self.big_recv + self.rng.below(64) as usize,
                (955..985, Some(n)) => n,
                (955..998, _) => self.rng.range(GRH_LEN as u64, self.big_recv as u64 - 1) as usize,
                _ => self.rng.below(GRH_LEN as u64) as usize,
            };
            let fill = self.rng.next_u64() as u8;
            let ep = self.queues[qi].ep;
            let mem = &self.w.eps[ep].mem;
            let key = mem.reg_mr(1, BASE, len.max(1), ACCESS);
            mem.fill(key, 0, &vec![fill; len.max(1)]);
            let id = self.recvs.len();
            let (w, q) = (&mut self.w, &self.queues[qi]);
            let posted = unrel::post_recv(id, (BASE, key, len), |wr| match (q.srq, q.qp) {
                (Some(s), _) => w.eps[ep].srqs[s].post_recv(wr),
                (None, Some(r)) => w.qp(r).post_recv(wr),
                (None, None) => Err(PostError::QueueFull),
            });
            if let Err(e) = posted {
                note(
                    &mut self.report,
                    &self.w,
                    format!("post_recv to queue {qi} refused: {e}"),
                );
                self.w.eps[ep].mem.dereg(key);
                continue;
            }
            self.recvs.push(RecvBuf {
                key,
                len,
                fill,
                done: false,
            });
            self.queues[qi].fifo.push_back(id);
        }
    }

    /// Post one datagram from a random QP (false when its send queue is busy).
    fn post_one(&mut self) -> bool {
        let fi = self.rng.below(self.qps.len() as u64) as usize;
        let from = self.qps[fi].r;
        if self.w.qp(from).send_queue_len() >= 12 {
            return false;
        }
        let mtu = self.qps[fi].mtu;
        if self.rng.chance(0.02) {
            return self.post_too_long(fi);
        }
        let dest = match self.rng.below(100) {
            0..94 => Dest::Qp(self.rng.below(self.qps.len() as u64) as usize),
            94..97 => Dest::Decoy(self.decoys[0]),
            97..99 => Dest::NoQp(self.rng.below(self.w.eps.len() as u64) as usize),
            _ => Dest::NoRoute,
        };
        let own = self.qps[fi].qkey;
        let (remote_qkey, qkey) = match (self.rng.below(100), dest) {
            (0..72, Dest::Qp(t)) => (self.qps[t].qkey, self.qps[t].qkey),
            (0..72, _) => (self.qkeys[0], self.qkeys[0]),
            (72..86, _) => {
                let k = 0x8000_0000 | self.rng.next_u64() as u32;
                (k, own)
            }
            _ => {
                let k = if self.rng.chance(0.5) {
                    self.qkeys[1 - usize::from(own == self.qkeys[1])]
                } else {
                    self.rng.next_u64() as u32 & 0x7fff_ffff
                };
                (k, k)
            }
        };
        let ud: UdDest = match dest {
            Dest::Qp(t) => self.w.ud_dest(from, self.qps[t].r, remote_qkey),
            Dest::Decoy(r) => self.w.ud_dest(from, r, remote_qkey),
            Dest::NoQp(ep) => {
                let ip = self.w.eps[ep].ip;
                self.w.ud_dest_ip(from, ip, 0x00ab_cd00, remote_qkey)
            }
            Dest::NoRoute => self
                .w
                .ud_dest_ip(from, [10, 0, 9, 9].into(), 0x11, remote_qkey),
        };
        let len = self.pick_len(mtu);
        let id = self.dgrams.len();
        let mut data = vec![0u8; len];
        self.rng.fill(&mut data);
        if len >= 8 {
            data[..4].copy_from_slice(&(id as u32).to_le_bytes());
            data[4..8].copy_from_slice(&(TAG ^ id as u32 ^ len as u32).to_le_bytes());
        }
        let imm = self.rng.chance(0.5).then(|| self.rng.next_u64() as u32);
        let solicited = self.rng.chance(0.3);
        let signaled = self.rng.chance(0.8);
        let inline = len as u32 <= MAX_INLINE && self.rng.chance(0.25);
        let op = match imm {
            Some(imm) => WrOpcode::SendWithImm { imm },
            None => WrOpcode::Send,
        };
        let m = Message {
            id,
            op,
            data: &data,
            inline,
            signaled,
            solicited,
            ud: Some(ud),
        };
        let (key, posted) = unrel::post_send(&mut self.w, from, (BASE, ACCESS), m);
        if let Err(e) = posted {
            note(
                &mut self.report,
                &self.w,
                format!("post_send of datagram {id} ({len} B) refused: {e}"),
            );
            if key != 0 {
                self.w.eps[from.ep].mem.dereg(key);
            }
            return false;
        }
        self.dgrams.push(Dgram {
            from: fi,
            dest,
            remote_qpn: ud.remote_qpn,
            len,
            data,
            imm,
            solicited,
            signaled,
            qkey,
            key,
            pkt: None,
            delivered: 0,
        });
        self.qps[fi].unsent.push_back(id);
        self.qps[fi].unretired.push_back(id);
        if let Dest::Qp(t) = dest {
            let r = &mut self.queues[self.qps[t].queue].recent;
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
        if self.w.stats.undirected > 0 {
            note(
                &mut self.report,
                &self.w,
                "a UD QP sent a packet without naming its destination".into(),
            );
        }
    }

    fn qp_index(&self, r: QpRef) -> Option<usize> {
        self.qps.iter().position(|q| q.r == r)
    }

    fn on_sent(
        &mut self,
        id: Option<u64>,
        from: QpRef,
        to: Option<usize>,
        hdr: Option<HeaderRepr>,
        payload_len: usize,
    ) {
        let Some(fi) = self.qp_index(from) else {
            note(
                &mut self.report,
                &self.w,
                format!("a packet from {}, which sends nothing", qp_name(from)),
            );
            return;
        };
        let Some(d) = self.qps[fi].unsent.pop_front() else {
            note(
                &mut self.report,
                &self.w,
                format!("{} sent a packet with no datagram posted", qp_name(from)),
            );
            return;
        };
        let psn = self.qps[fi].psn;
        self.qps[fi].psn = psn.add(1);
        let g = &self.dgrams[d];
        let want_to = match g.dest {
            Dest::Qp(t) => Some(self.qps[t].r.ep),
            Dest::Decoy(r) => Some(r.ep),
            Dest::NoQp(ep) => Some(ep),
            Dest::NoRoute => None,
        };
        let want_op = if g.imm.is_some() {
            Opcode::UD_SEND_ONLY_IMM
        } else {
            Opcode::UD_SEND_ONLY
        };
        let ok = hdr.is_some_and(|h| {
            h.bth.opcode == want_op
                && h.bth.dest_qp == g.remote_qpn
                && h.bth.psn == psn
                && h.bth.se == g.solicited
                && h.deth
                    .is_some_and(|x| x.qkey == g.qkey && x.src_qp == self.qps[fi].qpn)
                && h.immdt == g.imm
                && payload_len == g.len
        });
        if !ok || to != want_to {
            let s = format!(
                "datagram {d} ({} B, to {:?} QPN {:#x}, Q_Key {:#x}, imm {:?}, PSN {psn:?}) went to host {to:?} as {hdr:?} with {payload_len} B",
                g.len, g.dest, g.remote_qpn, g.qkey, g.imm
            );
            note(&mut self.report, &self.w, s);
        }
        match id {
            Some(id) => {
                self.dgrams[d].pkt = Some(id);
                self.by_pkt.insert(id, d);
            }
            None => self.report.no_route += 1,
        }
    }

    fn on_arrived(&mut self, id: u64, corrupted: Option<bool>, _late: bool, fate: Fate) {
        if let Err(e) = self.ledger.on_arrived(id, corrupted, &fate) {
            note(&mut self.report, &self.w, e);
        }
        let Some(&d) = self.by_pkt.get(&id) else {
            note(
                &mut self.report,
                &self.w,
                format!("packet {id} arrived, never sent by a UD QP"),
            );
            return;
        };
        let dest = self.dgrams[d].dest;
        match fate {
            Fate::IcrcRejected | Fate::Malformed => {}
            Fate::Unroutable => {
                self.report.unroutable += 1;
                if !matches!(dest, Dest::NoQp(_)) {
                    note(
                        &mut self.report,
                        &self.w,
                        format!("datagram {d} to {dest:?} found no QP"),
                    );
                }
            }
            Fate::Handled { qp, before, after } => {
                if let Err(e) = check_counter_delta(&before, &after) {
                    note(
                        &mut self.report,
                        &self.w,
                        format!("datagram {d} at {}: {e}", qp_name(qp)),
                    );
                }
                let delta = unrel_delta(&before.unrel, &after.unrel);
                let dropped = after.packets_dropped - before.packets_dropped;
                let ri = match dest {
                    Dest::Qp(t) if self.qps[t].r == qp => t,
                    Dest::Decoy(r) if r == qp => {
                        self.report.wrong_qp += dropped;
                        if dropped != 1 || delta != UnrelCounters::default() {
                            note(
                                &mut self.report,
                                &self.w,
                                format!(
                                    "datagram {d} to a QP of another type not refused: {before:?} -> {after:?}"
                                ),
                            );
                        }
                        return;
                    }
                    _ => {
                        note(
                            &mut self.report,
                            &self.w,
                            format!(
                                "datagram {d} for {dest:?} handed to {}: misaddressed",
                                qp_name(qp)
                            ),
                        );
                        return;
                    }
                };
                let out = self.predict(ri, d);
                let mut want = UnrelCounters::default();
                match out {
                    Outcome::Malformed => want.malformed = 1,
                    Outcome::Qkey => want.qkey_drops = 1,
                    Outcome::NoRecv => want.no_recv_drops = 1,
                    Outcome::Len => want.len_drops = 1,
                    Outcome::Deliver(rv) => {
                        let qi = self.qps[ri].queue;
                        self.queues[qi].fifo.pop_front();
                        self.qps[ri].expect.push_back((d, rv));
                    }
                }
                if delta != want || dropped != 0 {
                    let g = &self.dgrams[d];
                    let s = format!(
                        "datagram {d} ({} B, Q_Key {:#x}) at {} (Q_Key {:#x}, MTU {}): the rules say {out:?}, the counters moved by {delta:?} (+{dropped} refused)",
                        g.len,
                        g.qkey,
                        qp_name(qp),
                        self.qps[ri].qkey,
                        self.qps[ri].mtu
                    );
                    note(&mut self.report, &self.w, s);
                }
            }
        }
    }

    fn on_recv_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let Some((ri, (d, rv))) = expected_recv(self, at, &wc, "datagram delivered") else {
            return;
        };
        let g = &self.dgrams[d];
        let from = &self.qps[g.from];
        let want = WorkCompletion {
            wr_id: rv as u64,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: (GRH_LEN + g.len) as u32,
            imm_data: g.imm,
            invalidated_rkey: None,
            qp_num: self.qps[ri].qpn,
            src_qp: from.qpn,
            solicited: g.solicited,
            grh: Some(NetworkHdr::Ipv4),
        };
        if wc != want {
            note(
                &mut self.report,
                &self.w,
                format!(
                    "datagram {d} from {}: completion {wc:?}, want {want:?}",
                    qp_name(from.r)
                ),
            );
        }
        let buf = &self.recvs[rv];
        let got = self.w.eps[at.ep].mem.contents(buf.key);
        let got = &got[..buf.len];
        let (src, dst) = (self.w.eps[from.r.ep].ip, self.w.eps[at.ep].ip);
        let hdrs = 12 + 8 + if g.imm.is_some() { 4 } else { 0 };
        if let Err(e) = check_grh(&got[..GRH_LEN], src, dst, udp_len(hdrs, g.len)) {
            note(&mut self.report, &self.w, format!("datagram {d}: {e}"));
        }
        let payload = &got[GRH_LEN..GRH_LEN + g.len];
        if payload != &g.data[..] {
            note(
                &mut self.report,
                &self.w,
                format!("datagram {d} ({} B) delivered with other bytes", g.len),
            );
        } else if g.len >= 8 {
            let tag = u32::from_le_bytes(payload[..4].try_into().unwrap_or_default());
            let check = u32::from_le_bytes(payload[4..8].try_into().unwrap_or_default());
            if tag as usize != d || check != TAG ^ tag ^ g.len as u32 {
                note(
                    &mut self.report,
                    &self.w,
                    format!("datagram {d} delivered with the tag of {tag}"),
                );
            }
        }
        if got[GRH_LEN + g.len..].iter().any(|&b| b != buf.fill) {
            note(
                &mut self.report,
                &self.w,
                format!(
                    "datagram {d}: receive {rv} written past its {} bytes",
                    GRH_LEN + g.len
                ),
            );
        }
        let key = buf.key;
        self.recvs[rv].done = true;
        self.w.eps[at.ep].mem.dereg(key);
        let g = &mut self.dgrams[d];
        g.delivered += 1;
        self.report.completed += 1;
        self.report.bytes += g.len as u64;
        if g.delivered > 1 {
            self.report.duplicates += 1;
        }
    }

    fn on_send_wc(&mut self, at: QpRef, wc: WorkCompletion) {
        let Some((fi, id)) = complete_send(self, at, &wc) else {
            return;
        };
        if wc.status != WcStatus::Success
            || wc.opcode != WcOpcode::Send
            || wc.qp_num != self.qps[fi].qpn
        {
            note(
                &mut self.report,
                &self.w,
                format!("send of datagram {id} completed as {wc:?}"),
            );
        }
        if !self.dgrams[id].signaled {
            note(
                &mut self.report,
                &self.w,
                format!("unsignaled datagram {id} completed: {wc:?}"),
            );
        }
        self.retire(id);
    }

    fn retire(&mut self, d: usize) {
        let g = &self.dgrams[d];
        if self.qps[g.from].unsent.contains(&d) {
            note(
                &mut self.report,
                &self.w,
                format!("datagram {d} completed before it was sent"),
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
        for q in &self.qps {
            if !q.unsent.is_empty() || !q.unretired.is_empty() {
                let s = format!(
                    "{}: datagrams {:?} never sent or completed",
                    qp_name(q.r),
                    q.unretired
                );
                self.report.violations.push(s);
            }
            if !q.expect.is_empty() {
                let s = format!(
                    "{}: deliveries {:?} never completed",
                    qp_name(q.r),
                    q.expect
                );
                self.report.violations.push(s);
            }
        }
        if let Err(e) = self.ledger.check_conservation() {
            self.report.violations.push(e);
        }
        // A datagram is delivered at most once per copy the network handed on: twice only
        // when the network duplicated it.
        for (d, g) in self.dgrams.iter().enumerate() {
            let copies = g
                .pkt
                .and_then(|p| self.ledger.pkts.get(&p))
                .map_or(0, |f| f.handled);
            let dup = g
                .pkt
                .and_then(|p| self.ledger.pkts.get(&p))
                .is_some_and(|f| f.duplicated);
            if g.delivered > copies || g.delivered > 1 + u32::from(dup) {
                self.report.violations.push(format!(
                    "datagram {d} delivered {} times from {copies} copies (duplicated by the network: {dup})",
                    g.delivered
                ));
            }
            if copies == 0 && g.pkt.is_some() {
                self.report.network_lost += 1;
            }
        }
        // Receives never taken are untouched.
        for (i, b) in self.recvs.iter().enumerate() {
            if b.done {
                continue;
            }
            let ep = self
                .queues
                .iter()
                .find(|q| q.fifo.contains(&i))
                .map(|q| q.ep);
            let Some(ep) = ep else {
                self.report
                    .violations
                    .push(format!("receive {i} neither completed nor posted"));
                continue;
            };
            let c = self.w.eps[ep].mem.contents(b.key);
            if c[..b.len].iter().any(|&x| x != b.fill) {
                self.report
                    .violations
                    .push(format!("receive {i}, never completed, was written"));
            }
        }
        // Every copy accounted for: offered (+ duplicates) = delivered + lost, partitioned
        // or refused by the network + unroutable + refused by a QP + counted drops.
        let mut drops = UnrelCounters::default();
        let mut wrong_qp = 0;
        let mut handled = 0;
        for e in &self.w.eps {
            for q in &e.qps {
                add_unrel(&mut drops, &q.counters().unrel);
                wrong_qp += q.counters().packets_dropped;
                handled += q.counters().packets_received;
                if q.counters().packets_sent > 0 && q.qp_type() != QpType::Ud {
                    self.report
                        .violations
                        .push("a QP that only receives datagrams sent a packet".into());
                }
            }
        }
        let n = self.w.net.stats;
        let counted = super::unrel::unrel_total(&drops);
        let offered = n.sent + n.duplicated;
        let accounted = self.report.completed
            + n.lost
            + n.partitioned
            + self.w.stats.icrc_rejected
            + self.w.stats.malformed
            + self.w.stats.unroutable
            + wrong_qp
            + counted;
        if offered != accounted || handled != self.report.completed + wrong_qp + counted {
            self.report.violations.push(format!(
                "{offered} copies offered, {accounted} accounted for ({} delivered, {} lost, {} partitioned, {} refused by the ICRC check, {} malformed, {} unroutable, {wrong_qp} refused by a QP, {counted} counted drops {drops:?}); {handled} handled",
                self.report.completed,
                n.lost,
                n.partitioned,
                self.w.stats.icrc_rejected,
                self.w.stats.malformed,
                self.w.stats.unroutable
            ));
        }
        if self.report.no_route != self.w.stats.no_route {
            self.report
                .violations
                .push("no-route datagrams miscounted".into());
        }
        self.report.drops = drops;
        self.report.wrong_qp = wrong_qp;
    }
}

/// Run one UD seed with at most `max_steps` steps.
pub fn run_ud_seed(seed: u64, max_steps: u64) -> UnrelReport {
    let mut s = Sim::new(seed);
    let burst = 0.15 + s.rng.unit() * 0.5;
    unrel::run(&mut s, max_steps, burst, 4);
    s.report
}
