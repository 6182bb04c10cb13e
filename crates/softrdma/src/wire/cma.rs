//! What the RDMA connection manager (rdma_cm) adds to the IB CM for IP addressing: the
//! service IDs of its IP port spaces, and the 36-byte header at the start of a REQ's private
//! data that carries the IP addresses and the source port (Linux `struct cma_hdr`; IBTA
//! annex A11, "RDMA IP CM Service").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Error, Result, get_u16, set_u16};

/// The port spaces of rdma_cm (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams.
    Udp,
    /// `RDMA_PS_IPOIB`.
    IpOib,
    /// `RDMA_PS_IB`: any QP type, native IB addressing.
    Ib,
}

impl PortSpace {
    /// The value of `enum rdma_ucm_port_space`.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::IpOib => 0x0002,
            PortSpace::Ib => 0x013f,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
        }
    }

    /// The port space of an `enum rdma_ucm_port_space` value.
    pub fn from_code(c: u32) -> Option<PortSpace> {
        [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::IpOib,
            PortSpace::Ib,
        ]
        .into_iter()
        .find(|p| u32::from(p.code()) == c)
    }

    /// The IB service ID of `port` in this port space: `0x00000000_PSPS_PORT` (TCP port
    /// 18515 is 0x0000000001064853).
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.code() as u64) << 16) | port as u64
    }

    /// The port space and port a service ID names, if it is an rdma_cm IP service.
    pub fn of_service_id(sid: u64) -> Option<(PortSpace, u16)> {
        if sid >> 32 != 0 {
            return None;
        }
        let ps = PortSpace::from_code(((sid >> 16) & 0xffff) as u32)?;
        Some((ps, sid as u16))
    }
}

/// Length of the header at the start of a REQ's private data.
pub const CMA_HDR_LEN: usize = 36;
/// The header version Linux sends and accepts.
pub const CMA_VERSION: u8 = 0x00;

/// The rdma_cm IP header of a REQ: who connects to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmaHdr {
    /// The connecting side's address.
    pub src: IpAddr,
    /// The connecting side's port (rdma_cm's, not UDP's).
    pub src_port: u16,
    /// The address connected to.
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Parse the first 36 bytes of `b`; both addresses must be of the version the header says.
    pub fn parse(b: &[u8]) -> Result<CmaHdr> {
        if b.len() < CMA_HDR_LEN {
            return Err(Error::Truncated {
                what: "rdma_cm IP header",
                need: CMA_HDR_LEN,
                have: b.len(),
            });
        }
        if b[0] != CMA_VERSION {
            return Err(Error::BadMad("rdma_cm header version"));
        }
        let addr = |at: usize| -> Result<IpAddr> {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            match b[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(a))),
                _ => Err(Error::BadMad("rdma_cm IP version")),
            }
        };
        Ok(CmaHdr {
            src: addr(4)?,
            src_port: get_u16(b, 2..4),
            dst: addr(20)?,
        })
    }

    /// Emit into the first 36 bytes of `b`; both addresses must be of one version.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        if b.len() < CMA_HDR_LEN {
            return Err(Error::BufferTooSmall {
                need: CMA_HDR_LEN,
                have: b.len(),
            });
        }
        let b = &mut b[..CMA_HDR_LEN];
        b.fill(0);
        b[0] = CMA_VERSION;
        set_u16(b, 2..4, self.src_port);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&s.octets());
                b[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&s.octets());
                b[20..36].copy_from_slice(&d.octets());
            }
            _ => return Err(Error::FieldRange("rdma_cm addresses of two IP versions")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_of_the_ip_port_spaces() {
        // The REQ of rping in ../shared/captures/rxe/rxe_rping.pcap: TCP port space, 18525.
        assert_eq!(PortSpace::Tcp.service_id(0x485d), 0x0000_0000_0106_485d);
        assert_eq!(
            PortSpace::of_service_id(0x0000_0000_0106_485d),
            Some((PortSpace::Tcp, 0x485d))
        );
        assert_eq!(
            PortSpace::of_service_id(PortSpace::Udp.service_id(7)),
            Some((PortSpace::Udp, 7))
        );
        assert_eq!(PortSpace::of_service_id(0x0000_0001_0106_485d), None);
        assert_eq!(PortSpace::of_service_id(0x0000_0000_0199_0001), None);
    }

    #[test]
    fn header_round_trips_both_versions_and_refuses_mixtures() {
        let h4 = CmaHdr {
            src: "10.77.0.3".parse().unwrap(),
            src_port: 0xb923,
            dst: "10.77.0.2".parse().unwrap(),
        };
        let mut b = [0xffu8; 40];
        h4.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 0x40, 0xb9, 0x23]);
        assert_eq!(&b[16..20], &[10, 77, 0, 3]);
        assert_eq!(&b[36..], &[0xff; 4]);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h4);
        let h6 = CmaHdr {
            src: "fe80::1".parse().unwrap(),
            src_port: 1,
            dst: "fe80::2".parse().unwrap(),
        };
        h6.emit(&mut b).unwrap();
        assert_eq!(CmaHdr::parse(&b).unwrap(), h6);
        let mixed = CmaHdr { dst: h4.dst, ..h6 };
        assert!(mixed.emit(&mut b).is_err());
        b[1] = 0x50;
        assert_eq!(CmaHdr::parse(&b), Err(Error::BadMad("rdma_cm IP version")));
        b[0] = 1;
        assert_eq!(
            CmaHdr::parse(&b),
            Err(Error::BadMad("rdma_cm header version"))
        );
        assert!(CmaHdr::parse(&b[..35]).is_err());
    }
}
