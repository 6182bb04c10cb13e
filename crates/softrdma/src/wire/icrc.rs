//! The invariant CRC (IBTA A17.3.3, RoCEv2): CRC-32 over the packet with the fields that may
//! change in flight replaced by ones, stored little-endian in the last four bytes.
//!
//! Covered: 8 bytes of ones standing for the LRH; the IP header with IPv4 TOS, TTL and header
//! checksum (IPv6 traffic class, flow label and hop limit) set to ones; the UDP header with
//! its checksum set to ones; the BTH with byte 4 (FECN, BECN, reserved) set to ones; then
//! everything up to the ICRC. The IPv4 identification, flags and total length are covered,
//! which is why a sender must know the ID its datagram will carry (`IP_PMTUDISC_DO` gives 0).

use core::net::{Ipv4Addr, Ipv6Addr};

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
        let udp_len = 8 + body.len() + ICRC_LEN;
        let udp_len16 = u16::try_from(udp_len).map_err(|_| Error::FieldRange("UDP length"))?;
        let mut udp = [0u8; 8];
        udp[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len16.to_be_bytes());
        match self.ip {
            IpHeader::V4 {
                src,
                dst,
                id,
                dont_fragment,
            } => {
                let total =
                    u16::try_from(20 + udp_len).map_err(|_| Error::FieldRange("IP length"))?;
                let mut ip = [0u8; 20];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                ip[4..6].copy_from_slice(&id.to_be_bytes());
                if dont_fragment {
                    ip[6] = 0x40;
                }
                ip[9] = 17;
                ip[12..16].copy_from_slice(&src.octets());
                ip[16..20].copy_from_slice(&dst.octets());
                crc(&mask_ipv4(&ip)?.0[..20], &mut udp, body)
            }
            IpHeader::V6 { src, dst } => {
                let mut ip = [0u8; 40];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&udp_len16.to_be_bytes());
                ip[6] = 17;
                ip[8..24].copy_from_slice(&src.octets());
                ip[24..40].copy_from_slice(&dst.octets());
                crc(&mask_ipv6(&ip)?, &mut udp, body)
            }
        }
    }
}

/// The ICRC of a captured packet from its real IP header (v4 with options, or v6), its UDP
/// header and the UDP payload without the trailing ICRC.
pub fn compute_from_headers(ip: &[u8], udp: &[u8], body: &[u8]) -> Result<u32> {
    let mut u = [0u8; 8];
    if udp.len() < 8 {
        return Err(Error::Truncated {
            what: "UDP header",
            need: 8,
            have: udp.len(),
        });
    }
    u.copy_from_slice(&udp[..8]);
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let (buf, len) = mask_ipv4(ip)?;
            crc(&buf[..len], &mut u, body)
        }
        Some(6) => crc(&mask_ipv6(ip)?, &mut u, body),
        _ => Err(Error::BadIpHeader("not IPv4 or IPv6")),
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
    m[1] = 0xff; // TOS
    m[8] = 0xff; // TTL
    m[10] = 0xff; // header checksum
    m[11] = 0xff;
    Ok((m, ihl))
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
    m[0] |= 0x0f; // traffic class (high nibble) ...
    m[1] = 0xff; // ... traffic class (low nibble) and flow label
    m[2] = 0xff;
    m[3] = 0xff;
    m[7] = 0xff; // hop limit
    Ok(m)
}

fn crc(ip_masked: &[u8], udp: &mut [u8; 8], body: &[u8]) -> Result<u32> {
    const BTH: usize = 12;
    if body.len() < BTH {
        return Err(Error::Truncated {
            what: "BTH",
            need: BTH,
            have: body.len(),
        });
    }
    udp[6] = 0xff;
    udp[7] = 0xff;
    let mut bth = [0u8; BTH];
    bth.copy_from_slice(&body[..BTH]);
    bth[4] = 0xff;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(ip_masked);
    h.update(udp);
    h.update(&bth);
    h.update(&body[BTH..]);
    Ok(h.finalize())
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
    fn short_inputs_are_errors() {
        assert!(compute_from_headers(&[0x45; 10], &[0; 8], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x45; 20], &[0; 7], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x65; 39], &[0; 8], &[0; 12]).is_err());
        assert!(compute_from_headers(&[0x41; 20], &[0; 8], &[0; 12]).is_err());
        assert!(carried(&[1, 2, 3]).is_err());
    }
}
