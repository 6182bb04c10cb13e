//! Reading and writing packet captures: classic pcap and pcapng (via `pcap-file`), link
//! layers Ethernet (with VLAN tags), Linux cooked capture, raw IP and BSD loopback (via
//! `etherparse`), down to the UDP payloads that carry RoCEv2.

use std::borrow::Cow;
use std::io::Read;
use std::net::IpAddr;
use std::time::Duration;

use etherparse::{LaxNetSlice, LaxSlicedPacket, NetSlice, SlicedPacket, TransportSlice};
use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Neither the pcap nor the pcapng magic number.
    #[error("not a pcap or pcapng file (magic {0:02x?})")]
    UnknownFormat([u8; 4]),
    /// The file ended or broke inside a record.
    #[error("capture is damaged after {frames} frames: {source}")]
    Damaged {
        /// Frames read before the damage.
        frames: usize,
        /// The reader's error.
        source: pcap_file::PcapError,
    },
    /// An I/O error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A datagram too large for one IP packet.
    #[error("datagram of {0} bytes does not fit an IP packet")]
    TooLarge(usize),
}

/// One captured frame.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    /// 1-based frame number, as Wireshark counts.
    pub number: usize,
    /// Capture timestamp.
    pub time: Duration,
    /// Link-layer type.
    pub link: DataLink,
    /// The captured bytes.
    pub data: Cow<'a, [u8]>,
}

/// Call `f` for every frame of a pcap or pcapng capture held in `bytes`. Stops at the first
/// damaged record and reports it (frames before it have been delivered).
pub fn for_each_frame(bytes: &[u8], mut f: impl FnMut(Frame<'_>)) -> Result<usize, CaptureError> {
    let mut magic = [0u8; 4];
    (&bytes[..bytes.len().min(4)])
        .read_exact(&mut magic)
        .map_err(|_| CaptureError::UnknownFormat(magic))?;
    let mut n = 0;
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => {
            let mut r = PcapNgReader::new(bytes)
                .map_err(|source| CaptureError::Damaged { frames: 0, source })?;
            let mut links: Vec<DataLink> = Vec::new();
            while let Some(block) = r.next_block() {
                let block = block.map_err(|source| CaptureError::Damaged { frames: n, source })?;
                let (iface, time, data) = match block {
                    Block::EnhancedPacket(p) => (p.interface_id as usize, p.timestamp, p.data),
                    Block::SimplePacket(p) => (0, Duration::ZERO, p.data),
                    Block::Packet(p) => (
                        usize::from(p.interface_id),
                        Duration::from_micros(p.timestamp),
                        p.data,
                    ),
                    Block::SectionHeader(_) => {
                        links.clear();
                        continue;
                    }
                    Block::InterfaceDescription(i) => {
                        links.push(i.linktype);
                        continue;
                    }
                    _ => continue,
                };
                let link = links.get(iface).copied().unwrap_or(DataLink::ETHERNET);
                n += 1;
                f(Frame {
                    number: n,
                    time,
                    link,
                    data,
                });
            }
        }
        [0xd4, 0xc3, 0xb2, 0xa1]
        | [0xa1, 0xb2, 0xc3, 0xd4]
        | [0x4d, 0x3c, 0xb2, 0xa1]
        | [0xa1, 0xb2, 0x3c, 0x4d] => {
            let mut r = PcapReader::new(bytes)
                .map_err(|source| CaptureError::Damaged { frames: 0, source })?;
            let link = r.header().datalink;
            while let Some(p) = r.next_packet() {
                let p = p.map_err(|source| CaptureError::Damaged { frames: n, source })?;
                n += 1;
                f(Frame {
                    number: n,
                    time: p.timestamp,
                    link,
                    data: p.data,
                });
            }
        }
        m => return Err(CaptureError::UnknownFormat(m)),
    }
    Ok(n)
}

/// A UDP datagram found in a frame, with the headers the ICRC covers.
#[derive(Debug, Clone, Copy)]
pub struct UdpFrame<'a> {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The IP header as captured (IPv4 with options, or the fixed IPv6 header).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The UDP payload, as long as the UDP length field says.
    pub payload: &'a [u8],
}

/// What a frame holds, as far as RoCEv2 cares.
#[derive(Debug, Clone)]
pub enum Classified<'a> {
    /// A UDP datagram to the RoCEv2 port.
    Udp(UdpFrame<'a>),
    /// Anything else (ARP, TCP, UDP to other ports, ...).
    Other,
    /// A frame that looks addressed to the RoCEv2 port but is cut short or malformed below UDP.
    Malformed(String),
}

