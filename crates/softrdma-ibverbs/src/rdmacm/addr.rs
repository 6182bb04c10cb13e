//! Socket addresses in C form, and which local device reaches an address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};

use super::abi::SockStorage;
use crate::device::{self, Device};

/// The address a C `struct sockaddr` holds (IPv4 or IPv6), if any.
///
/// # Safety
/// `sa` is NULL or points to a socket address as long as its family says.
pub unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL; the family field is read first, then only the struct it names.
    unsafe {
        match c_int_of((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

fn c_int_of(f: libc::sa_family_t) -> libc::c_int {
    libc::c_int::from(f)
}

/// `a` as a C socket address in a `sockaddr_storage`; its length.
pub fn to_storage(a: SocketAddr) -> (SockStorage, libc::socklen_t) {
    let mut st = SockStorage([0; 128]);
    let len = match a {
        SocketAddr::V4(v4) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in (16 bytes) fits the 128-byte, 8-aligned storage.
            unsafe { st.0.as_mut_ptr().cast::<libc::sockaddr_in>().write(s) };
            core::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a sockaddr_in6 (28 bytes) fits the 128-byte, 8-aligned storage.
            unsafe { st.0.as_mut_ptr().cast::<libc::sockaddr_in6>().write(s) };
            core::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as libc::socklen_t)
}

/// The socket address in `st`, if it holds one.
pub fn of_storage(st: &SockStorage) -> Option<SocketAddr> {
    // SAFETY: 128 bytes of storage hold any socket address its family names.
    unsafe { from_sockaddr(st.0.as_ptr().cast()) }
}

/// The softrdma device whose address is `ip`.
pub fn device_with(ip: IpAddr) -> Option<&'static Device> {
    let devs = device::devices().ok()?;
    devs.iter().find(|d| IpAddr::V4(d.cfg.addr) == ip)
}

/// The local device to reach `dst` from: the one whose address the kernel would send from
/// (a connected UDP socket's local address), else the only device, else the first.
pub fn device_toward(dst: IpAddr) -> Option<&'static Device> {
    let devs = device::devices().ok()?;
    if let Some(d) = device_with(dst) {
        // A device of this process is the destination: any other device reaches it.
        if let Some(other) = devs.iter().find(|o| o.cfg.addr != d.cfg.addr) {
            return Some(other);
        }
    }
    let any: IpAddr = if dst.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let src = UdpSocket::bind((any, 0))
        .and_then(|s| s.connect((dst, 9)).map(|_| s))
        .and_then(|s| s.local_addr())
        .ok()
        .map(|a| a.ip());
    src.and_then(device_with).or_else(|| devs.first())
}
