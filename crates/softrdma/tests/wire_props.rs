//! Property tests of the wire layer, bounded for CI: no input panics the parser; packets the
//! builder makes parse back to what was built and re-emit to the same bytes; any one changed
//! byte is rejected unless it is a congestion mark the ICRC exempts.

use core::net::Ipv4Addr;

use proptest::prelude::*;
use softrdma::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, HeaderRepr,
    IcrcContext, OpKind, Packet, Position, Psn, RethRepr, Syndrome, opcode::OPCODES,
};

fn ctx() -> IcrcContext {
    IcrcContext::v4(
        Ipv4Addr::new(127, 0, 0, 1),
        Ipv4Addr::new(127, 0, 0, 2),
        0xc0de,
    )
}

/// A packet the builder accepts: any opcode, any field values, a payload valid for it.
fn packet() -> impl Strategy<Value = (HeaderRepr, Vec<u8>)> {
    (
        0..OPCODES.len(),
        any::<[u64; 8]>(),
        prop::sample::select(vec![256usize, 512, 1024, 2048, 4096]),
        0usize..600,
    )
        .prop_map(|(i, r, mtu, len)| {
            let info = &OPCODES[i];
            let mut bth = BthRepr::new(
                info.opcode,
                (r[0] & 0xff_ffff) as u32,
                Psn::new(r[1] as u32),
            );
            bth.se = r[0] & (1 << 40) != 0;
            bth.ack_req = r[0] & (1 << 41) != 0;
            bth.mig_req = r[0] & (1 << 42) != 0;
            bth.fecn = r[0] & (1 << 43) != 0;
            bth.becn = r[0] & (1 << 44) != 0;
            bth.pkey = (r[1] >> 32) as u16;
            let mut h = HeaderRepr::new(bth);
            use softrdma::wire::Headers as H;
            let hs = info.headers;
            if hs.has(H::DETH) {
                h.deth = Some(DethRepr {
                    qkey: r[2] as u32,
                    src_qp: (r[2] >> 40) as u32 & 0xff_ffff,
                });
            }
            if hs.has(H::FETH) {
                h.feth = Some(FethRepr {
                    sel: (r[3] & 3) as u8,
                    plt: ((r[3] >> 2) & 0xf) as u8,
                });
            }
            if hs.has(H::RETH) {
                h.reth = Some(RethRepr {
                    va: r[4],
                    rkey: r[5] as u32,
                    dma_len: (r[5] >> 32) as u32,
                });
            }
            if hs.has(H::ATOMIC_ETH) {
                h.atomic_eth = Some(AtomicEthRepr {
                    va: r[4],
                    rkey: r[5] as u32,
                    swap_add: r[6],
                    compare: r[7],
                });
            }
            if hs.has(H::AETH) {
                let syn = Syndrome::from_byte((r[3] >> 8) as u8 & 0x7f);
                let syn = if matches!(syn, Syndrome::Reserved(_)) {
                    Syndrome::Ack { credits: 0 }
                } else {
                    syn
                };
                h.aeth = Some(AethRepr {
                    syndrome: syn,
                    msn: (r[6] as u32) & 0xff_ffff,
                });
            }
            if hs.has(H::ATOMIC_ACK_ETH) {
                h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: r[7] });
            }
            if hs.has(H::IMMDT) {
                h.immdt = Some((r[6] >> 32) as u32);
            }
            if hs.has(H::IETH) {
                h.ieth = Some(r[7] as u32);
            }
            let len = match (info.payload, info.kind, info.position) {
                (false, _, _) => 0,
                (true, OpKind::AtomicWrite, _) => 8,
                (true, _, Position::First | Position::Middle) => mtu,
                (true, _, Position::Last) => len.max(1),
                (true, _, Position::Only) => len,
            };
            let payload = (0..len).map(|i| (i as u64 ^ r[0]) as u8).collect();
            (h, payload)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Packet::parse(&data);
        let _ = Packet::parse_verified(&ctx(), &data);
        let _ = HeaderRepr::parse(&data);
    }

    #[test]
    fn built_packets_round_trip((h, payload) in packet()) {
        let p = Packet { hdr: h, payload: &payload, icrc: 0 };
        let mut buf = vec![0u8; p.buffer_len()];
        let n = p.emit(&ctx(), &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        let q = Packet::parse_verified(&ctx(), &buf).unwrap();
        let mut want = h;
        want.bth.pad_cnt = softrdma::wire::packet::pad_for(payload.len());
        prop_assert_eq!(q.hdr, want);
        prop_assert_eq!(q.payload, &payload[..]);
        let mut again = vec![0u8; n];
        prop_assert_eq!(q.emit(&ctx(), &mut again).unwrap(), n);
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn a_changed_byte_is_rejected((h, payload) in packet(), at in any::<prop::sample::Index>(), x in 1u8..=255) {
        let p = Packet { hdr: h, payload: &payload, icrc: 0 };
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&ctx(), &mut buf).unwrap();
        let i = at.index(buf.len());
        buf[i] ^= x;
        match Packet::parse_verified(&ctx(), &buf) {
            Err(_) => {}
            Ok(q) => {
                // Only FECN/BECN may change undetected, and the change must be visible.
                prop_assert_eq!(i, 4);
                prop_assert_eq!(x & 0x3f, 0);
                prop_assert!(q.hdr.bth.fecn != h.bth.fecn || q.hdr.bth.becn != h.bth.becn);
            }
        }
    }
}

/// Any IPv4 or IPv6 context: addresses, ports, identification, Don't Fragment.
fn any_context() -> impl Strategy<Value = softrdma::wire::IcrcContext> {
    use softrdma::wire::IpHeader;
    (
        any::<bool>(),
        any::<[u8; 32]>(),
        any::<(u16, u16, u16, bool)>(),
    )
        .prop_map(|(v6, a, (sport, dport, id, df))| {
            let ip = if v6 {
                IpHeader::V6 {
                    src: core::net::Ipv6Addr::from(<[u8; 16]>::try_from(&a[..16]).unwrap()),
                    dst: core::net::Ipv6Addr::from(<[u8; 16]>::try_from(&a[16..]).unwrap()),
                }
            } else {
                IpHeader::V4 {
                    src: Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                    dst: Ipv4Addr::new(a[4], a[5], a[6], a[7]),
                    id,
                    dont_fragment: df,
                }
            };
            IcrcContext {
                ip,
                src_port: sport,
                dst_port: dport,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The precomputed headers give the ICRC computed from scratch: any context, any body
    /// length (up to past the largest path MTU), another identification set afterwards, and
    /// a body fed in two pieces.
    #[test]
    fn icrc_prefix_equals_the_full_computation(
        ctx in any_context(),
        body in prop::collection::vec(any::<u8>(), 12..4200),
        id in any::<u16>(),
        cut in 12usize..4200,
    ) {
        use softrdma::wire::{Icrc, IcrcPrefix, IpHeader};
        let p = IcrcPrefix::new(ctx);
        prop_assert_eq!(p.compute(&body).unwrap(), ctx.compute(&body).unwrap());
        let mut other = ctx;
        if let IpHeader::V4 { id: i, .. } = &mut other.ip {
            *i = id;
        }
        prop_assert_eq!(p.with_id(id).compute(&body).unwrap(), other.compute(&body).unwrap());
        let cut = cut.min(body.len());
        let split = p.compute_with(&body[..cut], body.len(), |h| h.update(&body[cut..]));
        prop_assert_eq!(split.unwrap(), ctx.compute(&body).unwrap());
    }
}
