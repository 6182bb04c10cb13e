//! Helpers shared by the capture tests.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::PathBuf;

use softrdma::wire::{IcrcContext, IpHeader, ROCE_PORT};
use softrdma_cli::capture::{Classified, UdpFrame, classify, for_each_frame};

/// The shared captures directory beside the repository.
pub fn shared() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
}

/// Every `*.pcap` in `shared/captures/<dir>`, sorted. Fails if there are none.
pub fn captures(dir: &str) -> Vec<PathBuf> {
    let d = shared().join("captures").join(dir);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap" || x == "pcapng"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no captures in {}", d.display());
    v
}

/// A RoCEv2 datagram lifted out of a capture, owned.
#[derive(Debug, Clone)]
pub struct Datagram {
    pub frame: usize,
    pub ctx: IcrcContext,
    pub ip_header: Vec<u8>,
    pub udp_header: Vec<u8>,
    pub payload: Vec<u8>,
}

/// The IP/UDP context of a captured datagram, read from its real headers.
pub fn context(u: &UdpFrame<'_>) -> IcrcContext {
    let ip = match (u.src, u.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            assert_eq!(
                u.ip_header.len(),
                20,
                "IPv4 options are not expected in these captures"
            );
            IpHeader::V4 {
                src,
                dst,
                id: u16::from_be_bytes([u.ip_header[4], u.ip_header[5]]),
                dont_fragment: u.ip_header[6] & 0x40 != 0,
            }
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpHeader::V6 { src, dst },
        _ => unreachable!("mixed address families"),
    };
    IcrcContext {
        ip,
        src_port: u.src_port,
        dst_port: u.dst_port,
    }
}

/// All RoCEv2 datagrams of a capture file.
pub fn datagrams(path: &std::path::Path) -> Vec<Datagram> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    for_each_frame(&bytes, |f| match classify(f.link, &f.data, ROCE_PORT) {
        Classified::Udp(u) => out.push(Datagram {
            frame: f.number,
            ctx: context(&u),
            ip_header: u.ip_header.to_vec(),
            udp_header: u.udp_header.to_vec(),
            payload: u.payload.to_vec(),
        }),
        Classified::Malformed(e) => panic!("{}: frame {} malformed: {e}", path.display(), f.number),
        Classified::Other => {}
    })
    .unwrap();
    out
}
