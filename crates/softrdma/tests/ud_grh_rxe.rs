//! The GRH area of a UD receive, byte for byte against what Linux rxe delivers for the same
//! datagram: rxe copies the received IP header into the area, so for every UD datagram of a
//! real rxe capture (`../shared/captures/rxe/rxe_ud_{pingpong,send_bw}.pcap`) the 40 bytes a softrdma UD
//! QP places in front of the payload must be 20 zero bytes and then that datagram's IPv4
//! header as captured. The identification, which a UDP socket does not see, comes from the
//! ICRC (as the engine finds it); TTL 64 and DSCP 0 are what rxe sends.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use softrdma::mem::{Access, AccessCtx, MemConfig, MemSource, MemoryAccess, MemoryTable, PinMode};
use softrdma::rc::{
    DatagramSource, GRH_LEN, Mtu, Qp, QpAttr, QpCap, QpInit, QpType, RecvWr, Sge, WcStatus,
};
use softrdma::wire::{IcrcContext, IcrcPrefix, IdDeltas, IpHeader, Opcode, Packet};

fn capture(name: &str) -> PathBuf {
    let dir = match std::env::var_os("SOFTRDMA_CAPTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures/rxe"),
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "capture {} not found (../shared/captures must sit beside the repository)",
        p.display()
    );
    p
}

/// A UD datagram of the capture: its IPv4 header bytes and UDP payload.
struct Datagram {
    ip: [u8; 20],
    src_port: u16,
    payload: Vec<u8>,
}

fn ud_datagrams(name: &str) -> Vec<Datagram> {
    let f = std::fs::File::open(capture(name)).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(f).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        let d = p.unwrap().data;
        // Ethernet II, IPv4 without options, UDP to 4791.
        if d.len() < 14 + 20 + 8 + 12 || d[12..14] != [0x08, 0x00] || d[14] != 0x45 {
            continue;
        }
        let ip: [u8; 20] = d[14..34].try_into().unwrap();
        let udp = &d[34..];
        if ip[9] != 17 || u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        let payload = udp[8..len.min(udp.len())].to_vec();
        if payload.first().is_some_and(|&op| op == 0x64 || op == 0x65) {
            v.push(Datagram {
                ip,
                src_port: u16::from_be_bytes([udp[0], udp[1]]),
                payload,
            });
        }
    }
    v
}

#[test]
fn grh_area_matches_the_ip_header_rxe_delivers() {
    for name in ["rxe_ud_pingpong.pcap", "rxe_ud_send_bw.pcap"] {
        check_capture(name);
    }
}

fn check_capture(name: &str) {
    let mut grams = ud_datagrams(name);
    assert!(
        grams.len() >= 10,
        "{name}: only {} UD datagrams",
        grams.len()
    );
    grams.truncate(300);
    let mut deltas = IdDeltas::default();
    let mut solved = 0;
    for (i, g) in grams.iter().enumerate() {
        let src = Ipv4Addr::from(<[u8; 4]>::try_from(&g.ip[12..16]).unwrap());
        let dst = Ipv4Addr::from(<[u8; 4]>::try_from(&g.ip[16..20]).unwrap());
        let base = IcrcPrefix::new(IcrcContext {
            ip: IpHeader::V4 {
                src,
                dst,
                id: 0,
                dont_fragment: true,
            },
            src_port: g.src_port,
            dst_port: 4791,
        });
        // The receive path's verification: the identification comes out of the ICRC.
        let (pkt, id, was_solved) =
            Packet::parse_verified_solving(&base, 0, &g.payload, &mut deltas)
                .unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        solved += usize::from(was_solved);
        assert_eq!(id, u16::from_be_bytes([g.ip[4], g.ip[5]]), "datagram {i}");
        assert!(matches!(
            pkt.hdr.bth.opcode,
            Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_IMM
        ));
        let deth = pkt.hdr.deth.expect("a DETH");

        // A UD QP with the captured destination QPN and Q_Key receives it.
        let mem = MemoryTable::new(MemConfig {
            pin_mode: PinMode::OnDemand,
            ..MemConfig::default()
        })
        .unwrap();
        let pd = mem.alloc_pd().unwrap();
        let mr = mem
            .reg_mr(
                pd,
                MemSource::owned(vec![0xeeu8; 8192]),
                Access::LOCAL_WRITE,
                None,
            )
            .unwrap();
        let mut qp = Qp::new(QpInit {
            qp_num: pkt.hdr.bth.dest_qp,
            pd,
            cap: QpCap::default(),
            srq: None,
            sq_sig_all: false,
            qp_type: QpType::Ud,
        })
        .unwrap();
        qp.set_port_mtu(Mtu::Mtu4096);
        qp.connect(&QpAttr {
            qkey: deth.qkey,
            ..QpAttr::default()
        })
        .unwrap();
        qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[Sge {
                addr: mr.iova,
                length: 8192,
                lkey: mr.lkey,
            }],
        })
        .unwrap();
        let from = DatagramSource {
            ip: IpHeader::V4 {
                src,
                dst,
                id,
                dont_fragment: true,
            },
            udp_payload_len: g.payload.len(),
        };
        qp.handle_packet_from(0, &pkt, Some(&from), &mem, None);
        let wc = qp.poll_completion().expect("a receive completion");
        assert_eq!(wc.status, WcStatus::Success, "datagram {i}");
        assert_eq!(wc.grh, Some(softrdma::rc::NetworkHdr::Ipv4));
        assert_eq!(wc.src_qp, deth.src_qp);
        assert_eq!(wc.byte_len as usize, GRH_LEN + pkt.payload.len());
        let mut area = vec![0u8; GRH_LEN + pkt.payload.len()];
        mem.read(
            AccessCtx { pd, qpn: 0 },
            mr.lkey,
            mr.iova,
            &mut area,
            Access::NONE,
        )
        .unwrap();
        assert_eq!(&area[..20], &[0u8; 20], "datagram {i}: reserved bytes");
        assert_eq!(
            &area[20..GRH_LEN],
            &g.ip,
            "datagram {i}: the IPv4 header rxe would deliver"
        );
        assert_eq!(&area[GRH_LEN..], pkt.payload, "datagram {i}: payload");
    }
    // rxe numbers its datagrams: their identifications were found from the ICRC.
    assert!(solved > 0);
    println!(
        "{name}: {} UD datagrams, {solved} identifications solved",
        grams.len()
    );
}
