//! The receivers of a UD QP and a UC QP (the sans-IO transport) fed by a hostile sender:
//! datagrams with right, wrong and "use the QP's" Q_Keys, every length up to past the MTU,
//! with and without immediate; UC packets of every UC opcode (and foreign ones) at PSNs in
//! order, behind and ahead, with R_Keys of the writable region, of a read-only one and
//! unknown, ranges in and out of bounds; raw bytes through the parser; receives posted of
//! every length (too short for the GRH area among them). The memory is one host buffer with
//! guard bytes between the registered regions.
//!
//! Invariants, checked after every step:
//! - no byte changes outside the writable region (UC WRITE target) and the receive buffers
//!   posted: guards and the read-only region never change;
//! - a UD receive completes only for a datagram with the QP's Q_Key, that fits its buffer with
//!   the GRH area, with `byte_len` = 40 + payload, `src_qp` the DETH's, the GRH flag, and the
//!   payload's bytes behind the area;
//! - a UC receive completion's length fits its buffer, and receive completions never
//!   outnumber receives posted;
//! - neither QP ever sends anything (no acknowledgements, no NAKs); no panic.
#![no_main]

use std::net::Ipv4Addr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, PinMode, RawCopy, WatchMode};
use softrdma::rc::{
    DatagramSource, GRH_LEN, Mtu, Qp, QpAttr, QpCap, QpInit, QpType, RecvWr, Sge, WcStatus,
};
use softrdma::wire::{AddressVector, 
    BthRepr, DethRepr, HeaderRepr, IcrcContext, IpHeader, Opcode, Packet, Psn, RethRepr,
};

const UD_QPN: u32 = 0x31;
const UC_QPN: u32 = 0x32;
const PEER_QPN: u32 = 0x42;
const QKEY: u32 = 0x1234_5678;
const MTU: usize = 256;
const UC_RQ_PSN: u32 = 100;
const GUARD: usize = 64;
const IA: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// The regions: (length, rights). 0: writable (UC WRITE target); 1: read-only; 2: receive
/// buffers.
const REGIONS: [(usize, Access); 3] = [
    (1024, Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0)),
    (512, Access::REMOTE_READ),
    (4096, Access::LOCAL_WRITE),
];

