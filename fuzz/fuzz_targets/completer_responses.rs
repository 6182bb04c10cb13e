//! A requester with a few outstanding work requests (SEND, WRITE, READ, atomics) fed
//! arbitrary responses — ACK, NAK and RNR NAK with any syndrome, READ responses of every
//! position with any PSN and length, atomic ACKs — built against the PSNs of the requests it
//! sent, with time passing (retransmissions, RNR back-off, retry exhaustion).
//!
//! The remote memory is virtual: the byte at remote address `x` is [`remote_byte`]`(x)`,
//! which READ responses carry. Every work request reads or writes its own slot of one local
//! region (raw, in place, with guard bytes around the slots).
//!
//! Invariants, checked after every step:
//! - no panic; every packet sent verifies; every completion names an outstanding WR and each
//!   WR completes at most once, exactly once (if signaled) after the QP is flushed at the end;
//! - only the local SGEs of READs and atomics still outstanding change (guards intact, and a
//!   completed READ's buffer is never written again);
//! - a READ completing with success holds exactly the remote bytes it asked for; an atomic
//!   completing with success holds the value of an atomic ACK sent at its PSN;
//! - packets counted in and out agree with the counters.
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, PinMode, RawCopy, WatchMode};
use softrdma::rc::{
    Mtu, Qp, QpAttr, QpAttrMask, QpCap, QpInit, QpState, SendFlags, SendWr, Sge, WcOpcode,
    WcStatus, WrOpcode,
};
use softrdma::wire::{AddressVector, 
    AethRepr, AtomicAckEthRepr, BthRepr, HeaderRepr, IcrcContext, Opcode, Packet, Psn, Syndrome,
};

const QPN: u32 = 0x11;
const PEER: u32 = 0x22;
const MTU: u32 = 256;
const IA: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// Local slots: `SLOTS` of `SLOT` bytes, each with `GUARD` bytes before it.
const SLOTS: usize = 8;
const SLOT: usize = 1024;
const GUARD: usize = 32;
const REGION: usize = SLOTS * (SLOT + GUARD) + GUARD;
/// Remote addresses: WR `n` targets `REMOTE_BASE + n * REMOTE_STRIDE + offset`.
const REMOTE_BASE: u64 = 0x10_0000_0000;
const REMOTE_STRIDE: u64 = 0x1_0000;
const RKEY: u32 = 0x1234_5678;
const SQ_PSN: u32 = 0x00ff_fffa;

