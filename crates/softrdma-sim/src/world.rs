//! Endpoints with QPs, SRQs and memory, joined by a [`Network`] and driven in virtual time.
//!
//! One [`World::step`] delivers one packet or fires the due timers, after pumping every QP's
//! transmissions into the network and collecting every completion. Nothing reads a clock:
//! a seed reproduces the run.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use softrdma::mem::Access;
use softrdma::rc::{Mtu, Qp, QpAttr, QpCap, QpInit, Srq, WorkCompletion};
use softrdma::wire::{Error as WireError, IcrcContext, Packet};

use crate::memory::SimMemory;
use crate::net::{Faults, Network};
use crate::rng::Rng;

/// A QP's address in the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpRef {
    /// Endpoint index.
    pub ep: usize,
    /// QP index within the endpoint.
    pub qp: usize,
}

/// A completion and the QP it came from.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// Where.
    pub at: QpRef,
    /// What.
    pub wc: WorkCompletion,
}

/// One host: an address, memory, QPs and SRQs.
#[derive(Debug)]
pub struct Endpoint {
    /// IPv4 address (its GID).
    pub ip: Ipv4Addr,
    /// Registered memory.
    pub mem: SimMemory,
    /// Queue pairs.
    pub qps: Vec<Qp>,
    /// Shared receive queues.
    pub srqs: Vec<Srq>,
    qp_srq: Vec<Option<usize>>,
    peer: Vec<Option<usize>>,
}

/// Connection parameters applied to both QPs of a pair.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    /// Path MTU.
    pub mtu: Mtu,
    /// ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
    /// RNR timer code.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic limit (both directions).
    pub max_rd_atomic: u8,
    /// Remote rights granted by both QPs.
    pub access: Access,
    /// Initial PSN of the first QP's send queue.
    pub psn_a: u32,
    /// Initial PSN of the second QP's send queue.
    pub psn_b: u32,
}

impl Default for ConnOpts {
    fn default() -> ConnOpts {
        ConnOpts {
            mtu: Mtu::Mtu1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            psn_a: 0x00ff_fff0,
            psn_b: 100,
        }
    }
}

/// World counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorldStats {
    /// Steps taken.
    pub steps: u64,
    /// Packets rejected by the ICRC check.
    pub icrc_rejected: u64,
    /// Packets rejected by parsing.
    pub malformed: u64,
    /// Corrupted packets that passed (only possible when the flipped bit is one the ICRC
    /// masks, FECN/BECN in BTH byte 4); anything else is an invariant violation.
    pub corrupt_accepted: u64,
    /// Packets for no QP.
    pub unroutable: u64,
}

/// The simulated world.
#[derive(Debug)]
pub struct World {
    /// Virtual time (ns).
    pub now: u64,
    /// Hosts.
    pub eps: Vec<Endpoint>,
    /// The network.
    pub net: Network,
    /// Completions not yet taken by the harness.
    pub completions: VecDeque<Completion>,
    /// Counters.
    pub stats: WorldStats,
    /// Set when a corrupted packet other than a masked-bit flip got through the ICRC check.
    pub icrc_escape: Option<String>,
    buf: Vec<u8>,
}

impl World {
    /// An empty world with a seeded network.
    pub fn new(seed: u64, faults: Faults) -> World {
        World {
            now: 0,
            eps: Vec::new(),
            net: Network::new(Rng::new(seed ^ 0x6e65_7477_6f72_6b00), faults),
            completions: VecDeque::new(),
            stats: WorldStats::default(),
            icrc_escape: None,
            buf: vec![0u8; 4096 + 128],
        }
    }

    /// Add a host at 10.0.0.(n+1).
    pub fn add_endpoint(&mut self) -> usize {
        let n = self.eps.len();
        self.eps.push(Endpoint {
            ip: Ipv4Addr::new(10, 0, 0, n as u8 + 1),
            mem: SimMemory::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            qp_srq: Vec::new(),
            peer: Vec::new(),
        });
        n
    }

    /// Add an SRQ to a host; returns its index.
    pub fn add_srq(&mut self, ep: usize, max_wr: usize) -> usize {
        let e = &mut self.eps[ep];
        let id = e.srqs.len() as u32 + 1;
        e.srqs.push(Srq::new(id, max_wr, 4));
        e.srqs.len() - 1
    }

    /// Create a QP (PD 1) on a host, optionally on an SRQ (by index).
    pub fn create_qp(&mut self, ep: usize, cap: QpCap, srq: Option<usize>) -> QpRef {
        let e = &mut self.eps[ep];
        let qpn = 0x11 + (ep as u32) * 0x100 + e.qps.len() as u32;
        let srq_id = srq.map(|s| e.srqs[s].id());
        let qp = Qp::new(QpInit {
            qp_num: qpn,
            pd: 1,
            cap,
            srq: srq_id,
            sq_sig_all: false,
            qp_type: Default::default(),
        })
        .expect("valid caps");
        e.qps.push(qp);
        e.qp_srq.push(srq);
        e.peer.push(None);
        QpRef {
            ep,
            qp: e.qps.len() - 1,
        }
    }

