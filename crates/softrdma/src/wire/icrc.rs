//! The invariant CRC (IBTA A17.3.3, RoCEv2): CRC-32 over the packet with the fields that may
//! change in flight replaced by ones, stored little-endian in the last four bytes.
//!
//! Covered: 8 bytes of ones standing for the LRH; the IP header with IPv4 TOS, TTL and header
//! checksum (IPv6 traffic class, flow label and hop limit) set to ones; the UDP header with
//! its checksum set to ones; the BTH with byte 4 (FECN, BECN, reserved) set to ones; then
//! everything up to the ICRC. The IPv4 identification, flags and total length are covered,
//! which is why a sender must know the ID its datagram will carry (`IP_PMTUDISC_DO` gives 0).

use core::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use super::{Error, ICRC_LEN, Result};

/// The IP header of a RoCEv2 packet, as far as the ICRC covers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpHeader {
    /// IPv4 without options.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification (0 from an unconnected socket with `IP_PMTUDISC_DO`; k for the k-th
        /// segment of a software-segmented GSO datagram).
        id: u16,
        /// Don't Fragment flag.
        dont_fragment: bool,
    },
    /// IPv6 without extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// The IP and UDP context a RoCEv2 UDP payload travels in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrcContext {
    /// IP header fields.
    pub ip: IpHeader,
    /// UDP source port (entropy).
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

impl IcrcContext {
    /// An IPv4 context as softrdma sends: ID 0, DF set, destination port 4791.
    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16) -> IcrcContext {
        IcrcContext {
            ip: IpHeader::V4 {
                src,
                dst,
                id: 0,
                dont_fragment: true,
            },
            src_port,
            dst_port: super::ROCE_PORT,
        }
    }

    /// An IPv6 context with destination port 4791.
    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, src_port: u16) -> IcrcContext {
        IcrcContext {
            ip: IpHeader::V6 { src, dst },
            src_port,
            dst_port: super::ROCE_PORT,
        }
    }

    /// The ICRC of a UDP payload whose first `body.len()` bytes are `body` and whose last four
    /// bytes are the ICRC.
    pub fn compute(&self, body: &[u8]) -> Result<u32> {
        self.compute_with(body, body.len(), |_| {})
    }

    /// [`IcrcContext::compute`] for a body of `body_len` bytes that is not in one piece: it
    /// starts with `head` (at least the BTH) and `rest` feeds the remaining
    /// `body_len - head.len()` bytes, in order, to the hasher.
    pub fn compute_with(
        &self,
        head: &[u8],
        body_len: usize,
        rest: impl FnOnce(&mut crc32fast::Hasher),
    ) -> Result<u32> {
        let (ip_len, udp_len) = self.lengths(body_len)?;
        let (h, n) = self.covered(ip_len, udp_len);
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&h[..n]);
        finish(hasher, head, rest)
    }

    /// The IP length field (IPv4 total length, IPv6 payload length) and the UDP length of a
    /// packet whose body (BTH up to the ICRC) is `body_len` bytes.
    fn lengths(&self, body_len: usize) -> Result<(u16, u16)> {
        let udp_len = 8 + body_len + ICRC_LEN;
        let udp = u16::try_from(udp_len).map_err(|_| Error::FieldRange("UDP length"))?;
        let ip = match self.ip {
            IpHeader::V4 { .. } => {
                u16::try_from(20 + udp_len).map_err(|_| Error::FieldRange("IP length"))?
            }
            IpHeader::V6 { .. } => udp,
        };
        Ok((ip, udp))
    }

    /// The bytes the ICRC covers ahead of the BTH, masked: ones for the LRH, this context's
    /// IP header with `ip_len` in its length field, its UDP header with `udp_len`.
    fn covered(&self, ip_len: u16, udp_len: u16) -> ([u8; PSEUDO_V6], usize) {
        let mut h = [0xffu8; PSEUDO_V6];
        let ip_end = match self.ip {
            IpHeader::V4 {
                src,
                dst,
                id,
                dont_fragment,
            } => {
                let ip = &mut h[8..28];
                ip.fill(0);
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
                ip[4..6].copy_from_slice(&id.to_be_bytes());
                if dont_fragment {
                    ip[6] = 0x40;
                }
                ip[9] = 17;
                ip[12..16].copy_from_slice(&src.octets());
                ip[16..20].copy_from_slice(&dst.octets());
                mask_ipv4_fields(ip);
                28
            }
            IpHeader::V6 { src, dst } => {
                let ip = &mut h[8..48];
                ip.fill(0);
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&ip_len.to_be_bytes());
                ip[6] = 17;
                ip[8..24].copy_from_slice(&src.octets());
                ip[24..40].copy_from_slice(&dst.octets());
                mask_ipv6_fields(ip);
                48
            }
        };
        let u = &mut h[ip_end..ip_end + 8];
        u[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        u[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        u[4..6].copy_from_slice(&udp_len.to_be_bytes());
        mask_udp_fields(u);
        (h, ip_end + 8)
    }
}

