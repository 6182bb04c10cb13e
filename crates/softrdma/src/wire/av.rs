//! Address vectors: the path between two RoCEv2 ports. From one value follow both where a
//! datagram goes (the socket address) and what the ICRC covers ahead of the BTH (the IP and
//! UDP headers, with their CRC computed once), so the two can never disagree.
//!
//! A device of one address family can reach a peer named in the other one: an IPv4 device
//! sends to an IPv4-mapped IPv6 peer over IPv4, and an IPv6 device sends to an IPv4 peer at
//! its mapped address (as a dual-stack socket does).

use core::net::{IpAddr, SocketAddr};

use super::icrc::{IcrcContext, IcrcPrefix, IpHeader};

/// The path from this port to a peer's: the IP/UDP context its packets travel in, the CRC of
/// that context's covered headers, and the socket address they are sent to (`ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    icrc: IcrcPrefix,
    dest: SocketAddr,
}

impl AddressVector {
    /// The path from a port at `local` sending from UDP port `src_port` to the port at `peer`
    /// listening on UDP port `dst_port` (4791 unless configured otherwise).
    pub fn new(local: IpAddr, peer: IpAddr, src_port: u16, dst_port: u16) -> AddressVector {
        let (ctx, dest_ip) = match (local, peer) {
            (IpAddr::V4(l), IpAddr::V4(p)) => (IcrcContext::v4(l, p, src_port), peer),
            (IpAddr::V6(l), IpAddr::V6(p)) => (IcrcContext::v6(l, p, src_port), peer),
            (IpAddr::V6(l), IpAddr::V4(p)) => {
                let mapped = p.to_ipv6_mapped();
                (IcrcContext::v6(l, mapped, src_port), IpAddr::V6(mapped))
            }
            (IpAddr::V4(l), IpAddr::V6(p)) => match p.to_ipv4_mapped() {
                Some(p4) => (IcrcContext::v4(l, p4, src_port), IpAddr::V4(p4)),
                // Not reachable from an IPv4 socket: sending fails there, as it should.
                None => (IcrcContext::v6(l.to_ipv6_mapped(), p, src_port), peer),
            },
        };
        AddressVector {
            icrc: IcrcPrefix::new(IcrcContext { dst_port, ..ctx }),
            dest: SocketAddr::new(dest_ip, dst_port),
        }
    }

    /// The path a given IP/UDP context describes (a captured packet's, a test's): sent to its
    /// destination address and port; an IPv6 context between two IPv4-mapped addresses is
    /// sent over IPv4.
    pub fn from_context(ctx: IcrcContext) -> AddressVector {
        let ip = match ctx.ip {
            IpHeader::V4 { dst, .. } => IpAddr::V4(dst),
            IpHeader::V6 { src, dst } => match (src.to_ipv4_mapped(), dst.to_ipv4_mapped()) {
                (Some(_), Some(d4)) => IpAddr::V4(d4),
                _ => IpAddr::V6(dst),
            },
        };
        AddressVector {
            icrc: IcrcPrefix::new(ctx),
            dest: SocketAddr::new(ip, ctx.dst_port),
        }
    }

    /// The IP/UDP context with the CRC of its covered headers (what packets on this path are
    /// checksummed with).
    pub fn prefix(&self) -> &IcrcPrefix {
        &self.icrc
    }

    /// The IP/UDP context.
    pub fn context(&self) -> &IcrcContext {
        self.icrc.context()
    }

    /// The socket address datagrams on this path are sent to.
    pub fn dest(&self) -> SocketAddr {
        self.dest
    }

    /// The peer's IP address as the IP header names it.
    pub fn peer_ip(&self) -> IpAddr {
        match self.context().ip {
            IpHeader::V4 { dst, .. } => IpAddr::V4(dst),
            IpHeader::V6 { dst, .. } => IpAddr::V6(dst),
        }
    }
}

#[cfg(test)]
mod tests {
    use core::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    const V4A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const V4B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn a_path_between_ipv4_ports_sends_where_its_header_says() {
        let av = AddressVector::new(V4A.into(), V4B.into(), 4791, 4792);
        assert_eq!(av.dest(), SocketAddr::new(V4B.into(), 4792));
        assert_eq!(av.context().dst_port, 4792);
        assert_eq!(av.context().src_port, 4791);
        assert_eq!(
            *av.context(),
            IcrcContext {
                dst_port: 4792,
                ..IcrcContext::v4(V4A, V4B, 4791)
            }
        );
        assert_eq!(av.prefix(), &IcrcPrefix::new(*av.context()));
        assert_eq!(av.peer_ip(), IpAddr::V4(V4B));
    }

    #[test]
    fn mixed_families_follow_the_device() {
        // An IPv4 device reaches a mapped peer over IPv4.
        let av = AddressVector::new(V4A.into(), V4B.to_ipv6_mapped().into(), 4791, 4791);
        assert_eq!(av.dest().ip(), IpAddr::V4(V4B));
        assert!(matches!(av.context().ip, IpHeader::V4 { dst, .. } if dst == V4B));
        // An IPv6 device reaches an IPv4 peer at its mapped address.
        let l6 = Ipv6Addr::LOCALHOST;
        let av = AddressVector::new(l6.into(), V4B.into(), 4791, 4791);
        assert_eq!(av.dest().ip(), IpAddr::V6(V4B.to_ipv6_mapped()));
        // `from_context` agrees with `new` on every combination.
        for (l, p) in [
            (IpAddr::V4(V4A), IpAddr::V4(V4B)),
            (IpAddr::V4(V4A), IpAddr::V6(V4B.to_ipv6_mapped())),
            (IpAddr::V4(V4A), IpAddr::V6(l6)),
            (IpAddr::V6(l6), IpAddr::V4(V4B)),
            (IpAddr::V6(l6), IpAddr::V6(l6)),
        ] {
            let av = AddressVector::new(l, p, 7, 4791);
            assert_eq!(AddressVector::from_context(*av.context()), av, "{l} -> {p}");
        }
    }
}
