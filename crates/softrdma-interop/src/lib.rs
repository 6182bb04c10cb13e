//! The interop protocol shared by softrdma's `interop-peer` and the guest-side C program
//! `c/rdma_peer.c` (which runs on Linux rdma_rxe). Keep the two in step.
//!
//! * One TCP connection. Each side sends `SRP1 <qpn> <psn> <gid: 32 hex> <addr> <rkey>\n`
//!   (decimal numbers; address and R_Key of its one region), connects its QP to RTS, sends
//!   `R\n` and waits for the other's `R\n`.
//! * Both sides register one region with the same [layout](area) and fill it with the same
//!   [patterns](pattern).
//! * The **active** side, for every size in [`SIZES`]: RDMA READ of the peer's R slice into its
//!   own D slice, RDMA WRITE of its S slice into the peer's W slice, SEND with immediate
//!   `IMM_BASE + round` of its X slice into a receive on the peer's V slice; then Fetch&Add
//!   and Compare&Swap on the peer's atomic words (see [`ATOMICS`]); then a zero-length SEND
//!   with immediate [`FIN_IMM`]. It checks what it read and the atomics' original values, and
//!   finally reads the passive side's verdict line.
//! * The **passive** side posts one receive per size plus one for the FIN, waits for them,
//!   checks the completions, the W and V slices and the atomic words, then writes `OK\n` or
//!   `FAIL <why>\n` and keeps its QP until the active side closes the connection.

#![deny(unsafe_op_in_unsafe_fn)]

use std::io::{self, BufRead, Write};

/// Message sizes exercised, in order: below, at and above the 1024 path MTU, a whole 4096
/// packet, a jumbo-sized message and 64 KiB.
pub const SIZES: [u32; 6] = [1, 1024, 1025, 4096, 9000, 65536];
/// Pattern seed of area R (read by the active side).
pub const SEED_R: u32 = 1;
/// Pattern seed of area S (written by the active side into the peer's W).
pub const SEED_S: u32 = 2;
/// Pattern seed of area X (sent by the active side into the peer's V).
pub const SEED_X: u32 = 3;
/// Immediate data of the SEND of round `r` is `IMM_BASE + r`.
pub const IMM_BASE: u32 = 0x5eed_0000;
/// Immediate data of the final zero-length SEND.
pub const FIN_IMM: u32 = 0xf1f1_f1f1;
/// Initial value of atomic word 0.
pub const A0_INIT: u64 = 0x1000_0000_0000_0001;
/// Initial value of atomic word 1.
pub const A1_INIT: u64 = 0x00c0_ffee;
/// The first Fetch&Add's addend.
pub const ADD0: u64 = 0x42;
/// The swap value of the Compare&Swap that succeeds.
pub const SWAP1: u64 = 0x00fa_cade;

/// One atomic operation of the active side.
#[derive(Clone, Copy, Debug)]
pub struct AtomicStep {
    /// Compare&Swap (else Fetch&Add).
    pub cas: bool,
    /// Which atomic word (0 or 1).
    pub word: u64,
    /// Compare value (CAS) or addend (FADD).
    pub x: u64,
    /// Swap value (CAS).
    pub y: u64,
    /// The original value the responder must return.
    pub expect: u64,
}

/// Fetch&Add, a Compare&Swap that swaps, one that does not, and another Fetch&Add.
pub const ATOMICS: [AtomicStep; 4] = [
    AtomicStep {
        cas: false,
        word: 0,
        x: ADD0,
        y: 0,
        expect: A0_INIT,
    },
    AtomicStep {
        cas: true,
        word: 1,
        x: A1_INIT,
        y: SWAP1,
        expect: A1_INIT,
    },
    AtomicStep {
        cas: true,
        word: 1,
        x: A1_INIT,
        y: 0xbad,
        expect: SWAP1,
    },
    AtomicStep {
        cas: false,
        word: 0,
        x: 1,
        y: 0,
        expect: A0_INIT + ADD0,
    },
];
/// The atomic words after [`ATOMICS`].
pub const ATOMIC_FINAL: [u64; 2] = [A0_INIT + ADD0 + 1, SWAP1];

/// Areas of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// Read by the peer.
    R = 0,
    /// Written by the peer.
    W = 1,
    /// Source of WRITEs.
    S = 2,
    /// Destination of READs.
    D = 3,
    /// Receive buffers.
    V = 4,
    /// Source of SENDs.
    X = 5,
    /// Two atomic words; at +64 four atomic results.
    A = 6,
}

/// Length of each data area (the sum of [`SIZES`], rounded up to 64).
pub const fn area_len() -> u64 {
    let mut t = 0u64;
    let mut i = 0;
    while i < SIZES.len() {
        t += SIZES[i] as u64;
        i += 1;
    }
    (t + 63) & !63
}