#[derive(Arbitrary, Debug)]
enum Step {
    /// Post a receive on the UD (`ud`) or UC QP: `len` bytes at `off` in the receive region.
    PostRecv { ud: bool, off: u16, len: u16 },
    /// A UD datagram.
    Ud {
        qkey: QkeySel,
        imm: Option<u32>,
        len: u16,
        fill: u8,
        src_qp: u32,
        se: bool,
        /// Sent to another QP number than the UD QP's.
        other_qpn: bool,
    },
    /// A UC packet: `opcode` picks among the UC opcodes (or any byte when out of range).
    Uc {
        opcode: u8,
        psn_delta: i8,
        reth: Option<(KeySel, u16, u32)>,
        imm: Option<u32>,
        len: u16,
        fill: u8,
    },
    /// Raw bytes through the parser, to either QP.
    Raw { ud: bool, bytes: Vec<u8> },
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QkeySel {
    Right,
    Wrong,
    HighBit,
    Any(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeySel {
    Writable,
    ReadOnly,
    Recv,
    Unknown(u32),
}

struct World {
    mem: MemoryTable,
    ud: Qp,
    uc: Qp,
    host: *mut u8,
    host_len: usize,
    shadow: Vec<u8>,
    /// (host offset, iova, length) of each region.
    regions: Vec<(usize, u64, u64)>,
    keys: Vec<u32>,
    /// Host ranges receives were posted over (either QP).
    recv_ranges: Vec<(usize, usize)>,
    /// The UD QP's posted receives in order: (host offset, length).
    ud_recvs: std::collections::VecDeque<(usize, usize)>,
    uc_recv_lens: std::collections::VecDeque<u64>,
    recvs_posted: u64,
    recv_wcs: u64,
    uc_psn: Psn,
}

impl World {
    fn new() -> World {
        let mem = MemoryTable::new(MemConfig {
            pin_mode: PinMode::OnDemand,
            max_keys: 16,
            max_pds: 2,
            watch: WatchMode::Off,
            raw_copy: RawCopy::Plain,
            ..MemConfig::default()
        })
        .unwrap();
        let pd = mem.alloc_pd().unwrap();
        let host_len = REGIONS.iter().map(|r| r.0 + GUARD).sum::<usize>() + GUARD;
        let host: Box<[u8]> = (0..host_len).map(|i| (i * 7 + 3) as u8).collect();
        let shadow = host.to_vec();
        let host = Box::into_raw(host) as *mut u8;
        let (mut regions, mut keys) = (Vec::new(), Vec::new());
        let mut off = GUARD;
        for (i, &(len, rights)) in REGIONS.iter().enumerate() {
            let iova = 0x1_0000_0000 * (i as u64 + 1);
            // SAFETY: inside the host buffer, freed only after the table is dropped.
            let src = unsafe { MemSource::raw(host.add(off), len) };
            let mr = mem.reg_mr(pd, src, rights, Some(iova)).unwrap();
            regions.push((off, iova, len as u64));
            keys.push(mr.lkey);
            off += len + GUARD;
        }
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mk = |qpn, t| {
            Qp::new(QpInit {
                qp_num: qpn,
                pd,
                cap,
                srq: None,
                sq_sig_all: false,
                qp_type: t,
            })
            .unwrap()
        };
        let mut ud = mk(UD_QPN, QpType::Ud);
        ud.set_port_mtu(Mtu::Mtu256);
        ud.connect(&QpAttr {
            qkey: QKEY,
            ..QpAttr::default()
        })
        .unwrap();
        let mut uc = mk(UC_QPN, QpType::Uc);
        uc.connect(&QpAttr {
            av: Some(AddressVector::from_context(IcrcContext::v4(IB, IA, 0xc000))),
            path_mtu: Mtu::Mtu256,
            dest_qp_num: PEER_QPN,
            rq_psn: UC_RQ_PSN,
            qp_access_flags: Access::REMOTE_WRITE,
            ..QpAttr::default()
        })
        .unwrap();
        World {
            mem,
            ud,
            uc,
            host,
            host_len,
            shadow,
            regions,
            keys,
            recv_ranges: Vec::new(),
            ud_recvs: Default::default(),
            uc_recv_lens: Default::default(),
            recvs_posted: 0,
            recv_wcs: 0,
            uc_psn: Psn::new(UC_RQ_PSN),
        }
    }

    fn host(&self) -> &[u8] {
        // SAFETY: `host` is a live allocation of `host_len` bytes; the table writes to it only
        // inside calls, and no call runs while this borrow lives.
        unsafe { core::slice::from_raw_parts(self.host, self.host_len) }
    }

    fn from(&self, len: usize) -> DatagramSource {
        DatagramSource {
            ip: IpHeader::V4 {
                src: IA,
                dst: IB,
                id: 7,
                dont_fragment: true,
            },
            udp_payload_len: len,
        }
    }

    fn step(&mut self, s: &Step) {
        match *s {
            Step::PostRecv { ud, off, len } => {
                let (roff, iova, rlen) = self.regions[2];
                let off = u64::from(off) % rlen;
                let len = u64::from(len).min(rlen - off);
                let wr = RecvWr {
                    wr_id: self.recvs_posted,
                    sg_list: &[Sge {
                        addr: iova + off,
                        length: len as u32,
                        lkey: self.keys[2],
                    }],
                };
                let qp = if ud { &mut self.ud } else { &mut self.uc };
                if qp.post_recv(&wr).is_ok() {
                    self.recvs_posted += 1;
                    let h = roff + off as usize;
                    self.recv_ranges.push((h, h + len as usize));
                    if ud {
                        self.ud_recvs.push_back((h, len as usize));
                    } else {
                        self.uc_recv_lens.push_back(len);
                    }
                }
            }
            Step::Ud {
                qkey,
                imm,
                len,
                fill,
                src_qp,
                se,
                other_qpn,
            } => {
                let len = usize::from(len) % (MTU + 64);
                let payload = vec![fill; len];
                let qk = match qkey {
                    QkeySel::Right => QKEY,
                    QkeySel::Wrong => QKEY ^ 1,
                    QkeySel::HighBit => 0x8000_0000,
                    QkeySel::Any(k) => k,
                };
                let op = if imm.is_some() {
                    Opcode::UD_SEND_ONLY_IMM
                } else {
                    Opcode::UD_SEND_ONLY
                };
                let dest = if other_qpn { UD_QPN + 1 } else { UD_QPN };
                let mut h = HeaderRepr::new(BthRepr::new(op, dest, Psn::new(0)));
                h.deth = Some(DethRepr {
                    qkey: qk,
                    src_qp: src_qp & 0x00ff_ffff,
                });
                h.immdt = imm;
                h.bth.se = se;
                let pkt = Packet {
                    hdr: h,
                    payload: &payload,
                    icrc: 0,
                };
                let before = self.recv_wcs;
                let from = self.from(len + 40);
                self.ud
                    .handle_packet_from(0, &pkt, Some(&from), &self.mem, None);
                let mut got = 0;
                while let Some(wc) = self.ud.poll_recv_completion() {
                    got += 1;
                    self.recv_wcs += 1;
                    assert!(
                        self.recv_wcs <= self.recvs_posted,
                        "more receives than posted"
                    );
                    let (h, blen) = self.ud_recvs.pop_front().expect("a posted receive");
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    assert!(
                        !other_qpn && qk == QKEY,
                        "delivered with Q_Key {qk:#x}: {wc:?}"
                    );
                    assert!(len <= MTU, "a datagram longer than the MTU was delivered");
                    assert!(GRH_LEN + len <= blen, "delivered into a buffer too short");
                    assert_eq!(wc.byte_len as usize, GRH_LEN + len);
                    assert_eq!(wc.src_qp, src_qp & 0x00ff_ffff);
                    assert_eq!(wc.grh, Some(softrdma::rc::NetworkHdr::Ipv4));
                    assert_eq!(wc.imm_data, imm);
                    let host = self.host();
                    assert_eq!(&host[h + GRH_LEN..h + GRH_LEN + len], &payload[..]);
                    assert_eq!(host[h + 20], 0x45, "the IPv4 header in the GRH area");
                }
                assert!(got <= 1, "one datagram, {got} completions (from {before})");
            }
            Step::Uc {
                opcode,
                psn_delta,
                reth,
                imm,
                len,
                fill,
            } => {
                let op = if (0x20..=0x2b).contains(&opcode) || opcode == 0x64 {
                    Opcode(opcode)
                } else {
                    Opcode(0x20 + opcode % 12)
                };
                let Some(info) = op.info() else { return };
                let len = usize::from(len) % (MTU + 32);
                let payload = vec![fill; len];
                let psn = self.uc_psn.add(i32::from(psn_delta) as u32);
                let mut h = HeaderRepr::new(BthRepr::new(op, UC_QPN, psn));
                if info.headers.has(softrdma::wire::Headers::RETH) {
                    let (k, off, dma) = reth.unwrap_or((KeySel::Writable, 0, len as u32));
                    let (key, base) = match k {
                        KeySel::Writable => (self.keys[0], self.regions[0].1),
                        KeySel::ReadOnly => (self.keys[1], self.regions[1].1),
                        KeySel::Recv => (self.keys[2], self.regions[2].1),
                        KeySel::Unknown(k) => (k, 0x5000),
                    };
                    h.reth = Some(RethRepr {
                        va: base + u64::from(off),
                        rkey: key,
                        dma_len: dma,
                    });
                }
                if info.headers.has(softrdma::wire::Headers::IMMDT) {
                    h.immdt = Some(imm.unwrap_or(0));
                }
                if info.headers.has(softrdma::wire::Headers::DETH) {
                    h.deth = Some(DethRepr {
                        qkey: QKEY,
                        src_qp: PEER_QPN,
                    });
                }
                let pkt = Packet {
                    hdr: h,
                    payload: &payload,
                    icrc: 0,
                };
                self.uc.handle_packet(0, &pkt, &self.mem, None);
                self.uc_psn = psn.add(1);
                self.uc_completions();
            }
            Step::Raw { ud, ref bytes } => {
                if let Ok(pkt) = Packet::parse(bytes) {
                    let from = self.from(bytes.len());
                    if ud {
                        self.ud
                            .handle_packet_from(0, &pkt, Some(&from), &self.mem, None);
                        while let Some(wc) = self.ud.poll_recv_completion() {
                            self.recv_wcs += 1;
                            assert!(self.recv_wcs <= self.recvs_posted);
                            let (_, blen) = self.ud_recvs.pop_front().expect("posted");
                            assert!(wc.byte_len as usize <= blen);
                            assert!(pkt.hdr.deth.is_some_and(|d| d.qkey == QKEY));
                        }
                    } else {
                        self.uc.handle_packet(0, &pkt, &self.mem, None);
                        self.uc_completions();
                    }
                }
            }
        }
        self.check();
    }

    fn uc_completions(&mut self) {
        while let Some(wc) = self.uc.poll_recv_completion() {
            self.recv_wcs += 1;
            assert!(
                self.recv_wcs <= self.recvs_posted,
                "more receives than posted"
            );
            let blen = self.uc_recv_lens.pop_front().expect("a posted receive");
            if wc.status == WcStatus::Success && wc.opcode == softrdma::rc::WcOpcode::Recv {
                assert!(u64::from(wc.byte_len) <= blen, "{wc:?} into {blen} bytes");
            }
        }
    }

    /// Nothing outside the writable region and posted receives changed; nothing was sent.
    fn check(&mut self) {
        let (w0, _, wl) = self.regions[0];
        let writable = |i: usize, ranges: &[(usize, usize)]| {
            (i >= w0 && i < w0 + wl as usize) || ranges.iter().any(|&(a, b)| i >= a && i < b)
        };
        let host = self.host().to_vec();
        for (i, (&now, &was)) in host.iter().zip(self.shadow.iter()).enumerate() {
            if now != was {
                assert!(
                    writable(i, &self.recv_ranges),
                    "byte {i} changed outside the writable ranges"
                );
            }
        }
        self.shadow = host;
        let mut buf = [0u8; 512];
        for qp in [&mut self.ud, &mut self.uc] {
            assert!(
                qp.poll_transmit(0, &self.mem, &mut buf).is_none(),
                "an unreliable receiver sent a packet"
            );
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    steps: Vec<Step>,
}

fuzz_target!(|input: Input| {
    let mut w = World::new();
    for s in input.steps.iter().take(256) {
        w.step(s);
    }
    let (host, host_len) = (w.host, w.host_len);
    drop(w);
    // SAFETY: the table is gone; `host` came from `Box::into_raw` of `host_len` bytes.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(host, host_len)) });
});
