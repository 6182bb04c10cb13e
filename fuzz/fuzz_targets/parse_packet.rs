//! Any bytes given to the RoCEv2 parser: no panic; whatever parses re-emits to the same bytes
//! (the pad is emitted as zeros and the ICRC recomputed) and parses back to the same headers.
#![no_main]

use core::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use softrdma::wire::{ICRC_LEN, IcrcContext, Packet};

fuzz_target!(|data: &[u8]| {
    let ctx = IcrcContext::v4(
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        0xc000,
    );
    let _ = Packet::parse_verified(&ctx, data);
    let Ok(p) = Packet::parse(data) else { return };
    let mut out = vec![0u8; p.buffer_len()];
    let n = p.emit(&ctx, &mut out).expect("a parsed packet emits");
    assert_eq!(n, data.len());
    let hl = p.hdr.len();
    let body = hl + p.payload.len();
    assert_eq!(out[..body], data[..body], "headers and payload differ");
    let again = Packet::parse_verified(&ctx, &out[..n]).expect("an emitted packet verifies");
    assert_eq!(again.hdr, p.hdr);
    assert_eq!(again.payload, p.payload);
    assert_eq!(n - body - ICRC_LEN, usize::from(p.hdr.bth.pad_cnt));
});
