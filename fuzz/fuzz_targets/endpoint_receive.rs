//! The device core's receive path (`Endpoint::handle_datagram`): datagrams of up to eight packets,
//! as GRO hands them over, from the connected peers, from a connected peer's IP on another
//! UDP port, and from a stranger, with every kind of ICRC (softrdma's GSO numbering, zero, an
//! identification to solve, corrupted), for two connected QPs, one never connected, and QP
//! numbers nobody has; QPs removed from and put back into the device between datagrams; WRITEs
//! posted so that forged acknowledgements and READ responses meet outstanding work. The
//! endpoint runs without an engine: its driver here records what it sends, addressed to the
//! harness's peers, and its clock is the input's.
//!
//! Invariants, checked after every step:
//! - nothing is ever sent to the stranger or to the peer's IP on another port; what each peer
//!   receives parses and is for its QP;
//! - a datagram no QP accepts from its source changes nothing: no byte of memory, no QP
//!   counter, no latched port, nothing sent;
//! - outside the ranges peers may write (the all-rights region of the QPs' PD and the receive
//!   buffers), no byte of memory ever changes: guards, the read-only region and the region of
//!   the other PD stay as they were;
//! - every packet of a datagram is accounted for exactly once: dropped as bad, for an unknown
//!   QP or from the wrong peer, or handed to the QP it names (a QP out of the device never
//!   sees one);
//! - a latched source port changes only when the QP is connected again;
//! - send completions never outnumber WRs posted; no panic.
#![no_main]

use std::cell::{Cell, RefCell};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, PinMode, RawCopy, WatchMode};
use softrdma::net::{CqCore, Endpoint, EndpointIo, QpCell, Received, RxWork, TxBatch};
use softrdma::rc::{
    Mtu, Qp, QpAttr, QpAttrMask, QpCap, QpInit, QpState, RecvWr, SendFlags, SendWr, Sge, WrOpcode,
};
use softrdma::wire::{AddressVector, 
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, HeaderRepr, Headers, IcrcContext, IpHeader,
    OpKind, Opcode, Packet, Psn, RethRepr, Syndrome,
};

const DEVICE: Ipv4Addr = Ipv4Addr::new(127, 0, 8, 1);
const PEER_A: Ipv4Addr = Ipv4Addr::new(127, 0, 8, 2);
const PEER_B: Ipv4Addr = Ipv4Addr::new(127, 0, 8, 3);
const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 8, 4);
/// The device's QPs: A and B connected (to the peers above), C never connected.
const QPNS: [u32; 3] = [0x11, 0x12, 0x13];
/// The QP numbers of A's and B's peers.
const PEER_QPNS: [u32; 2] = [0x21, 0x22];
const MTU: usize = 256;
const GUARD: usize = 64;
/// Packets in one datagram at most.
const MAX_SEGS: usize = 8;

const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::REMOTE_WRITE;
const RR: Access = Access::REMOTE_READ;
const RA: Access = Access::REMOTE_ATOMIC;

/// The regions: (length, in the QPs' PD, rights). 0: all rights; 1: read only; 2: the other
/// PD's (all rights); 3: receive buffers (local write only).
const REGIONS: [(usize, bool, Access); 4] = [
    (2048, true, Access(LW.0 | RW.0 | RR.0 | RA.0)),
    (1024, true, RR),
    (1024, false, Access(LW.0 | RW.0 | RR.0 | RA.0)),
    (2048, true, LW),
];
/// Regions a peer may change: the all-rights one, and the receive buffers.
const WRITABLE: [usize; 2] = [0, 3];

/// Request opcodes of RC.
const REQUESTS: [Opcode; 17] = [
    Opcode::RC_SEND_FIRST,
    Opcode::RC_SEND_MIDDLE,
    Opcode::RC_SEND_LAST,
    Opcode::RC_SEND_LAST_IMM,
    Opcode::RC_SEND_ONLY,
    Opcode::RC_SEND_ONLY_IMM,
    Opcode::RC_SEND_LAST_INV,
    Opcode::RC_SEND_ONLY_INV,
    Opcode::RC_WRITE_FIRST,
    Opcode::RC_WRITE_MIDDLE,
    Opcode::RC_WRITE_LAST,
    Opcode::RC_WRITE_LAST_IMM,
    Opcode::RC_WRITE_ONLY,
    Opcode::RC_WRITE_ONLY_IMM,
    Opcode::RC_READ_REQUEST,
    Opcode::RC_COMPARE_SWAP,
    Opcode::RC_FETCH_ADD,
];