/// Computes the ICRCs of one IP/UDP context: [`IcrcContext`] from scratch, [`IcrcPrefix`]
/// from its covered headers computed ahead.
pub trait Icrc {
    /// The ICRC of a body of `body_len` bytes that starts with `head` (at least the BTH);
    /// `rest` feeds the remaining `body_len - head.len()` bytes, in order, to the hasher.
    fn compute_with(
        &self,
        head: &[u8],
        body_len: usize,
        rest: impl FnOnce(&mut crc32fast::Hasher),
    ) -> Result<u32>;

    /// The ICRC of a UDP payload whose first `body.len()` bytes are `body` and whose last
    /// four bytes are the ICRC.
    fn compute(&self, body: &[u8]) -> Result<u32> {
        self.compute_with(body, body.len(), |_| {})
    }
}

impl Icrc for IcrcContext {
    fn compute_with(
        &self,
        head: &[u8],
        body_len: usize,
        rest: impl FnOnce(&mut crc32fast::Hasher),
    ) -> Result<u32> {
        IcrcContext::compute_with(self, head, body_len, rest)
    }
}

/// The covered headers ahead of the BTH: 8 bytes of ones (the LRH), the masked IPv6 header
/// and the masked UDP header (IPv4: 8 + 20 + 8).
const PSEUDO_V6: usize = 8 + 40 + 8;

/// How the fields of the covered headers that vary from packet to packet (IPv4 total length
/// and identification, IPv6 payload length, UDP length) change the CRC. CRC-32 is affine, so
/// for messages of one length `crc(x ^ e) = crc(x) ^ crc(e) ^ crc(0)`: each byte of those
/// fields adds a term of its own, whatever the rest of the headers, and the term of each
/// byte value is a table lookup.
struct LenTables {
    /// IPv4: total length (high, low byte), identification (high, low), UDP length (high,
    /// low).
    v4: [[u32; 256]; 6],
    /// IPv6: the payload length and the UDP length are the same number; its high and low
    /// byte, each standing at both places.
    v6: [[u32; 256]; 2],
}

impl LenTables {
    fn get() -> &'static LenTables {
        static TABLES: OnceLock<LenTables> = OnceLock::new();
        TABLES.get_or_init(|| {
            // The term of a field value: the covered headers' CRC with it, against with zero
            // (any addresses and ports: the term does not depend on them).
            let hash = |ctx: IcrcContext, ip_len: u16, udp_len: u16| {
                let (h, n) = ctx.covered(ip_len, udp_len);
                crc32fast::hash(&h[..n])
            };
            let (v4, v6) = (
                IcrcContext::v4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED, 0),
                IcrcContext::v6(Ipv6Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED, 0),
            );
            let (z4, z6) = (hash(v4, 0, 0), hash(v6, 0, 0));
            let with_id = |id: u16| IcrcContext {
                ip: IpHeader::V4 {
                    src: Ipv4Addr::UNSPECIFIED,
                    dst: Ipv4Addr::UNSPECIFIED,
                    id,
                    dont_fragment: false,
                },
                ..v4
            };
            let mut t = LenTables {
                v4: [[0; 256]; 6],
                v6: [[0; 256]; 2],
            };
            for b in 0..=255u8 {
                let (hi, lo, i) = (u16::from(b) << 8, u16::from(b), usize::from(b));
                t.v4[0][i] = hash(v4, hi, 0) ^ z4;
                t.v4[1][i] = hash(v4, lo, 0) ^ z4;
                t.v4[2][i] = hash(with_id(hi), 0, 0) ^ z4;
                t.v4[3][i] = hash(with_id(lo), 0, 0) ^ z4;
                t.v4[4][i] = hash(v4, 0, hi) ^ z4;
                t.v4[5][i] = hash(v4, 0, lo) ^ z4;
                t.v6[0][i] = hash(v6, hi, hi) ^ z6;
                t.v6[1][i] = hash(v6, lo, lo) ^ z6;
            }
            t
        })
    }
}

