//! Packets made by softrdma's own builder: one of every opcode at each path MTU, with every
//! pad count, with and without immediate data and invalidate. They make the capture bundled
//! as the default input of `softrdma decode` and the corpus checked against Wireshark.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softrdma::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, HeaderRepr,
    IcrcContext, NakCode, OpKind, Packet, Position, Psn, ROCE_PORT, RethRepr, Syndrome,
    opcode::OPCODES,
};

use crate::capture::{CaptureError, Datagram, write_pcap};

/// The path MTUs of InfiniBand.
pub const MTUS: [usize; 5] = [256, 512, 1024, 2048, 4096];

/// One built packet and what it was meant to say.
#[derive(Debug, Clone)]
pub struct Built {
    /// The headers as built (with the pad count the builder set).
    pub hdr: HeaderRepr,
    /// Payload length.
    pub payload_len: usize,
    /// The datagram as it goes into a capture.
    pub datagram: Datagram,
}

/// A small deterministic generator (splitmix64) so every packet carries distinct values.
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Every opcode at every MTU in `mtus`, with payload lengths covering each pad count.
pub fn corpus(mtus: &[usize]) -> Result<Vec<Built>, softrdma::wire::Error> {
    let mut rng = Mix(0x50f7_4d3a);
    let mut out = Vec::new();
    let v4 = (Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2));
    let v6 = (
        Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2),
    );
    for &mtu in mtus {
        for info in OPCODES {
            let sizes: Vec<usize> = match (info.payload, info.kind, info.position) {
                (false, _, _) => vec![0],
                (true, OpKind::AtomicWrite, _) => vec![8],
                (true, _, Position::First | Position::Middle) => vec![mtu],
                (true, _, Position::Only) => vec![0, 1, 2, 3, mtu],
                (true, _, Position::Last) => vec![1, 2, 3, 4, mtu],
            };
            for len in sizes {
                let r = rng.next();
                let mut bth = BthRepr::new(
                    info.opcode,
                    (r & 0xff_ffff) as u32,
                    Psn::new((r >> 24) as u32),
                );
                bth.ack_req = r & (1 << 50) != 0 || info.position.ends();
                bth.se = r & (1 << 51) != 0 && info.kind == OpKind::Send;
                let mut h = HeaderRepr::new(bth);
                let hs = info.headers;
                use softrdma::wire::Headers as H;
                if hs.has(H::DETH) {
                    h.deth = Some(DethRepr {
                        qkey: rng.next() as u32,
                        src_qp: (rng.next() & 0xff_ffff) as u32,
                    });
                }
                if hs.has(H::FETH) {
                    h.feth = Some(FethRepr { sel: 1, plt: 1 });
                }
                if hs.has(H::RETH) {
                    let dma_len = if info.kind == OpKind::ReadRequest {
                        (rng.next() % 65536) as u32
                    } else {
                        len as u32
                    };
                    h.reth = Some(RethRepr {
                        va: rng.next(),
                        rkey: rng.next() as u32,
                        dma_len,
                    });
                }
                if hs.has(H::ATOMIC_ETH) {
                    let va = rng.next() & !7;
                    h.atomic_eth = Some(AtomicEthRepr {
                        va,
                        rkey: rng.next() as u32,
                        swap_add: rng.next(),
                        compare: rng.next(),
                    });
                }
                if hs.has(H::AETH) {
                    let syndromes = [
                        Syndrome::Ack { credits: 0x1f },
                        Syndrome::Ack { credits: 3 },
                        Syndrome::RnrNak { timer: 14 },
                        Syndrome::Nak(NakCode::PsnSequenceError),
                        Syndrome::Nak(NakCode::RemoteAccessError),
                    ];
                    let syndrome = if info.kind == OpKind::Ack {
                        syndromes[(r % 5) as usize]
                    } else {
                        syndromes[0]
                    };
                    h.aeth = Some(AethRepr {
                        syndrome,
                        msn: (rng.next() & 0xff_ffff) as u32,
                    });
                }
                if hs.has(H::ATOMIC_ACK_ETH) {
                    h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: rng.next() });
                }
                if hs.has(H::IMMDT) {
                    h.immdt = Some(rng.next() as u32);
                }
                if hs.has(H::IETH) {
                    h.ieth = Some(rng.next() as u32);
                }
                let payload: Vec<u8> = (0..len)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(r as u8))
                    .collect();
                let src_port = 0xc000 | (r as u16 & 0x3fff);
                let use_v6 = out.len() % 4 == 3;
                let (src, dst, ctx) = if use_v6 {
                    (
                        IpAddr::V6(v6.0),
                        IpAddr::V6(v6.1),
                        IcrcContext::v6(v6.0, v6.1, src_port),
                    )
                } else {
                    (
                        IpAddr::V4(v4.0),
                        IpAddr::V4(v4.1),
                        IcrcContext::v4(v4.0, v4.1, src_port),
                    )
                };
                let p = Packet {
                    hdr: h,
                    payload: &payload,
                    icrc: 0,
                };
                let mut buf = vec![0u8; p.buffer_len()];
                p.emit(&ctx, &mut buf)?;
                h.bth.pad_cnt = softrdma::wire::packet::pad_for(len);
                out.push(Built {
                    hdr: h,
                    payload_len: len,
                    datagram: Datagram {
                        src,
                        dst,
                        src_port,
                        dst_port: ROCE_PORT,
                        ip_id: 0,
                        payload: buf,
                    },
                });
            }
        }
    }
    Ok(out)
}

/// The capture bundled as the default input of `softrdma decode`: every opcode at MTU 1024.
pub fn sample_pcap() -> Result<Vec<u8>, CaptureError> {
    let built =
        corpus(&[1024]).map_err(|e| CaptureError::Io(std::io::Error::other(e.to_string())))?;
    let datagrams: Vec<Datagram> = built.into_iter().map(|b| b.datagram).collect();
    write_pcap(&datagrams)
}

/// The bundled sample, as compiled in.
pub const BUNDLED_SAMPLE: &[u8] = include_bytes!("../data/sample.pcap");