    /// The QP at `r`.
    pub fn qp(&mut self, r: QpRef) -> &mut Qp {
        &mut self.eps[r.ep].qps[r.qp]
    }

    /// Bring two QPs to RTS connected to each other.
    pub fn connect(&mut self, a: QpRef, b: QpRef, o: ConnOpts) {
        let (ia, ib) = (self.eps[a.ep].ip, self.eps[b.ep].ip);
        let (qa, qb) = (self.qp(a).qp_num(), self.qp(b).qp_num());
        let sides = [
            (a, ia, ib, qb, o.psn_a, o.psn_b),
            (b, ib, ia, qa, o.psn_b, o.psn_a),
        ];
        for (r, local, remote, dest, sq_psn, rq_psn) in sides {
            let qpn = self.qp(r).qp_num();
            let port = 0xc000 | (qpn as u16 & 0x3fff);
            let attr = QpAttr {
                qp_access_flags: o.access,
                av: Some(IcrcContext::v4(local, remote, port)),
                path_mtu: o.mtu,
                timeout: o.timeout,
                retry_cnt: o.retry_cnt,
                rnr_retry: o.rnr_retry,
                rq_psn,
                sq_psn,
                max_rd_atomic: o.max_rd_atomic,
                max_dest_rd_atomic: o.max_rd_atomic,
                min_rnr_timer: o.min_rnr_timer,
                dest_qp_num: dest,
                ..QpAttr::default()
            };
            self.qp(r).connect(&attr).expect("RESET->RTS");
        }
        self.eps[a.ep].peer[a.qp] = Some(b.ep);
        self.eps[b.ep].peer[b.qp] = Some(a.ep);
    }

    /// Move every QP's packets into the network and every completion into `completions`.
    pub fn pump(&mut self) {
        let now = self.now;
        for (ei, e) in self.eps.iter_mut().enumerate() {
            for qi in 0..e.qps.len() {
                let Some(dst) = e.peer[qi] else { continue };
                let qp = &mut e.qps[qi];
                let icrc = qp.attr().av;
                if self.buf.len() < qp.max_packet_len() {
                    self.buf.resize(qp.max_packet_len(), 0);
                }
                while let Some(n) = qp.poll_transmit(now, &e.mem, &mut self.buf) {
                    if let Some(ctx) = icrc {
                        self.net.send(now, ei, dst, ctx, &self.buf[..n]);
                    }
                }
                while let Some(wc) = qp.poll_completion() {
                    self.completions.push_back(Completion {
                        at: QpRef { ep: ei, qp: qi },
                        wc,
                    });
                }
            }
        }
    }

    /// The next instant anything happens.
    pub fn next_event(&self) -> Option<u64> {
        let timers = self
            .eps
            .iter()
            .flat_map(|e| e.qps.iter())
            .filter_map(|q| q.poll_timeout())
            .min();
        softrdma::rc::timer::earliest(timers, self.net.next_arrival())
    }

    /// Deliver one packet or fire due timers. Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.pump();
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        self.stats.steps += 1;
        let now = self.now;
        if let Some(p) = self.net.pop_due(now) {
            self.deliver(&p.data, p.dst, p.icrc, p.corrupted);
            self.net.recycle(p.data);
        } else {
            for e in &mut self.eps {
                for qp in &mut e.qps {
                    if qp.poll_timeout().is_some_and(|d| d <= now) {
                        qp.handle_timeout(now);
                    }
                }
            }
        }
        self.pump();
        true
    }

    fn deliver(&mut self, data: &[u8], dst: usize, icrc: IcrcContext, corrupted: Option<bool>) {
        let pkt = match Packet::parse_verified(&icrc, data) {
            Ok(p) => p,
            Err(WireError::BadIcrc { .. }) => {
                self.stats.icrc_rejected += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        match corrupted {
            Some(true) => self.stats.corrupt_accepted += 1,
            Some(false) => {
                self.icrc_escape = Some(format!("corrupted packet accepted: {:?}", pkt.hdr.bth));
            }
            None => {}
        }
        let e = &mut self.eps[dst];
        let Some(qi) = e.qps.iter().position(|q| q.qp_num() == pkt.hdr.bth.dest_qp) else {
            self.stats.unroutable += 1;
            return;
        };
        let srq = e.qp_srq[qi].map(|s| &mut e.srqs[s]);
        e.qps[qi].handle_packet(self.now, &pkt, &e.mem, srq);
    }

    /// Step until nothing is left to happen or `max_steps` steps were taken; returns the steps.
    pub fn run(&mut self, max_steps: u64) -> u64 {
        let mut n = 0;
        while n < max_steps && self.step() {
            n += 1;
        }
        n
    }

    /// Take the completions of one QP collected so far.
    pub fn take_completions(&mut self, r: QpRef) -> Vec<WorkCompletion> {
        let (mine, rest): (Vec<_>, Vec<_>) = self.completions.drain(..).partition(|c| c.at == r);
        self.completions = rest.into();
        mine.into_iter().map(|c| c.wc).collect()
    }
}