/// An [`IcrcContext`] with the CRC of its covered IP and UDP headers computed once (per
/// connection and per peer), with the fields that vary from packet to packet left zero;
/// their share is added per packet from tables. A packet's ICRC then runs the CRC over its
/// BTH and body only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrcPrefix {
    ctx: IcrcContext,
    /// CRC-32 of the covered headers with lengths (and the IPv4 identification) zero.
    base: u32,
}

impl IcrcPrefix {
    /// Compute the fixed part of `ctx`'s covered headers.
    pub fn new(ctx: IcrcContext) -> IcrcPrefix {
        let (h, n) = IcrcPrefix { ctx, base: 0 }.with_id(0).ctx.covered(0, 0);
        IcrcPrefix {
            ctx,
            base: crc32fast::hash(&h[..n]),
        }
    }

    /// The context.
    pub fn context(&self) -> &IcrcContext {
        &self.ctx
    }

    /// The same context with another IPv4 identification (the k-th segment of a GSO
    /// datagram carries k); no change for IPv6.
    pub fn with_id(mut self, id: u16) -> IcrcPrefix {
        if let IpHeader::V4 { id: i, .. } = &mut self.ctx.ip {
            *i = id;
        }
        self
    }

    /// CRC-32 state after the covered headers of a packet with a body of `body_len` bytes.
    fn state(&self, body_len: usize) -> Result<u32> {
        let (ip_len, udp_len) = self.ctx.lengths(body_len)?;
        let t = LenTables::get();
        let [ph, pl] = ip_len.to_be_bytes();
        let [uh, ul] = udp_len.to_be_bytes();
        let at = |table: &[u32; 256], b: u8| table[usize::from(b)];
        Ok(match self.ctx.ip {
            IpHeader::V4 { id, .. } => {
                let [ih, il] = id.to_be_bytes();
                self.base
                    ^ at(&t.v4[0], ph)
                    ^ at(&t.v4[1], pl)
                    ^ at(&t.v4[2], ih)
                    ^ at(&t.v4[3], il)
                    ^ at(&t.v4[4], uh)
                    ^ at(&t.v4[5], ul)
            }
            IpHeader::V6 { .. } => self.base ^ at(&t.v6[0], uh) ^ at(&t.v6[1], ul),
        })
    }
}

impl Icrc for IcrcPrefix {
    fn compute_with(
        &self,
        head: &[u8],
        body_len: usize,
        rest: impl FnOnce(&mut crc32fast::Hasher),
    ) -> Result<u32> {
        let state = self.state(body_len)?;
        finish(crc32fast::Hasher::new_with_initial(state), head, rest)
    }
}

/// The ICRC of a captured packet from its real IP header (v4 with options, or v6), its UDP
/// header and the UDP payload without the trailing ICRC.
pub fn compute_from_headers(ip: &[u8], udp: &[u8], body: &[u8]) -> Result<u32> {
    if udp.len() < 8 {
        return Err(Error::Truncated {
            what: "UDP header",
            need: 8,
            have: udp.len(),
        });
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let (buf, len) = mask_ipv4(ip)?;
            h.update(&buf[..len]);
        }
        Some(6) => h.update(&mask_ipv6(ip)?),
        _ => return Err(Error::BadIpHeader("not IPv4 or IPv6")),
    }
    let mut u = [0u8; 8];
    u.copy_from_slice(&udp[..8]);
    mask_udp_fields(&mut u);
    h.update(&u);
    finish(h, body, |_| {})
}

/// How the ICRC of an IPv4 packet (without options) changes with its identification field.
///
/// The ICRC covers the IPv4 ID, and CRC-32 is affine: for messages of one length,
/// `icrc(id = x) = icrc(id = 0) ^ L(x)`, where `L` is linear in the 16 bits of `x`.
/// [`IdDelta::new`] computes `L` on the 16 unit vectors for one packet length (a CRC over the
/// zeros after the field plus 16 tiny ones, merged with `crc32fast`'s combine); then
/// [`IdDelta::delta`] is at most 16 XORs. The sender uses it to give the k-th segment of a
/// GSO datagram the ICRC for ID k, which is what the kernel's segmentation will send;
/// [`IdDelta::solve`] finds the ID of a packet from a sender whose IDs are unknown, leaving
/// 16 of the 32 check bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdDelta {
    body_len: usize,
    basis: [u32; 16],
}

