//! Flipping any single bit of a real packet's UDP payload is detected: as a bad ICRC or a
//! parse error. The one exception is what the specification itself exempts: BTH byte 4 is
//! replaced by ones in the ICRC because the network may set FECN and BECN in flight; a flip
//! of those two bits is reported as a congestion mark, and a flip of the six reserved bits
//! of that byte is a parse error.

mod common;

use std::collections::BTreeMap;

use softrdma::wire::{Error, Packet, opcode::OPCODES};
use softrdma_cli::sample;

/// Outcome of one flipped bit.
fn detected(
    ctx: &softrdma::wire::IcrcContext,
    bytes: &[u8],
    original: &Packet<'_>,
    byte: usize,
    bit: u8,
) -> bool {
    match Packet::parse_verified(ctx, bytes) {
        Err(_) => true,
        Ok(p) if byte == 4 && (bit == 7 || bit == 6) => {
            // Spec-exempt congestion bits: the flip must show up in the parsed BTH.
            p.hdr.bth.fecn != original.hdr.bth.fecn || p.hdr.bth.becn != original.hdr.bth.becn
        }
        Ok(_) => false,
    }
}

fn flip_all(name: &str, ctx: &softrdma::wire::IcrcContext, payload: &[u8]) -> usize {
    let original = Packet::parse_verified(ctx, payload).unwrap();
    let mut buf = payload.to_vec();
    let mut flips = 0;
    for byte in 0..buf.len() {
        for bit in 0..8u8 {
            buf[byte] ^= 1 << bit;
            assert!(
                detected(ctx, &buf, &original, byte, bit),
                "{name}: flip of byte {byte} bit {bit} went unnoticed"
            );
            buf[byte] ^= 1 << bit;
            flips += 1;
        }
    }
    assert_eq!(buf, payload);
    flips
}

#[test]
fn every_bit_of_sampled_rxe_packets_is_protected() {
    // Up to two packets of each opcode from each capture, the smallest first.
    let mut sampled: BTreeMap<(u8, String), usize> = BTreeMap::new();
    let mut flips = 0;
    for path in common::captures("rxe") {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut ds = common::datagrams(&path);
        ds.sort_by_key(|d| d.payload.len());
        for d in &ds {
            let op = Packet::parse(&d.payload).unwrap().hdr.bth.opcode;
            let n = sampled.entry((op.0, file.clone())).or_default();
            if *n >= 2 {
                continue;
            }
            *n += 1;
            flips += flip_all(&format!("{file} frame {}", d.frame), &d.ctx, &d.payload);
        }
    }
    let opcodes: std::collections::BTreeSet<u8> = sampled.keys().map(|k| k.0).collect();
    println!(
        "{} packets, {} opcodes, {flips} single-bit flips, all detected",
        sampled.len(),
        opcodes.len()
    );
    assert!(
        opcodes.len() >= 15,
        "expected most RC opcodes in the rxe captures, got {opcodes:?}"
    );
}

#[test]
fn every_bit_of_every_built_opcode_is_protected() {
    // Opcodes the captures lack (SEND with invalidate, FLUSH, ATOMIC WRITE, UC, ...) come
    // from the builder, at the smallest MTU.
    let built = sample::corpus(&[256]).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut flips = 0;
    for b in &built {
        let ctx = match (b.datagram.src, b.datagram.dst) {
            (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
                softrdma::wire::IcrcContext::v4(s, d, b.datagram.src_port)
            }
            (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => {
                softrdma::wire::IcrcContext::v6(s, d, b.datagram.src_port)
            }
            _ => unreachable!(),
        };
        if seen.insert((b.hdr.bth.opcode.0, b.payload_len.min(4))) {
            flips += flip_all(b.hdr.bth.opcode.name(), &ctx, &b.datagram.payload);
        }
    }
    let ops: std::collections::BTreeSet<u8> = seen.iter().map(|k| k.0).collect();
    assert_eq!(ops.len(), OPCODES.len());
    println!(
        "{} built packets, {flips} single-bit flips, all detected",
        seen.len()
    );
}

#[test]
fn reserved_bits_of_byte_4_are_parse_errors() {
    let built = sample::corpus(&[256]).unwrap();
    let mut p = built[0].datagram.payload.clone();
    p[4] ^= 0x01;
    assert_eq!(Packet::parse(&p).unwrap_err(), Error::ReservedBits);
}
