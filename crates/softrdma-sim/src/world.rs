//! Endpoints with QPs, SRQs and memory, joined by a [`Network`] and driven in virtual time.
//!
//! One [`World::step`] delivers one packet or fires the due timers, after pumping every QP's
//! transmissions into the network and collecting every completion. Nothing reads a clock:
//! a seed reproduces the run.
//!
//! RC and UC QPs are connected in pairs ([`World::connect`]) and send to their peer's host.
//! UD QPs ([`World::bring_up_ud`]) send each datagram to the host whose IPv4 address its
//! work request's address vector names (the driver asks [`Qp::next_datagram_dest`] before
//! each transmit poll), from their own host's address; every packet is handed to its QP with
//! the [`DatagramSource`] its IP header gives (the sender's and receiver's addresses), which a
//! UD receive's GRH area holds. With [`World::trace`] on, the world records what became of
//! every packet ([`TraceEvent`]).

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use softrdma::mem::Access;
use softrdma::rc::{
    DatagramSource, Mtu, Qp, QpAttr, QpCap, QpCounters, QpInit, QpType, Srq, UdDest, WorkCompletion,
};
use softrdma::wire::{
    AddressVector, Error as WireError, HeaderRepr, IcrcContext, IpHeader, Packet,
};

use crate::memory::SimMemory;
use crate::net::{Faults, InFlight, Network};
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

/// What became of a packet copy that left the network (see [`TraceEvent::Arrived`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a record drained every step: kept unboxed
pub enum Fate {
    /// Refused by the ICRC check.
    IcrcRejected,
    /// Refused by parsing.
    Malformed,
    /// No QP at the receiving host has the packet's destination QPN.
    Unroutable,
    /// Handed to this QP, whose counters were `before` and then `after`.
    Handled {
        /// The QP.
        qp: QpRef,
        /// Its counters before.
        before: QpCounters,
        /// Its counters after.
        after: QpCounters,
    },
}

/// One thing the world did with a packet, recorded when [`World::trace`] is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a record drained every step: kept unboxed
pub enum TraceEvent {
    /// A QP produced a packet.
    Sent {
        /// Its network send number; `None` when no host has the address it was sent to
        /// (a UD datagram addressed nowhere: nothing was offered to the network).
        id: Option<u64>,
        /// The QP that sent it.
        from: QpRef,
        /// The host it was sent to.
        to: Option<usize>,
        /// Its headers (parsed without the ICRC check), when they parse.
        hdr: Option<HeaderRepr>,
        /// Its payload length.
        payload_len: usize,
    },
    /// A copy of packet `id` left the network at host `ep`.
    Arrived {
        /// The send number.
        id: u64,
        /// The sending host.
        src: usize,
        /// The receiving host.
        ep: usize,
        /// True for a copy that may be out of its path's order (reordered or a duplicate).
        late: bool,
        /// Whether a bit was flipped (`Some(true)`: only in the byte the ICRC masks).
        corrupted: Option<bool>,
        /// What became of it.
        fate: Fate,
    },
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
    /// UD datagrams addressed to an IP address no host has (never offered to the network).
    pub no_route: u64,
    /// UD packets produced when the QP named no destination (a transport fault: counted
    /// and dropped).
    pub undirected: u64,
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
    /// When set, what became of every packet is recorded here (a workload drains it).
    pub trace: Option<Vec<TraceEvent>>,
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
            trace: None,
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

    /// Create an RC QP (PD 1) on a host, optionally on an SRQ (by index).
    pub fn create_qp(&mut self, ep: usize, cap: QpCap, srq: Option<usize>) -> QpRef {
        self.create_qp_of(ep, QpType::Rc, cap, srq)
    }