/// Offset of an area in the region.
pub const fn area(a: Area) -> u64 {
    a as u64 * area_len()
}

/// Offset of the atomic results.
pub const OFF_AR: u64 = area(Area::A) + 64;
/// Length of the region.
pub const REGION_LEN: u64 = area(Area::A) + 128;

/// Offset of round `r`'s slice within an area.
pub fn slice_off(r: usize) -> u64 {
    SIZES[..r].iter().map(|&s| s as u64).sum()
}

/// The byte at index `i` of the pattern with `seed`.
pub const fn pattern(seed: u32, i: u32) -> u8 {
    (i.wrapping_add(seed.wrapping_mul(7919))
        .wrapping_mul(2_654_435_761)
        >> 24) as u8
}

/// A fresh region's contents: areas R, S, X patterned, atomic words initialised, the rest 0.
pub fn initial_region() -> Vec<u8> {
    let mut b = vec![0u8; REGION_LEN as usize];
    for i in 0..area_len() as u32 {
        let i64_ = i as u64;
        b[(area(Area::R) + i64_) as usize] = pattern(SEED_R, i);
        b[(area(Area::S) + i64_) as usize] = pattern(SEED_S, i);
        b[(area(Area::X) + i64_) as usize] = pattern(SEED_X, i);
    }
    let a = area(Area::A) as usize;
    b[a..a + 8].copy_from_slice(&A0_INIT.to_ne_bytes());
    b[a + 8..a + 16].copy_from_slice(&A1_INIT.to_ne_bytes());
    b
}

/// The first index at which `got` differs from the pattern `seed` starting at `start`.
pub fn first_mismatch(got: &[u8], seed: u32, start: u64) -> Option<usize> {
    got.iter()
        .enumerate()
        .find(|&(i, &b)| b != pattern(seed, (start + i as u64) as u32))
        .map(|(i, _)| i)
}

/// What one side tells the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// QP number.
    pub qpn: u32,
    /// Initial PSN of its requests.
    pub psn: u32,
    /// GID.
    pub gid: [u8; 16],
    /// Address of its region (as the peer must name it on the wire).
    pub addr: u64,
    /// R_Key of its region.
    pub rkey: u32,
}

impl Hello {
    /// The line, newline included.
    pub fn to_line(&self) -> String {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "SRP1 {} {} {} {} {}\n",
            self.qpn, self.psn, gid, self.addr, self.rkey
        )
    }

    /// Parse a line (without or with its newline).
    pub fn parse(line: &str) -> io::Result<Hello> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad hello {line:?}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 6 || f[0] != "SRP1" || f[3].len() != 32 {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Hello {
            qpn: f[1].parse().map_err(|_| bad())?,
            psn: f[2].parse().map_err(|_| bad())?,
            gid,
            addr: f[4].parse().map_err(|_| bad())?,
            rkey: f[5].parse().map_err(|_| bad())?,
        })
    }
}

/// Read one line (without its newline) from a buffered stream.
pub fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut s = String::new();
    if r.read_line(&mut s)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(s.trim_end().to_owned())
}

/// Write a whole line.
pub fn write_line(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(s.as_bytes())?;
    if !s.ends_with('\n') {
        w.write_all(b"\n")?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip() {
        let h = Hello {
            qpn: 0x11,
            psn: 0xabcdef,
            gid: std::net::Ipv4Addr::new(10, 77, 0, 1)
                .to_ipv6_mapped()
                .octets(),
            addr: 0x7f00_1234_5678,
            rkey: 0xdead_beef,
        };
        let l = h.to_line();
        assert!(l.starts_with("SRP1 17 11259375 00000000000000000000ffff0a4d0001 "));
        assert_eq!(Hello::parse(&l).unwrap(), h);
        assert!(Hello::parse("SRP1 1 2").is_err());
    }

    #[test]
    fn layout_and_pattern_match_the_c_peer() {
        // Values the C program computes (uint32 arithmetic, `>> 24`).
        assert_eq!(
            pattern(1, 0),
            ((7919u64 * 2_654_435_761) as u32 >> 24) as u8
        );
        assert_eq!(area_len(), 80704);
        assert_eq!(slice_off(3), 1 + 1024 + 1025);
        assert_eq!(REGION_LEN, 6 * 80704 + 128);
        let r = initial_region();
        assert_eq!(first_mismatch(&r[..100], SEED_R, 0), None);
        assert_eq!(
            first_mismatch(&r[area(Area::W) as usize..][..100], SEED_S, 0),
            Some(0)
        );
    }
}
