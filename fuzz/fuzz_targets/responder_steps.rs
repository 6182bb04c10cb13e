//! A responder (the sans-IO RC QP) driven by a sequence of structured steps: requests built
//! with `wire` against the QP's current expected PSN (duplicates and future PSNs included),
//! receives posted, time passing, regions invalidated or deregistered, the QP reconnected.
//! Its memory is one host buffer with guard bytes between the regions it registers (raw, in
//! place), one of them in a second protection domain.
//!
//! Invariants, checked after every step:
//! - no byte changes outside the ranges the live keys of the QP's PD let a peer write (or the
//!   receive buffers posted): guards, read-only regions, the other PD's region never change;
//! - every READ response carries exactly the bytes of the original READ at its PSN (its key,
//!   its address, read now), through a key that is live, of the QP's PD and allows REMOTE_READ;
//! - an atomic executes only as a new request and at most once per PSN; an atomic ACK carries
//!   the value its execution returned;
//! - keys change state only by the harness's own steps (or a SEND with Invalidate of a type 2
//!   window);
//! - every packet sent verifies (ICRC) and the queued answers are bounded;
//! - receive completions never outnumber receives posted; no panic.
#![no_main]

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softrdma::mem::{
    Access, AccessCtx, AccessError, AtomicOp, Invalidator, MemConfig, MemSource, MemoryAccess,
    MemoryTable, MwType, PinMode, RawCopy, WatchMode,
};
use softrdma::rc::{Mtu, Qp, QpAttr, QpCap, QpInit, QpState, RecvWr, Sge, WcOpcode};
use softrdma::wire::{AddressVector, 
    AtomicEthRepr, BthRepr, FethRepr, HeaderRepr, Headers, IcrcContext, OpKind, Opcode, Packet,
    Psn, RethRepr,
};
use softrdma_fuzz::{DUP_READ_ANY_RETH, SEND_INV_PLAIN_MR, known_issue, skip};

const QPN: u32 = 0x11;
const PEER: u32 = 0x22;
const MTU: u32 = 256;
const GUARD: usize = 64;
const IA: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Packets a full drain may produce at most: the answer queue holds 3 * 16 + 4 answers, the
/// largest READ the regions allow is 2048 bytes (8 packets of 256).
const MAX_DRAIN: usize = 52 * 9;

const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::REMOTE_WRITE;
const RR: Access = Access::REMOTE_READ;
const RA: Access = Access::REMOTE_ATOMIC;