/// The byte at remote address `x` (never zero).
fn remote_byte(x: u64) -> u8 {
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 | 1
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum WrKind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CompareSwap,
    FetchAdd,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Post {
    kind: WrKind,
    slot: u8,
    len: u16,
    two_sges: bool,
    signaled: bool,
    fence: bool,
    remote_off: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Base {
    /// The first PSN of an outstanding WR (by index among them).
    Wr(u8),
    /// The newest PSN sent.
    Newest,
    /// The oldest PSN of an outstanding WR.
    Oldest,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Offset {
    Zero,
    Plus(u8),
    Minus(u8),
    Any(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Syn {
    Ack,
    Byte(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PayloadLen {
    Expected,
    ExpectedMinus1,
    ExpectedPlus1,
    Zero,
    Mtu,
    Small(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RespKind {
    Ack,
    ReadFirst(PayloadLen),
    ReadMiddle(PayloadLen),
    ReadLast(PayloadLen),
    ReadOnly(PayloadLen),
    AtomicAck(u64),
    Other(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Resp {
    base: Base,
    offset: Offset,
    kind: RespKind,
    syndrome: Syn,
    msn: u32,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Step {
    Post(Post),
    Drain(u8),
    Respond(Resp),
    Advance(u32),
    PollCompletions,
    Reconnect,
}

#[derive(Arbitrary, Debug)]
struct Input {
    sq_sig_all: bool,
    retry_cnt: u8,
    rnr_retry: u8,
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
struct Wr {
    kind: WrKind,
    /// Host ranges of its local SGEs (offsets into the region), in order.
    sges: Vec<core::ops::Range<usize>>,
    remote: u64,
    len: u32,
    signaled: bool,
    /// The PSN of its first request packet, once sent.
    psn: Option<Psn>,
}

struct World {
    mem: MemoryTable,
    qp: Qp,
    host: *mut u8,
    shadow: Vec<u8>,
    lkey: u32,
    pd: u32,
    sq_sig_all: bool,
    retry_cnt: u8,
    rnr_retry: u8,
    /// Outstanding WRs by wr_id (posting order).
    wrs: BTreeMap<u64, Wr>,
    next_id: u64,
    /// Values of atomic ACKs sent, by PSN.
    atomic_acks: HashMap<u32, Vec<u64>>,
    newest: Option<Psn>,
    buf: Vec<u8>,
    pkt: Vec<u8>,
    payload: Vec<u8>,
    now: u64,
    packets_in: u64,
    packets_out: u64,
}

fn port(qpn: u32) -> u16 {
    0xc000 | (qpn as u16 & 0x3fff)
}

fn slot_range(slot: u8) -> core::ops::Range<usize> {
    let s = usize::from(slot) % SLOTS;
    let start = GUARD + s * (SLOT + GUARD);
    start..start + SLOT
}

impl World {
    fn new(input: &Input) -> World {
        let mem = MemoryTable::new(MemConfig {
            pin_mode: PinMode::OnDemand,
            max_keys: 8,
            max_pds: 2,
            watch: WatchMode::Off,
            raw_copy: RawCopy::Plain,
            ..MemConfig::default()
        })
        .unwrap();
        let pd = mem.alloc_pd().unwrap();
        let host = Box::into_raw(vec![0u8; REGION].into_boxed_slice()) as *mut u8;
        // SAFETY: the buffer is freed only after the table is dropped (end of the target).
        let src = unsafe { MemSource::raw(host, REGION) };
        let mr = mem
            .reg_mr(pd, src, Access::LOCAL_WRITE, Some(0x4000_0000))
            .unwrap();
        let qp = Qp::new(QpInit {
            qp_num: QPN,
            pd,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 1,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            srq: None,
            sq_sig_all: input.sq_sig_all,
            qp_type: Default::default(),
        })
        .unwrap();
        let mut w = World {
            mem,
            qp,
            host,
            shadow: vec![0u8; REGION],
            lkey: mr.lkey,
            pd,
            sq_sig_all: input.sq_sig_all,
            retry_cnt: input.retry_cnt % 8,
            rnr_retry: input.rnr_retry % 8,
            wrs: BTreeMap::new(),
            next_id: 0,
            atomic_acks: HashMap::new(),
            newest: None,
            buf: vec![0u8; 4096],
            pkt: vec![0u8; 4096],
            payload: Vec::with_capacity(4096),
            now: 0,
            packets_in: 0,
            packets_out: 0,
        };
        w.connect();
        w
    }

    fn connect(&mut self) {
        self.qp
            .connect(&QpAttr {
                qp_access_flags: Access::LOCAL_WRITE,
                av: Some(AddressVector::from_context(IcrcContext::v4(IA, IB, port(QPN)))),
                path_mtu: Mtu::Mtu256,
                timeout: 1,
                retry_cnt: self.retry_cnt,
                rnr_retry: self.rnr_retry,
                rq_psn: 0,
                sq_psn: SQ_PSN,
                max_rd_atomic: 2,
                max_dest_rd_atomic: 2,
                min_rnr_timer: 1,
                dest_qp_num: PEER,
                ..QpAttr::default()
            })
            .unwrap();
        self.qp.set_send_window(16);
    }

    fn host(&self) -> &[u8] {
        // SAFETY: `host` is a live allocation of REGION bytes; the table writes to it only
        // inside calls, and no call runs while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.host, REGION) }
    }

    fn zero(&mut self, r: core::ops::Range<usize>) {
        // SAFETY: as in `host`, and `&mut self` excludes any other borrow of the buffer.
        unsafe { core::slice::from_raw_parts_mut(self.host, REGION)[r].fill(0) }
    }

    fn post(&mut self, p: &Post) {
        // Outstanding WRs keep their buffers to themselves.
        self.poll();
        let busy = slot_range(p.slot);
        if self.wrs.values().any(|w| {
            w.sges
                .iter()
                .any(|r| r.start < busy.end && busy.start < r.end)
        }) {
            return;
        }
        let id = self.next_id;
        let slot = slot_range(p.slot);
        let atomic = matches!(p.kind, WrKind::CompareSwap | WrKind::FetchAdd);
        let len = if atomic {
            8
        } else {
            usize::from(p.len) % (SLOT + 1)
        };
        let mut sges = Vec::new();
        if atomic {
            sges.push(slot.start..slot.start + 8);
        } else if p.two_sges && len > 1 {
            // Two pieces with a gap between them (the gap must stay intact).
            let a = len / 2;
            sges.push(slot.start..slot.start + a);
            let b0 = (slot.start + a + 16).min(slot.end - (len - a));
            sges.push(b0..b0 + (len - a));
        } else {
            sges.push(slot.start..slot.start + len);
        }
        let sge: Vec<Sge> = sges
            .iter()
            .map(|r| Sge {
                addr: 0x4000_0000 + r.start as u64,
                length: r.len() as u32,
                lkey: self.lkey,
            })
            .collect();
        let remote = REMOTE_BASE
            + id * REMOTE_STRIDE
            + if atomic {
                u64::from(p.remote_off & !7)
            } else {
                u64::from(p.remote_off)
            };
        let op = match p.kind {
            WrKind::Send => WrOpcode::Send,
            WrKind::SendImm => WrOpcode::SendWithImm { imm: 7 },
            WrKind::Write => WrOpcode::RdmaWrite {
                remote_addr: remote,
                rkey: RKEY,
            },
            WrKind::WriteImm => WrOpcode::RdmaWriteWithImm {
                remote_addr: remote,
                rkey: RKEY,
                imm: 9,
            },
            WrKind::Read => WrOpcode::RdmaRead {
                remote_addr: remote,
                rkey: RKEY,
            },
            WrKind::CompareSwap => WrOpcode::AtomicCmpAndSwp {
                remote_addr: remote,
                rkey: RKEY,
                compare: 1,
                swap: 2,
            },
            WrKind::FetchAdd => WrOpcode::AtomicFetchAndAdd {
                remote_addr: remote,
                rkey: RKEY,
                add: 3,
            },
        };
        let mut flags = SendFlags::NONE;
        if p.signaled {
            flags = flags | SendFlags::SIGNALED;
        }
        if p.fence {
            flags = flags | SendFlags::FENCE;
        }
        let wr = SendWr::new(id, op).sg(&sge).flags(flags);
        if self.qp.post_send(&wr).is_ok() {
            self.next_id += 1;
            if matches!(p.kind, WrKind::Read) || atomic {
                // Start from zeros so that bytes never delivered show.
                for r in &sges {
                    self.zero(r.clone());
                    self.shadow[r.clone()].fill(0);
                }
            }
            self.wrs.insert(
                id,
                Wr {
                    kind: p.kind,
                    sges,
                    remote,
                    len: len as u32,
                    signaled: self.sq_sig_all || p.signaled,
                    psn: None,
                },
            );
        }
    }

    /// The WR whose remote range holds `va`.
    fn wr_of(&mut self, va: u64) -> Option<&mut Wr> {
        let id = va.checked_sub(REMOTE_BASE)? / REMOTE_STRIDE;
        self.wrs.get_mut(&id)
    }

    fn drain(&mut self, max: usize) {
        let ctx = IcrcContext::v4(IA, IB, port(QPN));
        for _ in 0..max {
            let Some(n) = self.qp.poll_transmit(self.now, &self.mem, &mut self.buf) else {
                break;
            };
            self.packets_out += 1;
            let p = match Packet::parse_verified(&ctx, &self.buf[..n]) {
                Ok(p) => p,
                Err(e) => panic!("the QP sent a packet that does not verify: {e}"),
            };
            let psn = p.hdr.bth.psn;
            if self.newest.is_none_or(|q| psn.diff(q) > 0) {
                self.newest = Some(psn);
            }
            let va = p.hdr.reth.map(|r| r.va).or(p.hdr.atomic_eth.map(|a| a.va));
            let op = p.hdr.bth.opcode;
            if let Some(va) = va
                && let Some(w) = self.wr_of(va)
                && w.psn.is_none()
            {
                let k = (va - w.remote) / u64::from(MTU);
                w.psn = Some(psn.sub(k as u32));
            } else if va.is_none()
                && matches!(
                    op,
                    Opcode::RC_SEND_FIRST | Opcode::RC_SEND_ONLY | Opcode::RC_SEND_ONLY_IMM
                )
            {
                // A SEND: the oldest SEND not yet numbered.
                if let Some(w) = self
                    .wrs
                    .values_mut()
                    .find(|w| matches!(w.kind, WrKind::Send | WrKind::SendImm) && w.psn.is_none())
                {
                    w.psn = Some(psn);
                }
            }
        }
    }

    fn base_psn(&self, b: Base) -> Psn {
        let sent: Vec<Psn> = self.wrs.values().filter_map(|w| w.psn).collect();
        let fallback = self.newest.unwrap_or(Psn::new(SQ_PSN));
        match b {
            Base::Wr(i) if !sent.is_empty() => sent[usize::from(i) % sent.len()],
            Base::Oldest if !sent.is_empty() => sent[0],
            _ => fallback,
        }
    }

    fn respond(&mut self, r: &Resp) {
        let base = self.base_psn(r.base);
        let psn = match r.offset {
            Offset::Zero => base,
            Offset::Plus(d) => base.add(u32::from(d)),
            Offset::Minus(d) => base.sub(u32::from(d)),
            Offset::Any(v) => Psn::new(v & Psn::MASK),
        };
        let syndrome = match r.syndrome {
            Syn::Ack => Syndrome::Ack { credits: 0x1f },
            Syn::Byte(b) => Syndrome::from_byte(b),
        };
        let aeth = Some(AethRepr {
            syndrome,
            msn: r.msn & 0x00ff_ffff,
        });
        // The READ this PSN falls in, for the bytes a response carries.
        let read = self.wrs.values().find_map(|w| {
            let p = w.psn?;
            let k = psn.diff(p);
            (matches!(w.kind, WrKind::Read)
                && k >= 0
                && (k as u64) * u64::from(MTU) <= u64::from(w.len))
            .then_some((w.remote, w.len, k as u32))
        });
        let (opcode, plen) = match r.kind {
            RespKind::Ack => (Opcode::RC_ACK, None),
            RespKind::ReadFirst(l) => (Opcode::RC_READ_RESPONSE_FIRST, Some(l)),
            RespKind::ReadMiddle(l) => (Opcode::RC_READ_RESPONSE_MIDDLE, Some(l)),
            RespKind::ReadLast(l) => (Opcode::RC_READ_RESPONSE_LAST, Some(l)),
            RespKind::ReadOnly(l) => (Opcode::RC_READ_RESPONSE_ONLY, Some(l)),
            RespKind::AtomicAck(_) => (Opcode::RC_ATOMIC_ACK, None),
            RespKind::Other(b) => (Opcode(b), None),
        };
        let Some(info) = opcode.info() else { return };
        let mut h = HeaderRepr::new(BthRepr::new(opcode, QPN, psn));
        if info.headers.has(softrdma::wire::Headers::AETH) {
            h.aeth = aeth;
        }
        if let RespKind::AtomicAck(v) = r.kind {
            h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: v });
        }
        if info.headers.0
            & !(softrdma::wire::Headers::AETH.0 | softrdma::wire::Headers::ATOMIC_ACK_ETH.0)
            != 0
        {
            return;
        }
        self.payload.clear();
        if let Some(l) = plen {
            let (remote, len, k) = read.unwrap_or((0, MTU, 0));
            let off = k * MTU;
            let expected = len.saturating_sub(off).min(MTU);
            let n = match l {
                PayloadLen::Expected => expected,
                PayloadLen::ExpectedMinus1 => expected.saturating_sub(1),
                PayloadLen::ExpectedPlus1 => expected + 1,
                PayloadLen::Zero => 0,
                PayloadLen::Mtu => MTU,
                PayloadLen::Small(s) => u32::from(s) % (MTU + 4),
            };
            let start = remote + u64::from(off);
            self.payload
                .extend((0..u64::from(n)).map(|j| remote_byte(start + j)));
        }
        let Ok(n) = (Packet {
            hdr: h,
            payload: &self.payload,
            icrc: 0,
        })
        .emit(&IcrcContext::v4(IB, IA, port(PEER)), &mut self.pkt) else {
            return;
        };
        let Ok(pkt) = Packet::parse(&self.pkt[..n]) else {
            return;
        };
        if let RespKind::AtomicAck(v) = r.kind {
            self.atomic_acks.entry(psn.value()).or_default().push(v);
        }
        self.qp.handle_packet(self.now, &pkt, &self.mem, None);
        self.packets_in += 1;
    }

    /// Local bytes that may change now: the SGEs of READs and atomics outstanding.
    fn writable(&self) -> Vec<core::ops::Range<usize>> {
        self.wrs
            .values()
            .filter(|w| {
                matches!(
                    w.kind,
                    WrKind::Read | WrKind::CompareSwap | WrKind::FetchAdd
                )
            })
            .flat_map(|w| w.sges.iter().cloned())
            .collect()
    }

    fn check_bytes(&mut self, allowed: &[core::ops::Range<usize>], s: &Step) {
        let host = self.host();
        if host == &self.shadow[..] {
            return;
        }
        for (i, (a, b)) in host.iter().zip(&self.shadow).enumerate() {
            if a != b && !allowed.iter().any(|r| r.contains(&i)) {
                panic!(
                    "local byte {i} changed ({b:#x} -> {a:#x}) outside every outstanding READ/atomic SGE in step {s:?}"
                );
            }
        }
        let h = host.to_vec();
        self.shadow = h;
    }

    fn poll(&mut self) {
        while let Some(wc) = self.qp.poll_completion() {
            assert!(
                !wc.is_recv(),
                "a receive completion on a QP that posted none"
            );
            let Some(w) = self.wrs.remove(&wc.wr_id) else {
                panic!(
                    "completion of WR {} which is not outstanding: {wc:?}",
                    wc.wr_id
                );
            };
            // Completions come in posting order: the unsignaled WRs before this one are done.
            let earlier: Vec<u64> = self.wrs.range(..wc.wr_id).map(|(id, _)| *id).collect();
            for id in earlier {
                let e = self.wrs.remove(&id).unwrap();
                assert!(
                    !e.signaled,
                    "signaled WR {id} not completed before WR {} ({wc:?})",
                    wc.wr_id
                );
            }
            if wc.status != WcStatus::Success {
                continue;
            }
            let host = self.host();
            match w.kind {
                WrKind::Read => {
                    assert_eq!(wc.opcode, WcOpcode::RdmaRead);
                    let mut i = 0u64;
                    for r in &w.sges {
                        for (j, &b) in host[r.clone()].iter().enumerate() {
                            let want = remote_byte(w.remote + i + j as u64);
                            assert_eq!(
                                b,
                                want,
                                "READ WR completed with success, byte {} of {} is {b:#x}, the remote holds {want:#x}",
                                i + j as u64,
                                w.len
                            );
                        }
                        i += r.len() as u64;
                    }
                }
                WrKind::CompareSwap | WrKind::FetchAdd => {
                    let r = w.sges[0].clone();
                    let got = u64::from_ne_bytes(host[r].try_into().unwrap());
                    let psn = w.psn.expect("a completed atomic was sent");
                    let sent = self.atomic_acks.get(&psn.value());
                    assert!(
                        sent.is_some_and(|v| v.contains(&got)),
                        "atomic WR completed with {got:#x}, no atomic ACK at PSN {psn:?} carried it ({sent:?})"
                    );
                }
                _ => {}
            }
        }
    }

    fn step(&mut self, s: &Step) {
        let allowed = self.writable();
        match *s {
            Step::Post(ref p) => self.post(p),
            Step::Drain(n) => self.drain(usize::from(n)),
            Step::Respond(ref r) => self.respond(r),
            Step::Advance(ns) => {
                self.now += u64::from(ns) * 256;
                if self.qp.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.qp.handle_timeout(self.now);
                }
            }
            Step::PollCompletions => self.poll(),
            Step::Reconnect => {
                self.poll();
                if self.qp.state() == QpState::Err && self.wrs.is_empty() {
                    let mut a = *self.qp.attr();
                    a.qp_state = QpState::Reset;
                    self.qp.modify(&a, QpAttrMask::STATE).unwrap();
                    self.connect();
                    self.newest = None;
                    self.atomic_acks.clear();
                }
            }
        }
        self.check_bytes(&allowed, s);
        let c = self.qp.counters();
        assert_eq!(c.packets_received, self.packets_in);
        assert_eq!(c.packets_sent, self.packets_out);
    }

    /// Flush: the QP to the error state, then every signaled WR must have completed.
    fn finish(&mut self) {
        let allowed = self.writable();
        self.poll();
        let mut a = *self.qp.attr();
        a.qp_state = QpState::Err;
        self.qp.modify(&a, QpAttrMask::STATE).unwrap();
        for _ in 0..64 {
            self.poll();
        }
        self.check_bytes(&allowed, &Step::PollCompletions);
        let left: Vec<u64> = self
            .wrs
            .iter()
            .filter(|(_, w)| w.signaled)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            left.is_empty(),
            "signaled WRs never completed after the flush: {left:?}"
        );
        let _ = self.pd;
    }
}

fuzz_target!(|input: Input| {
    let mut w = World::new(&input);
    for s in input.steps.iter().take(256) {
        w.step(s);
    }
    w.finish();
    let host = w.host;
    drop(w);
    // SAFETY: the table is gone; `host` came from `Box::into_raw` of REGION bytes.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(host, REGION)) });
});
