//! Unreliable Connected and Unreliable Datagram (IBTA 9.8, 9.8.3): the requester and the
//! receiver of the two services that send no acknowledgements and resend nothing.
//!
//! They share the QP's queues, state machine and completions with RC (as rxe shares them):
//! a send WQE completes when its last packet is built, a receive when its message is placed.
//!
//! * **UC** carries SEND and RDMA WRITE (with immediate) in PSN order from one peer. A PSN
//!   gap, or a packet out of the opcode sequence, drops the rest of the message in progress
//!   (a receive it had started goes back to the head of its queue, to be reused); the receiver
//!   resynchronises at the next first or only packet, whatever its PSN. A refused packet (no
//!   receive posted, a bad R_Key, a message longer than the receive) drops its message too.
//!   Nothing is NAKed and the QP survives, except for a local protection error on placement
//!   (the receive's own memory is gone), which ends the QP as on RC.
//! * **UD** carries one-packet SENDs (with immediate) to any QP named by the work request's
//!   [`UdDest`]; a DETH carries the Q_Key and the source QP. The receiver drops a datagram
//!   whose Q_Key differs from the QP's, that finds no receive posted or a full CQ, or whose
//!   receive is too short; every drop is counted ([`UnrelCounters`]). The receive buffer gets
//!   the 40-byte GRH area first ([`grh_area`]), then the payload.

mod recv;
mod send;

pub use recv::RxEnv;
pub use send::TxEnv;

use std::net::IpAddr;

use super::wr::{SendWr, WrOpcode};
use super::{GRH_LEN, PostError, QpType};
use crate::wire::{AddressVector, IcrcPrefix, IpHeader};

/// A UD work request's destination (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The path: the address handle's, with the CRC of its covered headers computed when
    /// the address vector was made, not for every datagram sent by it.
    av: AddressVector,
    /// The destination QP (24 bits).
    pub remote_qpn: u32,
    /// The Q_Key to send with; with its high bit set, the QP's own Q_Key is sent instead.
    pub remote_qkey: u32,
}

impl UdDest {
    /// QP `remote_qpn` with Q_Key `remote_qkey` by the path `av`.
    pub fn new(av: AddressVector, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            av,
            remote_qpn,
            remote_qkey,
        }
    }

    /// The path: the address handle's address vector.
    pub fn av(&self) -> AddressVector {
        self.av
    }

    /// The path's IP/UDP context with the CRC of its covered headers.
    pub(super) fn icrc(&self) -> &IcrcPrefix {
        self.av.prefix()
    }
}

/// Where a received datagram came from, as its IP header said: what a UD receive's GRH area
/// holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramSource {
    /// The IP header (source and destination, and for IPv4 the identification).
    pub ip: IpHeader,
    /// The packet's UDP payload length (BTH to ICRC).
    pub udp_payload_len: usize,
}

impl DatagramSource {
    /// The network header the datagram came with.
    pub fn network(&self) -> crate::rc::NetworkHdr {
        match self.ip {
            IpHeader::V4 { .. } => crate::rc::NetworkHdr::Ipv4,
            IpHeader::V6 { .. } => crate::rc::NetworkHdr::Ipv6,
        }
    }
}

/// Hop limit written into a GRH area: a UDP socket does not see the received one, and Linux
/// sends with 64 unless told otherwise.
pub const GRH_TTL: u8 = 64;

/// The 40-byte GRH area of a UD receive for a packet from `src`, as rdma-core and rxe lay
/// it out for RoCEv2: for IPv4, 20 zero bytes and then the IPv4 header (version 4, no
/// options, the total length, the identification, Don't Fragment, TTL [`GRH_TTL`], UDP, a
/// valid header checksum, the addresses); for IPv6, the IPv6 header (payload length, next
/// header UDP, hop limit [`GRH_TTL`], the addresses). Traffic class and flow label are 0.
pub fn grh_area(src: &DatagramSource) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = (8 + src.udp_payload_len).min(usize::from(u16::MAX)) as u16;
    match src.ip {
        IpHeader::V4 {
            src: s,
            dst: d,
            id,
            dont_fragment,
        } => {
            let h = &mut g[20..];
            h[0] = 0x45;
            let total = udp_len.saturating_add(20);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
            if dont_fragment {
                h[6] = 0x40;
            }
            h[8] = GRH_TTL;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let csum = ipv4_checksum(h);
            h[10..12].copy_from_slice(&csum.to_be_bytes());
        }
        IpHeader::V6 { src: s, dst: d } => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17;
            g[7] = GRH_TTL;
            g[8..24].copy_from_slice(&s.octets());
            g[24..40].copy_from_slice(&d.octets());
        }
    }
    g
}