    /// Create a QP of type `qp_type` (PD 1) on a host, optionally on an SRQ (by index).
    pub fn create_qp_of(
        &mut self,
        ep: usize,
        qp_type: QpType,
        cap: QpCap,
        srq: Option<usize>,
    ) -> QpRef {
        let e = &mut self.eps[ep];
        let qpn = 0x11 + (ep as u32) * 0x100 + e.qps.len() as u32;
        let srq_id = srq.map(|s| e.srqs[s].id());
        let qp = Qp::new(QpInit {
            qp_num: qpn,
            pd: 1,
            cap,
            srq: srq_id,
            sq_sig_all: false,
            qp_type,
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

    /// The UDP source port a QP sends from (as `connect` gives it).
    pub fn src_port(&self, r: QpRef) -> u16 {
        0xc000 | (self.eps[r.ep].qps[r.qp].qp_num() as u16 & 0x3fff)
    }

    /// Bring a UD QP to RTS with Q_Key `qkey`, port MTU `port_mtu` and first PSN `sq_psn`.
    pub fn bring_up_ud(&mut self, r: QpRef, qkey: u32, port_mtu: Mtu, sq_psn: u32) {
        let qp = self.qp(r);
        qp.set_port_mtu(port_mtu);
        let attr = QpAttr {
            qkey,
            sq_psn,
            ..QpAttr::default()
        };
        qp.connect(&attr).expect("UD RESET->RTS");
    }

    /// The destination of a UD work request from `from` to QP `remote_qpn` at the host with
    /// address `ip` (the address vector runs from `from`'s host to `ip`).
    pub fn ud_dest_ip(&self, from: QpRef, ip: Ipv4Addr, remote_qpn: u32, qkey: u32) -> UdDest {
        let av = IcrcContext::v4(self.eps[from.ep].ip, ip, self.src_port(from));
        UdDest::new(AddressVector::from_context(av), remote_qpn, qkey)
    }

    /// The destination of a UD work request from `from` to the QP `to`.
    pub fn ud_dest(&self, from: QpRef, to: QpRef, qkey: u32) -> UdDest {
        let qpn = self.eps[to.ep].qps[to.qp].qp_num();
        self.ud_dest_ip(from, self.eps[to.ep].ip, qpn, qkey)
    }

    /// Bring two RC or UC QPs to RTS connected to each other (UC takes what it needs of
    /// `o`: the path, path MTU, PSNs and the remote rights).
    pub fn connect(&mut self, a: QpRef, b: QpRef, o: ConnOpts) {
        let (ia, ib) = (self.eps[a.ep].ip, self.eps[b.ep].ip);
        let (qa, qb) = (self.qp(a).qp_num(), self.qp(b).qp_num());
        let sides = [
            (a, ia, ib, qb, o.psn_a, o.psn_b),
            (b, ib, ia, qa, o.psn_b, o.psn_a),
        ];
        for (r, local, remote, dest, sq_psn, rq_psn) in sides {
            let port = self.src_port(r);
            let attr = QpAttr {
                qp_access_flags: o.access,
                av: Some(AddressVector::from_context(IcrcContext::v4(
                    local, remote, port,
                ))),
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
        for ei in 0..self.eps.len() {
            for qi in 0..self.eps[ei].qps.len() {
                let from = QpRef { ep: ei, qp: qi };
                let qp = &self.eps[ei].qps[qi];
                if self.buf.len() < qp.max_packet_len() {
                    self.buf.resize(qp.max_packet_len(), 0);
                }
                if qp.qp_type() == QpType::Ud {
                    self.pump_datagrams(from);
                } else if let Some(dst) = self.eps[ei].peer[qi] {
                    let e = &mut self.eps[ei];
                    let qp = &mut e.qps[qi];
                    let icrc = qp.attr().av.map(|av| *av.context());
                    while let Some(n) = qp.poll_transmit(now, &e.mem, &mut self.buf) {
                        let Some(ctx) = icrc else { continue };
                        let id = self.net.send(now, ei, dst, ctx, &self.buf[..n]);
                        if let Some(t) = &mut self.trace {
                            t.push(sent_event(Some(id), from, Some(dst), &self.buf[..n]));
                        }
                    }
                }
                let e = &mut self.eps[ei];
                while let Some(wc) = e.qps[qi].poll_completion() {
                    self.completions.push_back(Completion { at: from, wc });
                }
            }
        }
    }

    /// Send a UD QP's datagrams, each to the host its address vector names, from the QP's
    /// host address (the IP header a socket would put on it).
    fn pump_datagrams(&mut self, from: QpRef) {
        let now = self.now;
        let src_ip = self.eps[from.ep].ip;
        loop {
            let e = &mut self.eps[from.ep];
            let qp = &mut e.qps[from.qp];
            let dest = qp.next_datagram_dest();
            let Some(n) = qp.poll_transmit(now, &e.mem, &mut self.buf) else {
                break;
            };
            let Some(av) = dest.map(|av| *av.context()) else {
                self.stats.undirected += 1;
                continue;
            };
            let to = match av.ip {
                IpHeader::V4 { dst, .. } => self.eps.iter().position(|h| h.ip == dst),
                IpHeader::V6 { .. } => None,
            };
            let id = to.map(|dst| {
                let ctx = match av.ip {
                    IpHeader::V4 {
                        dst: d,
                        id,
                        dont_fragment,
                        ..
                    } => IcrcContext {
                        ip: IpHeader::V4 {
                            src: src_ip,
                            dst: d,
                            id,
                            dont_fragment,
                        },
                        ..av
                    },
                    IpHeader::V6 { .. } => av,
                };
                self.net.send(now, from.ep, dst, ctx, &self.buf[..n])
            });
            if to.is_none() {
                self.stats.no_route += 1;
            }
            if let Some(t) = &mut self.trace {
                t.push(sent_event(id, from, to, &self.buf[..n]));
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
            self.deliver(&p);
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

    fn deliver(&mut self, p: &InFlight) {
        let fate = self.deliver_fate(p);
        if let Some(t) = &mut self.trace {
            t.push(TraceEvent::Arrived {
                id: p.id,
                src: p.src,
                ep: p.dst,
                late: p.late,
                corrupted: p.corrupted,
                fate,
            });
        }
    }

    fn deliver_fate(&mut self, p: &InFlight) -> Fate {
        let (data, dst, icrc, corrupted) = (&p.data[..], p.dst, p.icrc, p.corrupted);
        let pkt = match Packet::parse_verified(&icrc, data) {
            Ok(p) => p,
            Err(WireError::BadIcrc { .. }) => {
                self.stats.icrc_rejected += 1;
                return Fate::IcrcRejected;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return Fate::Malformed;
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
            return Fate::Unroutable;
        };
        // What the receiving socket learns from the IP header: a UD receive's GRH area.
        let from = DatagramSource {
            ip: icrc.ip,
            udp_payload_len: data.len(),
        };
        let srq = e.qp_srq[qi].map(|s| &mut e.srqs[s]);
        let before = *e.qps[qi].counters();
        e.qps[qi].handle_packet_from(self.now, &pkt, Some(&from), &e.mem, srq);
        Fate::Handled {
            qp: QpRef { ep: dst, qp: qi },
            before,
            after: *e.qps[qi].counters(),
        }
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

fn sent_event(id: Option<u64>, from: QpRef, to: Option<usize>, data: &[u8]) -> TraceEvent {
    let p = Packet::parse(data).ok();
    TraceEvent::Sent {
        id,
        from,
        to,
        hdr: p.map(|p| p.hdr),
        payload_len: p.map_or(0, |p| p.payload.len()),
    }
}
