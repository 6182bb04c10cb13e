//! The CM MADs of a real rping between two Linux rxe hosts
//! (`../shared/captures/rxe/rxe_rping.pcap`: REQ, REP, RTU, DREQ, DREP to and from QP1),
//! parsed with `wire::cm` and emitted back byte for byte; the fields that tie the messages
//! together (communication IDs, QPNs, service ID, the rdma_cm IP header) checked.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use softrdma::wire::cm::{CmMad, CmMessage};
use softrdma::wire::cma::{CmaHdr, PortSpace};
use softrdma::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use softrdma::wire::{Opcode, Packet};

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

/// The UDP payloads (RoCEv2) of the capture, with their IPv4 source and destination.
fn roce_payloads(name: &str) -> Vec<(Ipv4Addr, Ipv4Addr, Vec<u8>)> {
    let f = std::fs::File::open(capture(name)).unwrap();
    let mut r = pcap_file::pcap::PcapReader::new(f).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        let d = p.unwrap().data;
        if d.len() < 14 + 20 + 8 + 12 || d[12..14] != [0x08, 0x00] || d[14] != 0x45 || d[23] != 17 {
            continue;
        }
        let udp = &d[34..];
        if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
        let src = Ipv4Addr::new(d[26], d[27], d[28], d[29]);
        let dst = Ipv4Addr::new(d[30], d[31], d[32], d[33]);
        v.push((src, dst, udp[8..len.min(udp.len())].to_vec()));
    }
    v
}

fn mapped(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

#[test]
fn rping_cm_mads_parse_and_emit_byte_for_byte() {
    let mut mads = Vec::new();
    for (src, dst, payload) in roce_payloads("rxe_rping.pcap") {
        let p = Packet::parse(&payload).unwrap();
        if p.hdr.bth.dest_qp != GSI_QPN {
            continue;
        }
        assert_eq!(p.hdr.bth.opcode, Opcode::UD_SEND_ONLY);
        let deth = p.hdr.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qp), (GSI_QKEY, GSI_QPN));
        assert_eq!(p.payload.len(), MAD_LEN);
        let mad = CmMad::parse(p.payload).unwrap();
        let mut out = [0u8; MAD_LEN];
        assert_eq!(mad.emit(&mut out).unwrap(), MAD_LEN);
        assert_eq!(&out[..], p.payload, "{:?} re-emitted", mad.msg.attr_id());
        mads.push((src, dst, mad));
    }
    let kinds: Vec<_> = mads.iter().map(|(_, _, m)| m.msg.attr_id()).collect();
    assert_eq!(
        kinds,
        [0x10, 0x13, 0x14, 0x15, 0x16],
        "REQ REP RTU DREQ DREP"
    );

    let (client, server) = (mads[0].0, mads[0].1);
    let CmMessage::Req(req) = &mads[0].2.msg else {
        unreachable!()
    };
    let CmMessage::Rep(rep) = &mads[1].2.msg else {
        unreachable!()
    };
    // The REQ: rping's TCP port space and port, the client's QP, the path as IPv4-mapped GIDs.
    let (ps, port) = PortSpace::of_service_id(req.service_id).unwrap();
    assert_eq!((ps, port), (PortSpace::Tcp, 0x485d));
    assert_eq!(req.primary.local_gid, mapped(client));
    assert_eq!(req.primary.remote_gid, mapped(server));
    assert_eq!((req.primary.local_lid, req.pkey), (0xffff, 0xffff));
    assert_eq!(req.transport, 0, "RC");
    let hdr = CmaHdr::parse(&req.private_data).unwrap();
    assert_eq!(hdr.src, IpAddr::V4(client));
    assert_eq!(hdr.dst, IpAddr::V4(server));
    // The REP answers it from the server; RTU, DREQ, DREP name both IDs.
    assert_eq!(mads[1].0, server);
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(mads[1].2.tid, mads[0].2.tid, "a REP carries its REQ's TID");
    for (_, _, m) in &mads[2..] {
        let ids = (m.msg.local_comm_id(), m.msg.remote_comm_id());
        assert!(
            ids == (req.local_comm_id, rep.local_comm_id)
                || ids == (rep.local_comm_id, req.local_comm_id),
            "{ids:?}"
        );
    }
    let CmMessage::Dreq(dreq) = &mads[3].2.msg else {
        unreachable!()
    };
    let dreq_from_client = mads[3].0 == client;
    let peer_qpn = if dreq_from_client {
        rep.local_qpn
    } else {
        req.local_qpn
    };
    assert_eq!(dreq.remote_qpn, peer_qpn);
}