impl IdDelta {
    /// The basis for IPv4 packets whose UDP payload without ICRC is `body_len` bytes.
    pub fn new(body_len: usize) -> IdDelta {
        // Covered bytes after the ID field: the rest of the IPv4 header (14), UDP (8), body.
        let m = 14 + 8 + body_len;
        const ZEROS: [u8; 1024] = [0; 1024];
        let mut zeros = crc32fast::Hasher::new();
        let mut left = m;
        while left > 0 {
            let n = left.min(ZEROS.len());
            zeros.update(&ZEROS[..n]);
            left -= n;
        }
        let mut zero_field = crc32fast::Hasher::new();
        zero_field.update(&[0, 0]);
        zero_field.combine(&zeros);
        let z = zero_field.finalize();
        let mut basis = [0u32; 16];
        for (i, b) in basis.iter_mut().enumerate() {
            let id = 1u16 << i;
            let mut h = crc32fast::Hasher::new();
            h.update(&id.to_be_bytes());
            h.combine(&zeros);
            *b = h.finalize() ^ z;
        }
        IdDelta { body_len, basis }
    }

    /// The body length this basis is for.
    pub fn body_len(&self) -> usize {
        self.body_len
    }

    /// `icrc(id) ^ icrc(0)` for a packet of this length.
    pub fn delta(&self, id: u16) -> u32 {
        let mut d = 0;
        let mut v = id;
        let mut i = 0;
        while v != 0 {
            if v & 1 != 0 {
                d ^= self.basis[i];
            }
            v >>= 1;
            i += 1;
        }
        d
    }

    /// The identification `x` for which `icrc(0) ^ delta(x) == carried`, if one exists
    /// (Gaussian elimination over GF(2): 16 unknowns, 32 equations).
    pub fn solve(&self, icrc_id0: u32, carried: u32) -> Option<u16> {
        let mut rows: [(u32, u16); 16] = [(0, 0); 16];
        for (i, r) in rows.iter_mut().enumerate() {
            *r = (self.basis[i], 1 << i);
        }
        let mut target = icrc_id0 ^ carried;
        let mut x = 0u16;
        let mut used = 0usize;
        for bit in (0..32).rev() {
            let mask = 1u32 << bit;
            let Some(p) = (used..16).find(|&j| rows[j].0 & mask != 0) else {
                continue;
            };
            rows.swap(used, p);
            let (pv, pc) = rows[used];
            for (j, row) in rows.iter_mut().enumerate() {
                if j != used && row.0 & mask != 0 {
                    row.0 ^= pv;
                    row.1 ^= pc;
                }
            }
            if target & mask != 0 {
                target ^= pv;
                x ^= pc;
            }
            used += 1;
        }
        (target == 0).then_some(x)
    }
}

/// Read the ICRC carried in the last four bytes of a UDP payload.
pub fn carried(udp_payload: &[u8]) -> Result<u32> {
    let n = udp_payload.len();
    if n < ICRC_LEN {
        return Err(Error::Truncated {
            what: "ICRC",
            need: ICRC_LEN,
            have: n,
        });
    }
    let mut b = [0u8; 4];
    b.copy_from_slice(&udp_payload[n - ICRC_LEN..]);
    Ok(u32::from_le_bytes(b))
}

fn mask_ipv4(ip: &[u8]) -> Result<([u8; 60], usize)> {
    let ihl = usize::from(ip.first().copied().unwrap_or(0) & 0x0f) * 4;
    if ihl < 20 {
        return Err(Error::BadIpHeader("IPv4 header length below 20"));
    }
    if ip.len() < ihl {
        return Err(Error::Truncated {
            what: "IPv4 header",
            need: ihl,
            have: ip.len(),
        });
    }
    let mut m = [0u8; 60];
    m[..ihl].copy_from_slice(&ip[..ihl]);
    mask_ipv4_fields(&mut m);
    Ok((m, ihl))
}

/// Set the IPv4 fields the ICRC does not cover to ones: TOS, TTL, header checksum.
fn mask_ipv4_fields(ip: &mut [u8]) {
    ip[1] = 0xff;
    ip[8] = 0xff;
    ip[10] = 0xff;
    ip[11] = 0xff;
}

fn mask_ipv6(ip: &[u8]) -> Result<[u8; 40]> {
    if ip.len() < 40 {
        return Err(Error::Truncated {
            what: "IPv6 header",
            need: 40,
            have: ip.len(),
        });
    }
    let mut m = [0u8; 40];
    m.copy_from_slice(&ip[..40]);
    mask_ipv6_fields(&mut m);
    Ok(m)
}