/// Response opcodes of RC.
const RESPONSES: [Opcode; 6] = [
    Opcode::RC_ACK,
    Opcode::RC_READ_RESPONSE_FIRST,
    Opcode::RC_READ_RESPONSE_MIDDLE,
    Opcode::RC_READ_RESPONSE_LAST,
    Opcode::RC_READ_RESPONSE_ONLY,
    Opcode::RC_ATOMIC_ACK,
];

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum From {
    PeerA,
    PeerAOtherPort,
    PeerB,
    Stranger,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QpSel {
    A,
    B,
    C,
    Unknown(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PsnSel {
    Expected,
    Behind(u8),
    Ahead(u8),
    Any(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeySel {
    All,
    ReadOnly,
    OtherPd,
    Recv,
    Random(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum OpSel {
    Request(u8),
    Response(u8),
    Any(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Pkt {
    qp: QpSel,
    op: OpSel,
    psn: PsnSel,
    ack_req: bool,
    key: KeySel,
    offset: u16,
    dma_len: u16,
    payload: u16,
    fill: u8,
    syndrome: Option<u8>,
    msn: u32,
    value: u64,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum IcrcSel {
    /// Identification k for the k-th packet, as softrdma's GSO numbers them.
    Gso,
    Zero,
    /// One identification for every packet (solved for, as from Linux rxe).
    Id(u16),
    /// The k-th packet as `Gso`, then one bit flipped.
    Corrupt(u16),
}

#[derive(Arbitrary, Debug, Clone)]
enum Seg {
    Packet(Pkt),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone)]
struct Dgram {
    from: From,
    icrc: IcrcSel,
    /// The GRO segment size: the first packet's length when `None`.
    segment: Option<u16>,
    /// Every packet padded or cut to the first one's payload length, as GRO merges them.
    uniform: bool,
    segs: Vec<Seg>,
}

#[derive(Arbitrary, Debug, Clone)]
enum Step {
    Datagram(Dgram),
    PostWrite {
        len: u16,
        signaled: bool,
    },
    Remove(u8),
    Restore(u8),
    Reconnect {
        qp: u8,
        psn: u32,
    },
    Advance(u32),
    /// Serve the answers left over from budgeted drives.
    Serve,
}

/// A QP as the invariants see it: packets received, progress mark, latched port, expected PSN.
type QpView = (u64, (u32, u32), Option<u16>, Psn);

/// What the device sent: destination, bytes, segment size.
type Sent = Vec<(SocketAddr, Vec<u8>, usize)>;

/// The endpoint's driver: the input's clock, and a record of what it sent.
#[derive(Default)]
struct Recorder {
    now: Cell<u64>,
    sent: RefCell<Sent>,
}

impl EndpointIo for Recorder {
    fn now(&self) -> u64 {
        self.now.get()
    }

    fn send(&self, tx: &mut TxBatch) -> std::io::Result<()> {
        self.sent.borrow_mut().extend(tx.take_datagrams());
        Ok(())
    }

    fn wake(&self) {}

    fn deadline_lowered(&self, _: u64) {}
}

/// What every input shares (set up once per process: a memory table is slow to make): the
/// device's endpoint and memory, the regions in one host buffer, the harness's addresses.
/// Each input gets fresh QPs and the memory's initial bytes.
struct Shared {
    ep: Endpoint,
    /// The host buffer (leaked: the table's regions point into it for the process's life).
    host: usize,
    host_len: usize,
    shadow: Vec<u8>,
    /// Ranges of `host` no peer may change.
    fixed: Vec<std::ops::Range<usize>>,
    /// Host offset of each region, its IOVA and key.
    regions: Vec<(usize, u64, u32)>,
    pd: u32,
    peers: [SocketAddr; 2],
    peer_alt: SocketAddr,
    stranger: SocketAddr,
}

static SHARED: std::sync::LazyLock<Shared> = std::sync::LazyLock::new(Shared::new);

impl Shared {
    fn new() -> Shared {
        let mem = Arc::new(
            MemoryTable::new(MemConfig {
                pin_mode: PinMode::OnDemand,
                max_keys: 16,
                max_pds: 4,
                watch: WatchMode::Off,
                raw_copy: RawCopy::Plain,
                ..MemConfig::default()
            })
            .unwrap(),
        );
        let pds = [mem.alloc_pd().unwrap(), mem.alloc_pd().unwrap()];
        let host_len = REGIONS.iter().map(|r| r.0 + GUARD).sum::<usize>() + GUARD;
        let host: Box<[u8]> = (0..host_len).map(|i| (i * 13 + 5) as u8).collect();
        let shadow = host.to_vec();
        let host = Box::leak(host).as_mut_ptr();
        let mut regions = Vec::new();
        let mut off = GUARD;
        for (i, &(len, ours, rights)) in REGIONS.iter().enumerate() {
            let iova = 0x1_0000_0000 * (i as u64 + 1);
            // SAFETY: inside the host buffer, which is never freed.
            let src = unsafe { MemSource::raw(host.add(off), len) };
            let pd = if ours { pds[0] } else { pds[1] };
            let mr = mem.reg_mr(pd, src, rights, Some(iova)).unwrap();
            regions.push((off, iova, mr.lkey));
            off += len + GUARD;
        }
        let mut open: Vec<(usize, usize)> = WRITABLE
            .iter()
            .map(|&r| (regions[r].0, regions[r].0 + REGIONS[r].0))
            .collect();
        open.sort();
        let mut fixed = Vec::new();
        let mut at = 0;
        for (a, b) in open {
            fixed.push(at..a);
            at = b;
        }
        fixed.push(at..host_len);
        let ep = Endpoint::new(SocketAddr::from((DEVICE, 4791)), Arc::clone(&mem), false);
        Shared {
            ep,
            host: host as usize,
            host_len,
            shadow,
            fixed,
            regions,
            pd: pds[0],
            peers: [
                SocketAddr::from((PEER_A, 4791)),
                SocketAddr::from((PEER_B, 4791)),
            ],
            peer_alt: SocketAddr::from((PEER_A, 50_000)),
            stranger: SocketAddr::from((STRANGER, 4791)),
        }
    }
}

struct World {
    s: &'static Shared,
    cells: Vec<Arc<QpCell>>,
    present: [bool; 3],
    cqs: Vec<Arc<CqCore>>,
    io: Recorder,
    work: RxWork,
    /// PSNs of A's request packets seen at its peer.
    sent: Vec<Psn>,
    posted: u64,
    send_wcs: u64,
}

impl Drop for World {
    fn drop(&mut self) {
        // The QPs leave the device with nothing left to send (answers a budgeted drive left
        // over go with RESET); whatever they sent is read and dropped.
        for (i, c) in self.cells.iter().enumerate() {
            let mut b = c.lock();
            let mut a = *b.qp.attr();
            a.qp_state = QpState::Reset;
            let _ = b.qp.modify(&a, QpAttrMask::STATE);
            drop(b);
            self.s.ep.remove_qp(QPNS[i]);
        }
        for _ in 0..1000 {
            if !self.s.ep.has_pending_transmit() {
                break;
            }
            self.s.ep.serve_pending_transmit(&self.io);
        }
    }
}

fn qp_index(s: QpSel) -> Result<usize, u32> {
    match s {
        QpSel::A => Ok(0),
        QpSel::B => Ok(1),
        QpSel::C => Ok(2),
        QpSel::Unknown(q) => Err(q & 0x00ff_ffff),
    }
}

impl World {
    fn new() -> World {
        let s: &'static Shared = &SHARED;
        // SAFETY: the host buffer is `host_len` bytes, never freed; the fuzzer runs one input
        // at a time on this thread and nothing else touches the buffer between calls.
        unsafe {
            core::ptr::copy_nonoverlapping(s.shadow.as_ptr(), s.host as *mut u8, s.host_len);
        }
        let cqs: Vec<Arc<CqCore>> = (0..3).map(|_| Arc::new(CqCore::new(256, None))).collect();
        let mut w = World {
            s,
            cells: Vec::new(),
            present: [true; 3],
            cqs,
            io: Recorder {
                now: Cell::new(1_000_000),
                ..Recorder::default()
            },
            work: RxWork::default(),
            sent: Vec::new(),
            posted: 0,
            send_wcs: 0,
        };
        for (i, &qpn) in QPNS.iter().enumerate() {
            let qp = Qp::new(QpInit {
                qp_num: qpn,
                pd: s.pd,
                cap: QpCap {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                srq: None,
                sq_sig_all: false,
                qp_type: Default::default(),
            })
            .unwrap();
            let cell = Arc::new(QpCell::new(
                qp,
                s.pd,
                Arc::clone(&w.cqs[i]),
                Arc::clone(&w.cqs[i]),
                None,
            ));
            s.ep.add_qp(Arc::clone(&cell));
            w.cells.push(cell);
        }
        w.connect(0, 0x00ff_fff0);
        w.connect(1, 500);
        w
    }

    /// Connect QP `i` (A or B) to its peer, receive PSN `psn`, with receives posted.
    fn connect(&mut self, i: usize, psn: u32) {
        let peer = self.s.peers[i];
        let SocketAddr::V4(p) = peer else {
            unreachable!()
        };
        let mut body = self.cells[i].lock();
        let mut a = *body.qp.attr();
        a.qp_state = QpState::Reset;
        body.qp.modify(&a, QpAttrMask::STATE).unwrap();
        body.qp
            .connect(&QpAttr {
                qp_access_flags: LW | RW | RR | RA,
                av: Some(AddressVector::from_context(IcrcContext::v4(DEVICE, *p.ip(), 0xc000))),
                path_mtu: Mtu::Mtu256,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                rq_psn: psn & Psn::MASK,
                sq_psn: 100,
                max_rd_atomic: 4,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                dest_qp_num: PEER_QPNS[i],
                ..QpAttr::default()
            })
            .unwrap();
        body.peer = Some(peer);
        body.peer_src_port = None;
        let (off, iova, lkey) = self.s.regions[3];
        let _ = off;
        for k in 0..4u64 {
            let sge = [Sge {
                addr: iova + k * 512,
                length: 512,
                lkey,
            }];
            let _ = body.qp.post_recv(&RecvWr {
                wr_id: k,
                sg_list: &sge,
            });
        }
        drop(body);
        if i == 0 {
            self.sent.clear();
        }
    }

    fn host(&self) -> &[u8] {
        // SAFETY: a live allocation of `host_len` bytes; the table writes to it only inside
        // calls, and none runs while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.s.host as *const u8, self.s.host_len) }
    }

    fn sender_addr(&self, f: From) -> SocketAddr {
        match f {
            From::PeerA => self.s.peers[0],
            From::PeerAOtherPort => self.s.peer_alt,
            From::PeerB => self.s.peers[1],
            From::Stranger => self.s.stranger,
        }
    }

    fn key(&self, k: KeySel) -> (u32, u64, usize) {
        let r = match k {
            KeySel::All => 0,
            KeySel::ReadOnly => 1,
            KeySel::OtherPd => 2,
            KeySel::Recv => 3,
            KeySel::Random(v) => return (v, 0x1_0000_0000, 4096),
        };
        (self.s.regions[r].2, self.s.regions[r].1, REGIONS[r].0)
    }

    /// One packet's bytes (ICRC computed for `ctx`), or nothing when it cannot be emitted.
    fn packet(&self, p: &Pkt, payload_len: Option<usize>, ctx: &IcrcContext) -> Option<Vec<u8>> {
        let (qpn, expected, last_sent) = match qp_index(p.qp) {
            Ok(i) => {
                let body = self.cells[i].lock();
                (QPNS[i], body.qp.expected_psn(), self.sent.last().copied())
            }
            Err(q) => (q, Psn::new(0), None),
        };
        let op = match p.op {
            OpSel::Request(i) => REQUESTS[usize::from(i) % REQUESTS.len()],
            OpSel::Response(i) => RESPONSES[usize::from(i) % RESPONSES.len()],
            OpSel::Any(b) => Opcode(b),
        };
        let info = op.info()?;
        let responding = matches!(p.op, OpSel::Response(_));
        let base = if responding {
            last_sent.unwrap_or(Psn::new(100))
        } else {
            expected
        };
        let psn = match p.psn {
            PsnSel::Expected => base,
            PsnSel::Behind(d) => base.sub(u32::from(d)),
            PsnSel::Ahead(d) => base.add(u32::from(d)),
            PsnSel::Any(v) => Psn::new(v & Psn::MASK),
        };
        let mut h = HeaderRepr::new(BthRepr::new(op, qpn, psn));
        h.bth.ack_req = p.ack_req;
        let (rkey, iova, len) = self.key(p.key);
        let va = iova + u64::from(p.offset) % (len as u64 + 16);
        let hs = info.headers;
        if hs.has(Headers::DETH) || hs.has(Headers::FETH) {
            return None;
        }
        if hs.has(Headers::RETH) {
            h.reth = Some(RethRepr {
                va,
                rkey,
                dma_len: u32::from(p.dma_len),
            });
        }
        if hs.has(Headers::ATOMIC_ETH) {
            h.atomic_eth = Some(AtomicEthRepr {
                va: va & !7,
                rkey,
                swap_add: p.value,
                compare: !p.value,
            });
        }
        if hs.has(Headers::AETH) {
            h.aeth = Some(AethRepr {
                syndrome: p
                    .syndrome
                    .map_or(Syndrome::Ack { credits: 0x1f }, Syndrome::from_byte),
                msn: p.msn & 0x00ff_ffff,
            });
        }
        if hs.has(Headers::ATOMIC_ACK_ETH) {
            h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: p.value });
        }
        if hs.has(Headers::IMMDT) {
            h.immdt = Some(p.msn);
        }
        if hs.has(Headers::IETH) {
            h.ieth = Some(rkey);
        }
        let plen = if info.payload {
            payload_len.unwrap_or(usize::from(p.payload) % (MTU + 8))
        } else {
            0
        };
        let payload: Vec<u8> = (0..plen).map(|i| p.fill.wrapping_add(i as u8)).collect();
        let mut out = vec![0u8; plen + 128];
        let n = Packet {
            hdr: h,
            payload: &payload,
            icrc: 0,
        }
        .emit(ctx, &mut out)
        .ok()?;
        out.truncate(n);
        Some(out)
    }

    /// The bytes of a datagram and its segment size.
    fn datagram(&self, d: &Dgram) -> (Vec<u8>, usize) {
        let src = self.sender_addr(d.from);
        let SocketAddr::V4(s) = src else {
            unreachable!()
        };
        let mut data = Vec::new();
        let mut first_len = None;
        let mut first_payload = None;
        for (k, seg) in d.segs.iter().take(MAX_SEGS).enumerate() {
            let bytes = match seg {
                Seg::Raw(v) => v.iter().copied().take(MTU + 64).collect(),
                Seg::Packet(p) => {
                    let id = match d.icrc {
                        IcrcSel::Gso | IcrcSel::Corrupt(_) => k as u16,
                        IcrcSel::Zero => 0,
                        IcrcSel::Id(v) => v,
                    };
                    let ctx = IcrcContext {
                        ip: IpHeader::V4 {
                            src: *s.ip(),
                            dst: DEVICE,
                            id,
                            dont_fragment: true,
                        },
                        src_port: src.port(),
                        dst_port: 4791,
                    };
                    let plen = if d.uniform { first_payload } else { None };
                    let Some(mut b) = self.packet(p, plen, &ctx) else {
                        continue;
                    };
                    if first_payload.is_none() {
                        first_payload = Some(usize::from(p.payload) % (MTU + 8));
                    }
                    if let IcrcSel::Corrupt(bit) = d.icrc
                        && !b.is_empty()
                    {
                        let i = usize::from(bit / 8) % b.len();
                        b[i] ^= 1 << (bit % 8);
                    }
                    b
                }
            };
            first_len.get_or_insert(bytes.len());
            data.extend_from_slice(&bytes);
        }
        let segment = match d.segment {
            Some(s) => usize::from(s),
            None => first_len.unwrap_or(0),
        };
        (data, segment)
    }

    /// Everything sent since the last look: checked as the invariants say. Returns the
    /// datagrams sent.
    fn drain(&mut self) -> usize {
        let sent = std::mem::take(&mut *self.io.sent.borrow_mut());
        for (dst, data, segment) in &sent {
            let who = self.s.peers.iter().position(|p| p == dst);
            let Some(who) = who else {
                panic!(
                    "the device sent a datagram to {}",
                    if *dst == self.s.peer_alt {
                        "the peer's IP on another port"
                    } else {
                        "a stranger"
                    }
                );
            };
            for seg in data.chunks((*segment).max(1)) {
                let p = Packet::parse(seg).expect("the device sent a malformed packet");
                assert_eq!(p.hdr.bth.dest_qp, PEER_QPNS[who], "sent to the wrong QP");
                let req = p.hdr.bth.opcode.info().is_some_and(|i| {
                    !matches!(
                        i.kind,
                        OpKind::ReadResponse | OpKind::Ack | OpKind::AtomicAck
                    )
                });
                if who == 0 && req {
                    self.sent.push(p.hdr.bth.psn);
                    if self.sent.len() > 64 {
                        self.sent.remove(0);
                    }
                }
            }
        }
        sent.len()
    }

    fn poll_wcs(&mut self) {
        let mut wcs = [softrdma::verbs::EMPTY_WC; 16];
        loop {
            let n = self.cqs[0].poll(&mut wcs);
            if n == 0 {
                break;
            }
            for w in &wcs[..n] {
                if !w.is_recv() {
                    self.send_wcs += 1;
                }
            }
        }
        for cq in &self.cqs[1..] {
            while cq.poll(&mut wcs) > 0 {}
        }
        assert!(
            self.send_wcs <= self.posted,
            "{} send completions for {} WRs",
            self.send_wcs,
            self.posted
        );
    }

    /// The QPs' transport-visible state: packets received, progress, latched port.
    fn snapshot(&self) -> Vec<QpView> {
        self.cells
            .iter()
            .map(|c| {
                let b = c.lock();
                (
                    b.qp.counters().packets_received,
                    b.qp.progress_mark(),
                    b.peer_src_port,
                    b.qp.expected_psn(),
                )
            })
            .collect()
    }

    fn counters(&self) -> u64 {
        let c = &self.s.ep.counters;
        use std::sync::atomic::Ordering::Relaxed;
        c.rx_bad.load(Relaxed) + c.rx_unknown_qp.load(Relaxed) + c.rx_wrong_peer.load(Relaxed)
    }

    /// True when QP `i` takes packets from `src` (its peer's IP, and the latched port if any).
    fn accepts(&self, i: usize, src: SocketAddr) -> bool {
        if !self.present[i] {
            return false;
        }
        let b = self.cells[i].lock();
        b.peer.map(|p| p.ip()) == Some(src.ip()) && b.peer_src_port.is_none_or(|p| p == src.port())
    }

    fn check_bytes(&self) {
        let host = self.host();
        for r in &self.s.fixed {
            // Whole-slice comparisons (memcmp): a byte loop would be traced byte by byte.
            if host[r.clone()] != self.s.shadow[r.clone()] {
                let i = (r.start..r.end)
                    .find(|&i| host[i] != self.s.shadow[i])
                    .unwrap_or(r.start);
                panic!(
                    "byte {i} changed outside what peers may write ({:#x} -> {:#x})",
                    self.s.shadow[i], host[i]
                );
            }
        }
    }

    fn step(&mut self, s: &Step) {
        match s {
            Step::Datagram(d) => {
                let src = self.sender_addr(d.from);
                let (data, segment) = self.datagram(d);
                let expect = data.chunks(segment.max(1)).count();
                let before = self.snapshot();
                let bytes_before = self.host().to_vec();
                let dropped_before = self.counters();
                let accepted_by_any = (0..3).any(|i| self.accepts(i, src));
                // As a receive batch of one datagram in blocking mode: acknowledgements held
                // while the datagram is handled go out at its end.
                let now = self.io.now();
                let got = self.s.ep.handle_datagram(
                    now,
                    &Received {
                        src,
                        data: &data,
                        segment,
                    },
                    &mut self.work,
                    &self.io,
                );
                self.s
                    .ep
                    .flush_pending_at(&mut self.work, true, now, &self.io);
                assert_eq!(got, expect, "packets counted for the datagram");
                let after = self.snapshot();
                let handed: u64 = before
                    .iter()
                    .zip(&after)
                    .map(|(b, a)| a.0 - b.0)
                    .sum::<u64>();
                let dropped = self.counters() - dropped_before;
                assert_eq!(
                    handed + dropped,
                    expect as u64,
                    "packets handed to QPs ({handed}) and dropped ({dropped})"
                );
                for i in 0..3 {
                    let (b, a) = (&before[i], &after[i]);
                    if !self.present[i] {
                        assert_eq!(b, a, "a QP out of the device changed");
                    }
                    if let Some(p) = b.2 {
                        assert_eq!(a.2, Some(p), "a latched port changed");
                    } else if let Some(p) = a.2 {
                        assert!(
                            p == src.port() && self.accepts(i, src),
                            "latched a port ({p}) not of the peer"
                        );
                    }
                }
                let sent = self.drain();
                if !accepted_by_any {
                    assert_eq!(before, after, "a datagram nobody accepts changed a QP");
                    assert!(
                        self.host() == &bytes_before[..],
                        "a datagram nobody accepts changed memory"
                    );
                    assert_eq!(sent, 0, "a datagram nobody accepts drew an answer");
                }
            }
            Step::PostWrite { len, signaled } => {
                let (_, iova, lkey) = self.s.regions[0];
                let sge = [Sge {
                    addr: iova,
                    length: u32::from(*len) % 1024,
                    lkey,
                }];
                let flags = if *signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                let wr = SendWr::new(
                    self.posted,
                    WrOpcode::RdmaWrite {
                        remote_addr: 0x9_0000_0000,
                        rkey: 0x4242,
                    },
                )
                .sg(&sge)
                .flags(flags);
                let mut body = self.cells[0].lock();
                if body.qp.post_send(&wr).is_ok() {
                    self.posted += 1;
                    self.s
                        .ep
                        .drive(&self.cells[0], &mut body, self.io.now(), &self.io);
                }
                drop(body);
                self.drain();
            }
            Step::Remove(i) => {
                let i = usize::from(*i) % 3;
                if self.present[i] {
                    assert!(self.s.ep.remove_qp(QPNS[i]).is_some());
                    self.work.forget_last_qp();
                    self.present[i] = false;
                }
            }
            Step::Restore(i) => {
                let i = usize::from(*i) % 3;
                if !self.present[i] {
                    self.s.ep.add_qp(Arc::clone(&self.cells[i]));
                    self.present[i] = true;
                }
            }
            Step::Reconnect { qp, psn } => {
                let i = usize::from(*qp) % 2;
                self.connect(i, *psn);
                self.drain();
            }
            Step::Advance(ns) => {
                self.io.now.set(self.io.now() + u64::from(*ns));
            }
            Step::Serve => {
                self.s.ep.serve_pending_transmit(&self.io);
                self.drain();
            }
        }
        self.check_bytes();
        self.poll_wcs();
    }
}

fuzz_target!(|steps: Vec<Step>| {
    let mut w = World::new();
    for s in steps.iter().take(64) {
        w.step(s);
    }
});
