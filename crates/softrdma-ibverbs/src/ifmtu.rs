//! The default active MTU of a device follows the MTU of the network interface its address
//! is on, as rxe's does: the largest IB MTU that fits in the interface MTU less 80 bytes of
//! headers (rxe's `RXE_MAX_HDR_LENGTH`), at most 4096 and at least 256. An Ethernet MTU of
//! 1500 gives 1024, a jumbo MTU of 9000 gives 4096, loopback (65536) gives 4096.
//!
//! The port's active speed and width follow the interface too ([`link_of`]): a NIC's link
//! speed maps to the InfiniBand speed and width rxe reports for it; a virtual interface
//! (loopback, veth, a bridge: no device behind it in sysfs) reports 4X EDR, 100 Gb/s.

use std::net::Ipv4Addr;

/// Headers rxe keeps out of the interface MTU (Ethernet, IP, UDP, BTH and extended headers).
pub const MAX_HDR_LENGTH: u32 = 80;

/// `enum ibv_mtu` for an interface MTU of `eth_mtu` bytes (rxe's `eth_mtu_int_to_enum`,
/// clamped as `rxe_set_mtu` does).
pub fn active_mtu_for(eth_mtu: u32) -> i32 {
    match eth_mtu.saturating_sub(MAX_HDR_LENGTH) {
        m if m >= 4096 => 5,
        m if m >= 2048 => 4,
        m if m >= 1024 => 3,
        m if m >= 512 => 2,
        _ => 1,
    }
}

/// The MTU of the interface whose IPv4 network holds `addr` (the interface that has it, or
/// whose subnet contains it: 127.0.0.2 is on `lo` by 127.0.0.1/8), if any.
pub fn interface_mtu(addr: Ipv4Addr) -> Option<u32> {
    let name = interface_of(addr)?;
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    s.trim().parse().ok()
}

/// `(active_width, active_speed)` of the port (`IBV_WIDTH_*`, `IBV_SPEED_*`).
pub type Link = (u8, u8);

const WIDTH_1X: u8 = 1;
const WIDTH_2X: u8 = 16;
const WIDTH_4X: u8 = 2;
const SPEED_SDR: u8 = 1;
const SPEED_DDR: u8 = 2;
const SPEED_FDR10: u8 = 8;
const SPEED_EDR: u8 = 32;
const SPEED_HDR: u8 = 64;
const SPEED_NDR: u8 = 128;

/// 4X EDR (100 Gb/s): the port of a device on a virtual interface. Its bytes move at the
/// speed of a memory copy, not of a wire, and clients weigh the link against their own
/// copies: UCX sends a message eagerly (one copy more at the receiver) up to the size where
/// it expects the link to beat its copy; at 1X EDR (25 Gb/s, 3 GB/s) that was 262 KiB, and
/// a 64 KiB `tag_bw` ran at 1.2 GB/s where its zero-copy rendezvous ran at 1.9 GB/s.
pub const VIRTUAL_LINK: Link = (WIDTH_4X, SPEED_EDR);

/// The width and speed rxe reports for an Ethernet link of `mbps` (the kernel's
/// `ib_get_eth_speed`).
pub fn link_for(mbps: u32) -> Link {
    match mbps {
        0..=1_000 => (WIDTH_1X, SPEED_SDR),
        1_001..=10_000 => (WIDTH_1X, SPEED_FDR10),
        10_001..=20_000 => (WIDTH_4X, SPEED_DDR),
        20_001..=25_000 => (WIDTH_1X, SPEED_EDR),
        25_001..=40_000 => (WIDTH_4X, SPEED_FDR10),
        40_001..=50_000 => (WIDTH_2X, SPEED_EDR),
        50_001..=100_000 => (WIDTH_4X, SPEED_EDR),
        100_001..=200_000 => (WIDTH_4X, SPEED_HDR),
        _ => (WIDTH_4X, SPEED_NDR),
    }
}

