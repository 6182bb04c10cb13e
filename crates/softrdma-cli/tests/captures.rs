//! Every RoCEv2 packet of the real Linux rxe captures parses, its ICRC verifies, and emitting
//! the parsed form reproduces the UDP payload byte for byte.

mod common;

use std::collections::BTreeMap;

use softrdma::wire::{ICRC_LEN, Packet, icrc};

#[test]
fn every_rxe_packet_parses_verifies_and_round_trips() {
    let mut total = 0;
    let mut by_opcode: BTreeMap<&str, usize> = BTreeMap::new();
    for path in common::captures("rxe") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let ds = common::datagrams(&path);
        assert!(!ds.is_empty(), "{name}: no RoCEv2 packets");
        for d in &ds {
            let p = Packet::parse_verified(&d.ctx, &d.payload)
                .unwrap_or_else(|e| panic!("{name} frame {}: {e}", d.frame));
            // The ICRC from the context equals the ICRC over the real captured headers.
            let body = &d.payload[..d.payload.len() - ICRC_LEN];
            assert_eq!(
                icrc::compute_from_headers(&d.ip_header, &d.udp_header, body).unwrap(),
                p.icrc
            );
            let mut out = vec![0u8; p.buffer_len()];
            let n = p.emit(&d.ctx, &mut out).unwrap();
            assert_eq!(
                &out[..n],
                &d.payload[..],
                "{name} frame {}: emit differs",
                d.frame
            );
            *by_opcode.entry(p.hdr.bth.opcode.name()).or_default() += 1;
        }
        println!(
            "{name:<28} {:>6} packets: all parse, verify and round-trip",
            ds.len()
        );
        total += ds.len();
    }
    println!("total {total} packets; by opcode:");
    for (k, v) in &by_opcode {
        println!("  {k:<36} {v:>6}");
    }
    assert!(total > 7000, "expected the whole rxe corpus, got {total}");
}