/// Classify one frame: is it a UDP datagram to `port`?
pub fn classify(link: DataLink, data: &[u8], port: u16) -> Classified<'_> {
    let strict = match link {
        DataLink::ETHERNET => SlicedPacket::from_ethernet(data),
        DataLink::LINUX_SLL => SlicedPacket::from_linux_sll(data),
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => SlicedPacket::from_ip(data),
        DataLink::NULL | DataLink::LOOP if data.len() >= 4 => SlicedPacket::from_ip(&data[4..]),
        _ => return Classified::Other,
    };
    match strict {
        Ok(p) => {
            let (Some(net), Some(TransportSlice::Udp(udp))) = (p.net, p.transport) else {
                return Classified::Other;
            };
            if udp.destination_port() != port {
                return Classified::Other;
            }
            let (src, dst, ip_header) = match &net {
                NetSlice::Ipv4(v4) => {
                    if v4.is_payload_fragmented() {
                        return Classified::Malformed("fragmented IPv4 datagram".into());
                    }
                    let h = v4.header();
                    (
                        IpAddr::V4(h.source_addr()),
                        IpAddr::V4(h.destination_addr()),
                        within(data, h.slice()),
                    )
                }
                NetSlice::Ipv6(v6) => {
                    if !v6.extensions().is_empty() {
                        return Classified::Malformed("IPv6 extension headers before UDP".into());
                    }
                    let h = v6.header();
                    (
                        IpAddr::V6(h.source_addr()),
                        IpAddr::V6(h.destination_addr()),
                        within(data, h.slice()),
                    )
                }
            };
            Classified::Udp(UdpFrame {
                src,
                dst,
                src_port: udp.source_port(),
                dst_port: udp.destination_port(),
                ip_header,
                udp_header: udp.header_slice(),
                payload: udp.payload(),
            })
        }
        Err(e) => {
            // Look again leniently: only a frame that is UDP to our port counts as malformed.
            let lax = match link {
                DataLink::ETHERNET => LaxSlicedPacket::from_ethernet(data).ok(),
                DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => {
                    LaxSlicedPacket::from_ip(data).ok()
                }
                _ => None,
            };
            let udp_to_port = lax.and_then(|l| l.net).is_some_and(|n| {
                let pl = match &n {
                    LaxNetSlice::Ipv4(v4) => v4.payload(),
                    LaxNetSlice::Ipv6(v6) => v6.payload(),
                };
                pl.ip_number == etherparse::IpNumber::UDP
                    && pl.payload.len() >= 4
                    && u16::from_be_bytes([pl.payload[2], pl.payload[3]]) == port
            });
            if udp_to_port {
                Classified::Malformed(e.to_string())
            } else {
                Classified::Other
            }
        }
    }
}

/// Re-borrow `part`, a sub-slice of `whole`, with the lifetime of `whole`.
fn within<'a>(whole: &'a [u8], part: &[u8]) -> &'a [u8] {
    let off = (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize);
    whole.get(off..off + part.len()).unwrap_or(&[])
}

/// Write UDP datagrams as an Ethernet pcap: each item is (source, destination, source port,
/// destination port, IPv4 identification, UDP payload). IPv4 datagrams carry DF and TTL 64
/// and UDP checksum 0, as RoCEv2 senders do; IPv6 datagrams carry a UDP checksum.
pub fn write_pcap(datagrams: &[Datagram]) -> Result<Vec<u8>, CaptureError> {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let damaged = |source| CaptureError::Damaged { frames: 0, source };
    let mut w = PcapWriter::with_header(Vec::new(), header).map_err(damaged)?;
    for (i, d) in datagrams.iter().enumerate() {
        let frame = ethernet_frame(d)?;
        let ts = Duration::from_micros(i as u64);
        let pkt = PcapPacket::new(ts, frame.len() as u32, &frame);
        w.write_packet(&pkt).map_err(damaged)?;
    }
    Ok(w.into_writer())
}

/// A UDP datagram to be written into a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Source address (IPv4 with an IPv6 destination is written as IPv4-mapped IPv6).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// IPv4 identification.
    pub ip_id: u16,
    /// The UDP payload.
    pub payload: Vec<u8>,
}

fn ethernet_frame(d: &Datagram) -> Result<Vec<u8>, CaptureError> {
    use etherparse::{IpNumber, Ipv4Header, Ipv6Header, UdpHeader};
    let (src, dst, sport, dport, id, payload) = (
        d.src,
        d.dst,
        d.src_port,
        d.dst_port,
        d.ip_id,
        &d.payload[..],
    );
    let too_large = |_| CaptureError::TooLarge(payload.len());
    let udp_len = u16::try_from(8 + payload.len()).map_err(too_large)?;
    let mut f = Vec::with_capacity(14 + 40 + 8 + payload.len());
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1]);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = Ipv4Header::new(udp_len, 64, IpNumber::UDP, s.octets(), d.octets())
                .map_err(|_| CaptureError::TooLarge(payload.len()))?;
            ip.identification = id;
            ip.dont_fragment = true;
            ip.header_checksum = ip.calc_header_checksum();
            ip.write(&mut f)?;
            let udp = UdpHeader::without_ipv4_checksum(sport, dport, payload.len())
                .map_err(|_| CaptureError::TooLarge(payload.len()))?;
            udp.write(&mut f)?;
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
                IpAddr::V6(v) => v.octets(),
            };
            f.extend_from_slice(&0x86ddu16.to_be_bytes());
            let ip = Ipv6Header {
                traffic_class: 0,
                flow_label: Default::default(),
                payload_length: udp_len,
                next_header: IpNumber::UDP,
                hop_limit: 64,
                source: to6(s),
                destination: to6(d),
            };
            ip.write(&mut f)?;
            let udp = UdpHeader::with_ipv6_checksum(sport, dport, &ip, payload)
                .map_err(|_| CaptureError::TooLarge(payload.len()))?;
            udp.write(&mut f)?;
        }
    }
    f.extend_from_slice(payload);
    Ok(f)
}