/// The port's width and speed for a device on `addr`: those of the NIC its interface is on
/// ([`link_for`] its link speed), or [`VIRTUAL_LINK`] when the interface is virtual, its
/// speed unknown, or `addr` on no interface.
pub fn link_of(addr: Ipv4Addr) -> Link {
    let Some(name) = interface_of(addr) else {
        return VIRTUAL_LINK;
    };
    let dir = format!("/sys/class/net/{name}");
    if !std::path::Path::new(&format!("{dir}/device")).exists() {
        return VIRTUAL_LINK;
    }
    match std::fs::read_to_string(format!("{dir}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
    {
        Some(mbps) if mbps > 0 => link_for(u32::try_from(mbps).unwrap_or(u32::MAX)),
        _ => VIRTUAL_LINK,
    }
}

/// The name of the interface whose network holds `addr`; an exact address match wins over a
/// subnet match.
fn interface_of(addr: Ipv4Addr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let want = u32::from(addr);
    let mut exact = None;
    let mut subnet: Option<(u32, String)> = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-NULL sockaddr of the list; its family says how to read it.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET addresses and their netmasks are sockaddr_in.
        let (a, m) = unsafe {
            (
                u32::from_be((*ifa.ifa_addr.cast::<libc::sockaddr_in>()).sin_addr.s_addr),
                u32::from_be(
                    (*ifa.ifa_netmask.cast::<libc::sockaddr_in>())
                        .sin_addr
                        .s_addr,
                ),
            )
        };
        // SAFETY: a NUL-terminated interface name owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        if a == want {
            exact = Some(name);
            break;
        }
        if a & m == want & m && subnet.as_ref().is_none_or(|(best, _)| m > *best) {
            subnet = Some((m, name));
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    exact.or(subnet.map(|(_, n)| n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_rxe_maps_interface_mtus() {
        assert_eq!(active_mtu_for(1500), 3);
        assert_eq!(active_mtu_for(9000), 5);
        assert_eq!(active_mtu_for(65536), 5);
        assert_eq!(active_mtu_for(4096 + 80), 5);
        assert_eq!(active_mtu_for(4096 + 79), 4);
        assert_eq!(active_mtu_for(2048 + 80), 4);
        assert_eq!(active_mtu_for(1024 + 80), 3);
        assert_eq!(active_mtu_for(1000), 2);
        assert_eq!(active_mtu_for(576), 1);
        assert_eq!(active_mtu_for(0), 1);
    }

    #[test]
    fn as_rxe_maps_link_speeds() {
        assert_eq!(link_for(1_000), (WIDTH_1X, SPEED_SDR));
        assert_eq!(link_for(10_000), (WIDTH_1X, SPEED_FDR10));
        assert_eq!(link_for(25_000), (WIDTH_1X, SPEED_EDR));
        assert_eq!(link_for(40_000), (WIDTH_4X, SPEED_FDR10));
        assert_eq!(link_for(50_000), (WIDTH_2X, SPEED_EDR));
        assert_eq!(link_for(100_000), (WIDTH_4X, SPEED_EDR));
        assert_eq!(link_for(200_000), (WIDTH_4X, SPEED_HDR));
        assert_eq!(link_for(400_000), (WIDTH_4X, SPEED_NDR));
    }

    #[test]
    fn virtual_interfaces_report_the_virtual_link() {
        // Loopback is virtual (no device behind it); an address on no interface too.
        assert_eq!(link_of(Ipv4Addr::new(127, 0, 0, 1)), VIRTUAL_LINK);
        assert_eq!(link_of(Ipv4Addr::new(0, 0, 0, 1)), VIRTUAL_LINK);
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        let lo = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .expect("this machine has a loopback interface");
        let lo: u32 = lo.trim().parse().unwrap();
        assert_eq!(interface_mtu(Ipv4Addr::new(127, 0, 0, 1)), Some(lo));
        assert_eq!(interface_mtu(Ipv4Addr::new(127, 0, 0, 2)), Some(lo));
        assert_eq!(interface_mtu(Ipv4Addr::new(0, 0, 0, 1)), None);
    }
}