/// The regions: (length, PD index, rights). Index 4 is in the other PD; index 5 is
/// invalidated at set-up.
const REGIONS: [(usize, usize, Access); 6] = [
    (
        2048,
        0,
        Access(LW.0 | RW.0 | RR.0 | RA.0 | Access::MW_BIND.0),
    ),
    (1024, 0, RR),
    (1024, 0, Access(LW.0 | RW.0)),
    (2048, 0, LW),
    (1024, 1, Access(LW.0 | RW.0 | RR.0 | RA.0)),
    (512, 0, Access(LW.0 | RW.0 | RR.0 | RA.0)),
];
/// Windows on region 0: (type, offset, length, rights).
const WINDOWS: [(MwType, u64, u64, Access); 2] = [
    (MwType::Type1, 256, 512, Access(RR.0 | RW.0)),
    (MwType::Type2, 1024, 512, Access(RR.0 | RW.0 | RA.0)),
];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeySel {
    Rw,
    Ro,
    Wo,
    Recv,
    OtherPd,
    Mw1,
    Mw2,
    Invalidated,
    Random(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PsnSel {
    Expected,
    Duplicate(u8),
    Ahead(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Addr {
    Start,
    End,
    Off(u16),
    Before(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Len {
    Zero,
    One,
    Eight,
    Whole,
    Rest,
    Mtu,
    MtuPlus1,
    Small(u16),
    Any(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PayloadLen {
    Zero,
    Mtu,
    MtuPlus1,
    Eight,
    Small(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastImm,
    SendOnly,
    SendOnlyImm,
    SendLastInv,
    SendOnlyInv,
    WriteFirst,
    WriteMiddle,
    WriteLast,
    WriteLastImm,
    WriteOnly,
    WriteOnlyImm,
    Read,
    CompareSwap,
    FetchAdd,
    Flush,
    AtomicWrite,
    Other(u8),
}

impl Op {
    fn opcode(self) -> Opcode {
        match self {
            Op::SendFirst => Opcode::RC_SEND_FIRST,
            Op::SendMiddle => Opcode::RC_SEND_MIDDLE,
            Op::SendLast => Opcode::RC_SEND_LAST,
            Op::SendLastImm => Opcode::RC_SEND_LAST_IMM,
            Op::SendOnly => Opcode::RC_SEND_ONLY,
            Op::SendOnlyImm => Opcode::RC_SEND_ONLY_IMM,
            Op::SendLastInv => Opcode::RC_SEND_LAST_INV,
            Op::SendOnlyInv => Opcode::RC_SEND_ONLY_INV,
            Op::WriteFirst => Opcode::RC_WRITE_FIRST,
            Op::WriteMiddle => Opcode::RC_WRITE_MIDDLE,
            Op::WriteLast => Opcode::RC_WRITE_LAST,
            Op::WriteLastImm => Opcode::RC_WRITE_LAST_IMM,
            Op::WriteOnly => Opcode::RC_WRITE_ONLY,
            Op::WriteOnlyImm => Opcode::RC_WRITE_ONLY_IMM,
            Op::Read => Opcode::RC_READ_REQUEST,
            Op::CompareSwap => Opcode::RC_COMPARE_SWAP,
            Op::FetchAdd => Opcode::RC_FETCH_ADD,
            Op::Flush => Opcode::RC_FLUSH,
            Op::AtomicWrite => Opcode::RC_ATOMIC_WRITE,
            Op::Other(b) => Opcode(b),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Req {
    op: Op,
    psn: PsnSel,
    ack_req: bool,
    key: KeySel,
    va: Addr,
    len: Len,
    payload: PayloadLen,
    fill: u8,
    ieth: KeySel,
    compare: u64,
    swap_add: u64,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Step {
    Request(Req),
    PostRecv { key: KeySel, va: Addr, len: Len },
    Drain(u8),
    Advance(u32),
    AckNow,
    Invalidate(u8),
    Dereg(u8),
    RebindMw2,
    Reconnect(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    qp_access: u8,
    steps: Vec<Step>,
}

/// What the harness knows of a key.
#[derive(Clone, Copy, Debug)]
struct KeyModel {
    key: u32,
    pd: usize,
    /// Host offset of the first byte the key reaches, and its wire address and length.
    host: usize,
    iova: u64,
    len: u64,
    rights: Access,
    window: Option<MwType>,
    /// The region a window is bound on.
    parent: Option<usize>,
    live: bool,
}

/// A READ request sent, with the PSN it was sent at.
#[derive(Clone, Copy, Debug)]
struct ReadReq {
    psn: Psn,
    rkey: u32,
    va: u64,
    len: u32,
}

/// The memory table seen through a spy that records atomics executed.
struct Spy<'a> {
    mem: &'a MemoryTable,
    atomics: RefCell<Vec<u64>>,
}

impl MemoryAccess for Spy<'_> {
    fn check(&self, c: AccessCtx, k: u32, i: u64, l: u64, a: Access) -> Result<(), AccessError> {
        self.mem.check(c, k, i, l, a)
    }
    fn write(&self, c: AccessCtx, k: u32, i: u64, d: &[u8], a: Access) -> Result<(), AccessError> {
        self.mem.write(c, k, i, d, a)
    }
    fn read(
        &self,
        c: AccessCtx,
        k: u32,
        i: u64,
        o: &mut [u8],
        a: Access,
    ) -> Result<(), AccessError> {
        self.mem.read(c, k, i, o, a)
    }
    fn atomic(&self, c: AccessCtx, k: u32, i: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let r = self.mem.atomic(c, k, i, op);
        if let Ok(v) = r {
            self.atomics.borrow_mut().push(v);
        }
        r
    }
    fn invalidate(&self, c: AccessCtx, k: u32, by: Invalidator) -> Result<(), AccessError> {
        self.mem.invalidate(c, k, by)
    }
    fn bind_mw(&self, c: AccessCtx, b: softrdma::mem::MwBind) -> Result<(), AccessError> {
        self.mem.bind_mw(c, b)
    }
}

struct World {
    // Dropped before `host`, which the table's raw regions point into.
    mem: MemoryTable,
    qp: Qp,
    host: *mut u8,
    host_len: usize,
    shadow: Vec<u8>,
    pds: [u32; 2],
    keys: Vec<KeyModel>,
    qp_access: Access,
    ctx: IcrcContext,
    buf: Vec<u8>,
    pkt: Vec<u8>,
    now: u64,
    rq_psn: u32,
    /// READs accepted as new requests, and every READ request sent (duplicates included).
    originals: VecDeque<ReadReq>,
    sent_reads: VecDeque<ReadReq>,
    /// PSN of every atomic executed since the last reconnect, with the value it returned.
    atomics: HashMap<u32, u64>,
    /// Receive SGEs posted since the last reconnect: (key index, wire address, length).
    recv_ranges: Vec<(usize, u64, u64)>,
    recvs_posted: u64,
    recv_wcs: u64,
    packets_in: u64,
}

fn port(qpn: u32) -> u16 {
    0xc000 | (qpn as u16 & 0x3fff)
}

impl World {
    fn new(qp_access: u8) -> World {
        let mem = MemoryTable::new(MemConfig {
            pin_mode: PinMode::OnDemand,
            max_keys: 32,
            max_pds: 4,
            watch: WatchMode::Off,
            raw_copy: RawCopy::Plain,
            ..MemConfig::default()
        })
        .unwrap();
        let pds = [mem.alloc_pd().unwrap(), mem.alloc_pd().unwrap()];
        let host_len = REGIONS.iter().map(|r| r.0 + GUARD).sum::<usize>() + GUARD;
        let host: Box<[u8]> = (0..host_len).map(|i| (i * 7 + 3) as u8).collect();
        let shadow = host.to_vec();
        let host = Box::into_raw(host) as *mut u8;
        let mut keys = Vec::new();
        let mut off = GUARD;
        for (i, &(len, pd, rights)) in REGIONS.iter().enumerate() {
            let iova = 0x1_0000_0000 * (i as u64 + 1) + 0x40;
            // SAFETY: inside the host buffer, freed only after the table is dropped.
            let src = unsafe { MemSource::raw(host.add(off), len) };
            let mr = mem.reg_mr(pds[pd], src, rights, Some(iova)).unwrap();
            keys.push(KeyModel {
                key: mr.lkey,
                pd,
                host: off,
                iova,
                len: len as u64,
                rights,
                window: None,
                parent: None,
                live: true,
            });
            off += len + GUARD;
        }
        mem.invalidate_mr(keys[5].key).unwrap();
        keys[5].live = false;
        let actx = AccessCtx {
            pd: pds[0],
            qpn: QPN,
        };
        for &(ty, woff, wlen, rights) in &WINDOWS {
            let p = keys[0];
            let mw = mem.alloc_mw(pds[0], ty).unwrap();
            let key = match ty {
                MwType::Type1 => mem
                    .bind_mw_type1(actx, mw, p.key, p.iova + woff, wlen, rights)
                    .unwrap(),
                MwType::Type2 => {
                    let nk = (mw & !0xff) | (mw.wrapping_add(1) & 0xff);
                    mem.bind_mw(
                        actx,
                        softrdma::mem::MwBind {
                            mw_key: mw,
                            new_rkey: nk,
                            mr_lkey: p.key,
                            iova: p.iova + woff,
                            len: wlen,
                            access: rights,
                        },
                    )
                    .unwrap();
                    nk
                }
            };
            keys.push(KeyModel {
                key,
                pd: 0,
                host: p.host + woff as usize,
                iova: p.iova + woff,
                len: wlen,
                rights,
                window: Some(ty),
                parent: Some(0),
                live: true,
            });
        }
        let qp_access = Access(u32::from(qp_access) & (LW.0 | RW.0 | RR.0 | RA.0));
        let qp = Qp::new(QpInit {
            qp_num: QPN,
            pd: pds[0],
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 8,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            srq: None,
            sq_sig_all: true,
            qp_type: Default::default(),
        })
        .unwrap();
        let mut w = World {
            mem,
            qp,
            host,
            host_len,
            shadow,
            pds,
            keys,
            qp_access,
            ctx: IcrcContext::v4(IB, IA, port(PEER)),
            buf: vec![0u8; 8192],
            pkt: vec![0u8; 8192],
            now: 0,
            rq_psn: 0x00ff_fff0,
            originals: VecDeque::new(),
            sent_reads: VecDeque::new(),
            atomics: HashMap::new(),
            recv_ranges: Vec::new(),
            recvs_posted: 0,
            recv_wcs: 0,
            packets_in: 0,
        };
        w.connect();
        w
    }

    fn connect(&mut self) {
        self.qp
            .connect(&QpAttr {
                qp_access_flags: self.qp_access,
                av: Some(AddressVector::from_context(IcrcContext::v4(IA, IB, port(QPN)))),
                path_mtu: Mtu::Mtu256,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                rq_psn: self.rq_psn,
                sq_psn: 100,
                max_rd_atomic: 4,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                dest_qp_num: PEER,
                ..QpAttr::default()
            })
            .unwrap();
    }

    fn host(&self) -> &[u8] {
        // SAFETY: `host` is a live allocation of `host_len` bytes; the table writes to it only
        // inside calls, and no call runs while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.host, self.host_len) }
    }

    fn actx(&self) -> AccessCtx {
        AccessCtx {
            pd: self.pds[0],
            qpn: QPN,
        }
    }

    fn key_index(&self, k: KeySel) -> Option<usize> {
        Some(match k {
            KeySel::Rw => 0,
            KeySel::Ro => 1,
            KeySel::Wo => 2,
            KeySel::Recv => 3,
            KeySel::OtherPd => 4,
            KeySel::Invalidated => 5,
            KeySel::Mw1 => 6,
            KeySel::Mw2 => 7,
            KeySel::Random(_) => return None,
        })
    }

    fn key_value(&self, k: KeySel) -> u32 {
        match (k, self.key_index(k)) {
            (_, Some(i)) => self.keys[i].key,
            (KeySel::Random(v), None) => v,
            _ => 0,
        }
    }

    /// Model index of the key value `key`, if it is one of ours.
    fn find_key(&self, key: u32) -> Option<usize> {
        self.keys.iter().position(|m| m.key == key)
    }

    fn live(&self, i: usize) -> bool {
        let m = &self.keys[i];
        m.live && m.parent.is_none_or(|p| self.keys[p].live)
    }

    fn addr(&self, k: KeySel, a: Addr) -> u64 {
        let (iova, len) = match self.key_index(k) {
            Some(i) => (self.keys[i].iova, self.keys[i].len),
            None => (0, 0),
        };
        match a {
            Addr::Start => iova,
            Addr::End => iova.wrapping_add(len),
            Addr::Off(o) => iova.wrapping_add(u64::from(o) % (len + 16)),
            Addr::Before(b) => iova.wrapping_sub(u64::from(b)),
            Addr::Any(v) => v,
        }
    }

    fn length(&self, k: KeySel, va: u64, l: Len) -> u32 {
        let (iova, len) = match self.key_index(k) {
            Some(i) => (self.keys[i].iova, self.keys[i].len),
            None => (0, 0),
        };
        match l {
            Len::Zero => 0,
            Len::One => 1,
            Len::Eight => 8,
            Len::Whole => len as u32,
            Len::Rest => (iova.wrapping_add(len)).wrapping_sub(va) as u32,
            Len::Mtu => MTU,
            Len::MtuPlus1 => MTU + 1,
            Len::Small(s) => u32::from(s) % 4200,
            Len::Any(v) => v,
        }
    }

    /// Host range of `[va, va+len)` under key `i`, if inside it.
    fn host_range(&self, i: usize, va: u64, len: u64) -> Option<core::ops::Range<usize>> {
        let m = &self.keys[i];
        let off = va.checked_sub(m.iova)?;
        if off > m.len || len > m.len - off {
            return None;
        }
        Some(m.host + off as usize..m.host + (off + len) as usize)
    }

    /// Host bytes a peer may change now: ranges of live keys of the QP's PD that grant
    /// REMOTE_WRITE or REMOTE_ATOMIC (if the QP does too), and receive buffers posted through
    /// live keys with LOCAL_WRITE.
    fn writable(&self) -> Vec<core::ops::Range<usize>> {
        let mut v = Vec::new();
        for (i, m) in self.keys.iter().enumerate() {
            if m.pd != 0 || !self.live(i) {
                continue;
            }
            let remote = (m.rights.contains(RW) && self.qp_access.contains(RW))
                || (m.rights.contains(RA) && self.qp_access.contains(RA));
            if remote {
                v.push(m.host..m.host + m.len as usize);
            }
        }
        for &(i, va, len) in &self.recv_ranges {
            let m = &self.keys[i];
            if m.pd == 0 && m.window.is_none() && self.live(i) && m.rights.contains(LW) {
                let end = va.saturating_add(len).min(m.iova + m.len);
                let start = va.max(m.iova);
                if start < end {
                    let s = m.host + (start - m.iova) as usize;
                    v.push(s..s + (end - start) as usize);
                }
            }
        }
        v
    }

    fn check_bytes(&mut self, allowed: &[core::ops::Range<usize>], what: &Step) {
        let host = self.host();
        if host == &self.shadow[..] {
            return;
        }
        for (i, (a, b)) in host.iter().zip(&self.shadow).enumerate() {
            if a != b && !allowed.iter().any(|r| r.contains(&i)) {
                panic!(
                    "host byte {i} changed ({b:#x} -> {a:#x}) outside every writable range in step {what:?}"
                );
            }
        }
        let h = host.to_vec();
        self.shadow = h;
    }

    /// Compare each key's state in the table with the model; `send_inv` is the key a SEND
    /// with Invalidate of this step named.
    fn check_keys(&mut self, send_inv: Option<u32>) {
        let actx = self.actx();
        for i in 0..self.keys.len() {
            let m = self.keys[i];
            let live = match m.window {
                None => match self.mem.query_mr(m.key) {
                    Ok(_) => !matches!(
                        self.mem.check(
                            AccessCtx {
                                pd: self.pds[m.pd],
                                qpn: QPN
                            },
                            m.key,
                            m.iova,
                            0,
                            Access::NONE
                        ),
                        Err(AccessError::Invalidated(_))
                    ),
                    Err(_) => false,
                },
                Some(_) => self.mem.query_mw(m.key).is_ok_and(|w| w.bound.is_some()),
            };
            if live == m.live {
                continue;
            }
            if !live && send_inv == Some(m.key) {
                if m.window.is_none() {
                    known_issue(
                        SEND_INV_PLAIN_MR,
                        format_args!(
                            "a remote SEND with Invalidate invalidated region {:#x}",
                            m.key
                        ),
                    );
                }
                if m.window == Some(MwType::Type2) {
                    self.keys[i].live = false;
                    continue;
                }
            }
            let _ = actx;
            panic!(
                "key {:#x} (model {i}) changed state by itself: model live {}, table live {live}",
                m.key, m.live
            );
        }
    }

    fn psn(&self, s: PsnSel) -> Psn {
        let e = self.qp.expected_psn();
        match s {
            PsnSel::Expected => e,
            PsnSel::Duplicate(d) => e.sub(u32::from(d) + 1),
            PsnSel::Ahead(d) => e.add(u32::from(d) + 1),
        }
    }

    fn request(&mut self, r: &Req) -> Option<u32> {
        let op = r.op.opcode();
        let info = op.info()?;
        let psn = self.psn(r.psn);
        let epsn = self.qp.expected_psn();
        let mut h = HeaderRepr::new(BthRepr::new(op, QPN, psn));
        h.bth.ack_req = r.ack_req;
        let key = self.key_value(r.key);
        let mut va = self.addr(r.key, r.va);
        let mut len = self.length(r.key, va, r.len);
        let mut rkey = key;
        let dup = psn.diff(epsn) < 0;
        if info.kind == OpKind::ReadRequest && dup && skip(DUP_READ_ANY_RETH) {
            // Only a re-request of (the rest of) the original READ at this PSN.
            let o = self.originals.iter().rev().find(|o| {
                let k = psn.diff(o.psn);
                k >= 0 && (k as u64) * u64::from(MTU) < u64::from(o.len.max(1))
            })?;
            let k = psn.diff(o.psn) as u32;
            rkey = o.rkey;
            va = o.va + u64::from(k * MTU);
            len = o.len - k * MTU;
        }
        let hs = info.headers;
        if hs.has(Headers::RETH) {
            h.reth = Some(RethRepr {
                va,
                rkey,
                dma_len: len,
            });
        }
        if hs.has(Headers::ATOMIC_ETH) {
            h.atomic_eth = Some(AtomicEthRepr {
                va,
                rkey,
                swap_add: r.swap_add,
                compare: r.compare,
            });
        }
        if hs.has(Headers::FETH) {
            h.feth = Some(FethRepr { sel: 0, plt: 1 });
        }
        if hs.has(Headers::DETH) {
            return None;
        }
        if hs.has(Headers::IMMDT) {
            h.immdt = Some(r.compare as u32);
        }
        let mut ieth = None;
        if hs.has(Headers::IETH) {
            let k = self.key_value(r.ieth);
            if skip(SEND_INV_PLAIN_MR)
                && self
                    .find_key(k)
                    .is_some_and(|i| self.keys[i].window.is_none())
            {
                return None;
            }
            h.ieth = Some(k);
            ieth = Some(k);
        }
        let plen = if info.payload {
            match r.payload {
                PayloadLen::Zero => 0,
                PayloadLen::Mtu => MTU as usize,
                PayloadLen::MtuPlus1 => MTU as usize + 1,
                PayloadLen::Eight => 8,
                PayloadLen::Small(s) => usize::from(s) % (MTU as usize + 8),
            }
        } else {
            0
        };
        let payload: Vec<u8> = (0..plen).map(|i| r.fill.wrapping_add(i as u8)).collect();
        let n = Packet {
            hdr: h,
            payload: &payload,
            icrc: 0,
        }
        .emit(&self.ctx, &mut self.pkt)
        .ok()?;
        let pkt = Packet::parse(&self.pkt[..n]).ok()?;
        if info.kind == OpKind::ReadRequest {
            let rr = ReadReq { psn, rkey, va, len };
            if self.sent_reads.len() == 64 {
                self.sent_reads.pop_front();
            }
            self.sent_reads.push_back(rr);
        }
        let spy = Spy {
            mem: &self.mem,
            atomics: RefCell::new(Vec::new()),
        };
        self.qp.handle_packet(self.now, &pkt, &spy, None);
        self.packets_in += 1;
        let executed = spy.atomics.into_inner();
        assert!(
            executed.len() <= 1,
            "one packet executed {} atomics",
            executed.len()
        );
        if let Some(&orig) = executed.first() {
            assert!(
                matches!(info.kind, OpKind::CompareSwap | OpKind::FetchAdd),
                "an atomic executed for {}",
                info.name
            );
            assert_eq!(
                psn, epsn,
                "an atomic executed at PSN {psn:?}, expected {epsn:?}"
            );
            if let Some(prev) = self.atomics.insert(psn.value(), orig) {
                panic!("the atomic at PSN {psn:?} executed twice (first returned {prev:#x})");
            }
        }
        if info.kind == OpKind::ReadRequest && psn == epsn && self.qp.expected_psn() != epsn {
            if self.originals.len() == 64 {
                self.originals.pop_front();
            }
            self.originals.push_back(ReadReq { psn, rkey, va, len });
        }
        ieth
    }

    /// The duplicate READs sent that a responder may serve again: each names the R_Key of
    /// the original READ executed at its PSN and a subset of that READ's bytes (IBTA
    /// 9.7.5.2.2, rxe's `find_resource`).
    fn repeats(&self) -> VecDeque<ReadReq> {
        self.sent_reads
            .iter()
            .filter(|d| {
                self.originals.iter().any(|o| {
                    let k = d.psn.diff(o.psn);
                    k >= 0
                        && (k as u64) * u64::from(MTU) < u64::from(o.len.max(1))
                        && d.rkey == o.rkey
                        && d.va >= o.va
                        && d.va - o.va <= u64::from(o.len)
                        && u64::from(d.len) <= u64::from(o.len) - (d.va - o.va)
                })
            })
            .copied()
            .collect()
    }

    /// The bytes a READ response at `psn` may carry, from the READs in `reads`.
    fn read_source(&self, reads: &VecDeque<ReadReq>, psn: Psn, payload: &[u8]) -> bool {
        reads.iter().any(|o| {
            let k = psn.diff(o.psn);
            if k < 0 || (k as u64) * u64::from(MTU) >= u64::from(o.len.max(1)) {
                return false;
            }
            let off = k as u64 * u64::from(MTU);
            if payload.len() as u64 > u64::from(o.len) - off.min(u64::from(o.len)) {
                return false;
            }
            if payload.is_empty() {
                // A zero-length READ names no memory (its key and address are not checked).
                return o.len == 0;
            }
            let Some(i) = self.find_key(o.rkey) else {
                return false;
            };
            let m = &self.keys[i];
            if m.pd != 0 || !self.live(i) || !m.rights.contains(RR) || !self.qp_access.contains(RR)
            {
                return false;
            }
            match self.host_range(i, o.va.wrapping_add(off), payload.len() as u64) {
                Some(r) => self.host()[r] == *payload,
                None => false,
            }
        })
    }

    fn drain(&mut self, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(len) = self.qp.poll_transmit(self.now, &self.mem, &mut self.buf) else {
                break;
            };
            n += 1;
            let ctx = IcrcContext::v4(IA, IB, port(QPN));
            let p = match Packet::parse_verified(&ctx, &self.buf[..len]) {
                Ok(p) => p,
                Err(e) => panic!("the QP sent a packet that does not verify: {e}"),
            };
            let op = p.hdr.bth.opcode;
            let psn = p.hdr.bth.psn;
            if (Opcode::RC_READ_RESPONSE_FIRST.0..=Opcode::RC_READ_RESPONSE_ONLY.0).contains(&op.0)
            {
                assert!(
                    p.payload.len() <= MTU as usize,
                    "READ response over the MTU"
                );
                if !self.read_source(&self.originals, psn, p.payload)
                    && !self.read_source(&self.repeats(), psn, p.payload)
                {
                    if self.read_source(&self.sent_reads, psn, p.payload) {
                        known_issue(
                            DUP_READ_ANY_RETH,
                            format_args!(
                                "READ response at PSN {psn:?} ({} bytes) serves a duplicate \
                                 READ's RETH, not the original READ at that PSN",
                                p.payload.len()
                            ),
                        );
                    }
                    panic!(
                        "READ response at PSN {psn:?} ({} bytes) matches no READ request",
                        p.payload.len()
                    );
                }
            } else if op == Opcode::RC_ATOMIC_ACK {
                let orig = p.hdr.atomic_ack_eth.map(|a| a.orig);
                let want = self.atomics.get(&psn.value()).copied();
                assert!(
                    want.is_some() && want == orig,
                    "atomic ACK at PSN {psn:?} carries {orig:?}, the execution returned {want:?}"
                );
            } else {
                assert_eq!(op, Opcode::RC_ACK, "the responder sent a request");
            }
        }
        n
    }

    fn poll_wcs(&mut self) {
        while let Some(wc) = self.qp.poll_completion() {
            assert!(
                matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                "a send completion on a QP that posted no send: {wc:?}"
            );
            self.recv_wcs += 1;
            assert!(
                self.recv_wcs <= self.recvs_posted,
                "{} receive completions for {} receives posted",
                self.recv_wcs,
                self.recvs_posted
            );
        }
    }

    fn step(&mut self, s: &Step) {
        let allowed = self.writable();
        let mut send_inv = None;
        match *s {
            Step::Request(ref r) => send_inv = self.request(r),
            Step::PostRecv { key, va, len } => {
                let addr = self.addr(key, va);
                let l = self.length(key, addr, len);
                let lkey = self.key_value(key);
                let sge = [Sge {
                    addr,
                    length: l,
                    lkey,
                }];
                if self
                    .qp
                    .post_recv(&RecvWr {
                        wr_id: self.recvs_posted,
                        sg_list: &sge,
                    })
                    .is_ok()
                {
                    self.recvs_posted += 1;
                    if let Some(i) = self.key_index(key) {
                        self.recv_ranges.push((i, addr, u64::from(l)));
                    }
                }
            }
            Step::Drain(m) => {
                self.drain(usize::from(m));
            }
            Step::Advance(ns) => {
                self.now += u64::from(ns) * 64;
                if self.qp.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.qp.handle_timeout(self.now);
                }
            }
            Step::AckNow => self.qp.ack_now(),
            Step::Invalidate(i) => {
                let i = usize::from(i) % self.keys.len();
                let m = self.keys[i];
                let ok = match m.window {
                    None => self.mem.invalidate_mr(m.key).is_ok(),
                    Some(_) => self
                        .mem
                        .invalidate(self.actx(), m.key, Invalidator::Local)
                        .is_ok(),
                };
                if ok {
                    self.keys[i].live = false;
                }
            }
            Step::Dereg(i) => {
                let i = usize::from(i) % self.keys.len();
                let m = self.keys[i];
                let ok = match m.window {
                    None => self.mem.dereg_mr(m.key).is_ok(),
                    Some(_) => self.mem.dealloc_mw(m.key).is_ok(),
                };
                if ok {
                    self.keys[i].live = false;
                    // A freed key value matches nothing of ours any more.
                    self.keys[i].key = 0;
                }
            }
            Step::RebindMw2 => {
                let m = self.keys[7];
                let p = self.keys[0];
                let nk = (m.key & !0xff) | (m.key.wrapping_add(1) & 0xff);
                let actx = self.actx();
                if !m.live
                    && m.key != 0
                    && self
                        .mem
                        .bind_mw(
                            actx,
                            softrdma::mem::MwBind {
                                mw_key: m.key,
                                new_rkey: nk,
                                mr_lkey: p.key,
                                iova: m.iova,
                                len: m.len,
                                access: m.rights,
                            },
                        )
                        .is_ok()
                {
                    self.keys[7].key = nk;
                    self.keys[7].live = true;
                }
            }
            Step::Reconnect(psn) => {
                let mut a = *self.qp.attr();
                a.qp_state = QpState::Reset;
                self.qp.modify(&a, softrdma::rc::QpAttrMask::STATE).unwrap();
                self.poll_wcs();
                self.rq_psn = psn & Psn::MASK;
                self.connect();
                self.originals.clear();
                self.sent_reads.clear();
                self.atomics.clear();
                self.recv_ranges.clear();
            }
        }
        assert_eq!(self.qp.counters().packets_received, self.packets_in);
        self.check_bytes(&allowed, s);
        self.check_keys(send_inv);
        self.poll_wcs();
    }
}

fuzz_target!(|input: Input| {
    let mut w = World::new(input.qp_access);
    for s in input.steps.iter().take(256) {
        w.step(s);
    }
    let allowed = w.writable();
    let n = w.drain(MAX_DRAIN + 1);
    assert!(n <= MAX_DRAIN, "more than {MAX_DRAIN} answers queued");
    w.check_bytes(&allowed, &Step::Drain(0));
    w.poll_wcs();
    let (host, host_len) = (w.host, w.host_len);
    drop(w);
    // SAFETY: the table is gone; `host` came from `Box::into_raw` of `host_len` bytes.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(host, host_len)) });
});