/// Set the IPv6 fields the ICRC does not cover to ones: traffic class, flow label, hop limit.
fn mask_ipv6_fields(ip: &mut [u8]) {
    ip[0] |= 0x0f;
    ip[1] = 0xff;
    ip[2] = 0xff;
    ip[3] = 0xff;
    ip[7] = 0xff;
}

/// Set the UDP checksum, which the ICRC does not cover, to ones.
fn mask_udp_fields(udp: &mut [u8]) {
    udp[6] = 0xff;
    udp[7] = 0xff;
}

/// Finish an ICRC whose hasher has taken the covered headers ahead of the BTH: the BTH with
/// byte 4 (FECN, BECN, reserved) set to ones, the rest of `head`, then what `rest` feeds.
fn finish(
    mut h: crc32fast::Hasher,
    head: &[u8],
    rest: impl FnOnce(&mut crc32fast::Hasher),
) -> Result<u32> {
    const BTH: usize = 12;
    if head.len() < BTH {
        return Err(Error::Truncated {
            what: "BTH",
            need: BTH,
            have: head.len(),
        });
    }
    let mut bth = [0u8; BTH];
    bth.copy_from_slice(&head[..BTH]);
    bth[4] = 0xff;
    h.update(&bth);
    h.update(&head[BTH..]);
    rest(&mut h);
    Ok(h.finalize())
}

/// The identification deltas ([`IdDelta`]) of the last few packet lengths seen: senders use
/// few lengths (full MTU packets, a last one, acknowledgements), and a basis costs 16 CRCs.
#[derive(Debug, Default)]
pub struct IdDeltas(Vec<IdDelta>);

impl IdDeltas {
    /// Bases kept at most.
    const KEEP: usize = 8;

    /// The basis for packets whose ICRC covers `body_len` bytes after the IP header.
    pub fn for_len(&mut self, body_len: usize) -> &IdDelta {
        let v = &mut self.0;
        match v.iter().position(|d| d.body_len() == body_len) {
            Some(i) => &v[i],
            None => {
                if v.len() >= Self::KEEP {
                    v.remove(0);
                }
                v.push(IdDelta::new(body_len));
                &v[v.len() - 1]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesized_header_equals_real_header() {
        // A real IPv4 header (ID 0, DF, TTL 64, checksum filled) and the context that describes it.
        let body = [
            0x11u8, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 5, 0x1f, 0, 0, 1,
        ];
        let ctx = IcrcContext::v4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            0xc123,
        );
        let total = (20 + 8 + body.len() + 4) as u16;
        let mut ip = [
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0x12, 0x34, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        let mut udp = [0xc1, 0x23, 0x12, 0xb7, 0, 0, 0xab, 0xcd];
        udp[4..6].copy_from_slice(&(total - 20).to_be_bytes());
        assert_eq!(
            ctx.compute(&body).unwrap(),
            compute_from_headers(&ip, &udp, &body).unwrap()
        );
        // The ID is covered.
        ip[5] = 1;
        assert_ne!(
            ctx.compute(&body).unwrap(),
            compute_from_headers(&ip, &udp, &body).unwrap()
        );
    }

    #[test]
    fn id_delta_matches_recomputation_and_solves() {
        let body: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let base = IcrcContext::v4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            0xc000,
        );
        let d = IdDelta::new(body.len());
        let c0 = base.compute(&body).unwrap();
        for id in [1u16, 2, 3, 0x8000, 0xcdcc, 0xffff, 1234] {
            let mut ctx = base;
            if let IpHeader::V4 { id: ref mut i, .. } = ctx.ip {
                *i = id;
            }
            let c = ctx.compute(&body).unwrap();
            assert_eq!(c0 ^ d.delta(id), c, "id {id:#x}");
            assert_eq!(d.solve(c0, c), Some(id));
        }
        // A corrupted ICRC is almost never explained by some ID.
        let unexplained = (0..64u32)
            .filter(|i| d.solve(c0, c0 ^ (0x9e37_79b9u32.rotate_left(*i))).is_none())
            .count();
        assert!(unexplained > 56, "{unexplained}");
    }

    #[test]
    fn short_inputs_are_errors() {
        assert!(compute_from_headers(&[0x45; 10], &[0; 8], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x45; 20], &[0; 7], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x65; 39], &[0; 8], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x41; 20], &[0; 8], &[0; 12]).is_err());
        assert!(carried(&[1, 2, 3]).is_err());
    }
}