/// The Internet checksum of a 20-byte IPv4 header whose checksum field is zero.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The source address a GRH area names (what `ibv_init_ah_from_wc` reads), if it is a
/// well-formed IPv4 (version 4 in its last 20 bytes) or IPv6 area.
pub fn grh_source(g: &[u8; GRH_LEN]) -> Option<(IpAddr, IpAddr)> {
    if g[20] >> 4 == 4 && g[20] & 0xf == 5 {
        let s: [u8; 4] = g[32..36].try_into().ok()?;
        let d: [u8; 4] = g[36..40].try_into().ok()?;
        return Some((IpAddr::from(s), IpAddr::from(d)));
    }
    if g[0] >> 4 == 6 {
        let s: [u8; 16] = g[8..24].try_into().ok()?;
        let d: [u8; 16] = g[24..40].try_into().ok()?;
        return Some((IpAddr::from(s), IpAddr::from(d)));
    }
    None
}

/// What UC and UD receivers dropped, and why (each datagram or message counted once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnrelCounters {
    /// UD datagrams whose Q_Key was not the QP's.
    pub qkey_drops: u64,
    /// Messages dropped because no receive was posted (or the CQ was full).
    pub no_recv_drops: u64,
    /// Messages dropped because they were longer than the receive (UD: than the receive
    /// minus the GRH area).
    pub len_drops: u64,
    /// UC messages cut by a PSN gap or an opcode out of sequence (the rest of the message
    /// dropped).
    pub uc_gap_drops: u64,
    /// UC WRITEs refused (no remote-write right, a bad R_Key or range): dropped.
    pub access_drops: u64,
    /// Messages dropped because their memory was suspended (no RNR wait on UC and UD).
    pub suspended_drops: u64,
    /// Malformed packets (a UD datagram without a DETH or longer than the MTU, one whose
    /// origin the driver did not give, a UC packet of the wrong length).
    pub malformed: u64,
}

/// Check a work request against what a QP of type `t` accepts, before it is queued: UC
/// carries SEND and RDMA WRITE (with immediate) and local operations; UD carries SEND (with
/// immediate), needs a destination, and a message of at most the port's MTU (`mtu` bytes).
pub(super) fn check_post(t: QpType, wr: &SendWr<'_>, len: u64, mtu: u32) -> Result<(), PostError> {
    let ok = match t {
        QpType::Rc => return Ok(()),
        QpType::Uc => matches!(
            wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::RdmaWrite { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
                | WrOpcode::LocalInv { .. }
                | WrOpcode::BindMw { .. }
        ),
        QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }),
    };
    if !ok {
        return Err(PostError::InvalidArgument(match t {
            QpType::Ud => "a UD QP sends only SEND and SEND with immediate",
            _ => "a UC QP has no READ, atomic or SEND with Invalidate",
        }));
    }
    if t == QpType::Ud {
        let Some(d) = wr.ud else {
            return Err(PostError::InvalidArgument(
                "a UD work request needs a destination (address handle, QPN, Q_Key)",
            ));
        };
        if d.remote_qpn > 0x00ff_ffff {
            return Err(PostError::InvalidArgument("remote QPN wider than 24 bits"));
        }
        if len > u64::from(mtu) {
            return Err(PostError::MessageTooLong { len, max: mtu });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn grh_area_holds_a_valid_ipv4_header_in_its_last_20_bytes() {
        let src = DatagramSource {
            ip: IpHeader::V4 {
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
                id: 0x1234,
                dont_fragment: true,
            },
            udp_payload_len: 12 + 8 + 100 + 4,
        };
        let g = grh_area(&src);
        assert!(g[..20].iter().all(|&b| b == 0));
        let h = &g[20..];
        assert_eq!(h[0], 0x45);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 20 + 8 + 124);
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 0x1234);
        assert_eq!(h[6], 0x40);
        assert_eq!(h[9], 17);
        // A header with its checksum sums to 0xffff.
        assert_eq!(ipv4_checksum(h), 0);
        assert_eq!(
            grh_source(&g),
            Some((
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))
            ))
        );
    }

    #[test]
    fn grh_area_is_the_ipv6_header() {
        let (s, d) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let src = DatagramSource {
            ip: IpHeader::V6 { src: s, dst: d },
            udp_payload_len: 40,
        };
        let g = grh_area(&src);
        assert_eq!(g[0], 0x60);
        assert_eq!(u16::from_be_bytes([g[4], g[5]]), 48);
        assert_eq!(g[6], 17);
        assert_eq!(&g[8..24], &Ipv6Addr::octets(&s));
        assert_eq!(grh_source(&g), Some((IpAddr::V6(s), IpAddr::V6(d))));
    }
}
