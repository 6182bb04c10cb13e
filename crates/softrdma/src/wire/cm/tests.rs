use super::*;

fn req() -> Req {
    Req {
        local_comm_id: 0x58e5_4a84,
        service_id: 0x0106_485d,
        local_ca_guid: 0x5054_00ff_fe77_0003,
        local_qkey: 0,
        local_qpn: 0x26,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport: 0,
        e2e_flow_control: false,
        starting_psn: 0x07948e,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        ext_transport: 0,
        primary: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            flow_label: 0x6b3,
            packet_rate: 0x2b,
            hop_limit: 64,
            local_ack_timeout: 19,
            ..CmPath::default()
        },
        alternate: CmPath::default(),
        private_data: vec![7; 92],
    }
}

#[test]
fn every_message_round_trips() {
    let msgs = [
        CmMessage::Req(Box::new(req())),
        CmMessage::Mra(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message: MsgRef::Rep,
            service_timeout: 31,
            private_data: vec![1; 222],
        }),
        CmMessage::Rej(Box::new(Rej {
            local_comm_id: 3,
            remote_comm_id: 4,
            message: MsgRef::Req,
            ari_len: 0,
            reason: rej_reason::CONSUMER_DEFINED,
            ari: [0; 72],
            private_data: vec![2; 148],
        })),
        CmMessage::Rep(Rep {
            local_comm_id: 5,
            remote_comm_id: 6,
            local_qkey: 0,
            local_qpn: 0xabcdef,
            local_eecn: 0,
            starting_psn: 0x123456,
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: 15,
            failover_accepted: 3,
            e2e_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 42,
            private_data: vec![3; 196],
        }),
        CmMessage::Rtu(Ids {
            local_comm_id: 7,
            remote_comm_id: 8,
            private_data: vec![4; 224],
        }),
        CmMessage::Dreq(Dreq {
            local_comm_id: 9,
            remote_comm_id: 10,
            remote_qpn: 0x26,
            private_data: vec![5; 220],
        }),
        CmMessage::Drep(Ids {
            local_comm_id: 11,
            remote_comm_id: 12,
            private_data: vec![6; 224],
        }),
        CmMessage::SidrReq(Box::new(SidrReq {
            request_id: 13,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_4a2b,
            private_data: vec![7; 216],
        })),
        CmMessage::SidrRep(Box::new(SidrRep {
            request_id: 14,
            status: sidr_status::SUCCESS,
            info_len: 72,
            qpn: 0xfedcba,
            service_id: 0x0000_0000_0111_4a2b,
            qkey: 0x0123_4567,
            info: [8; 72],
            private_data: vec![9; 136],
        })),
    ];
    for m in msgs {
        let mut b = [0xaau8; MAD_DATA_LEN];
        m.emit(&mut b).unwrap();
        let info = attr_info(m.attr_id()).unwrap();
        assert!(info.supported, "{}", info.name);
        assert_eq!(
            CmMessage::parse(m.attr_id(), &b).unwrap(),
            m,
            "{}",
            info.name
        );
    }
}

#[test]
fn short_private_data_is_padded_and_long_refused() {
    let mut m = req();
    m.private_data = vec![9; 3];
    let mut b = [0xaau8; MAD_DATA_LEN];
    CmMessage::Req(Box::new(m.clone())).emit(&mut b).unwrap();
    assert_eq!(&b[140..143], &[9, 9, 9]);
    assert!(b[143..].iter().all(|&x| x == 0));
    m.private_data = vec![9; 93];
    assert_eq!(
        CmMessage::Req(Box::new(m)).emit(&mut b),
        Err(Error::FieldRange("private_data"))
    );
}

#[test]
fn out_of_range_fields_and_bad_input_are_refused() {
    let mut m = req();
    m.local_qpn = 1 << 24;
    let mut b = [0u8; MAD_DATA_LEN];
    assert_eq!(
        CmMessage::Req(Box::new(m)).emit(&mut b),
        Err(Error::FieldRange("local_qpn"))
    );
    assert!(matches!(
        CmMessage::parse(attr::REQ, &b[..231]),
        Err(Error::Truncated { .. })
    ));
    assert_eq!(
        CmMessage::parse(attr::LAP, &b),
        Err(Error::BadMad("unsupported CM attribute"))
    );
    // A SIDR_REP whose info length is past the info.
    b[5] = 73;
    assert_eq!(
        CmMessage::parse(attr::SIDR_REP, &b),
        Err(Error::BadMad("SIDR_REP info length"))
    );
    b[5] = 0;
    b[8] = 3 << 6;
    assert_eq!(
        CmMessage::parse(attr::MRA, &b),
        Err(Error::BadMad("message reference"))
    );
    // A REJ whose ARI length is past the ARI.
    b[8] = 0;
    b[9] = 73 << 1;
    assert_eq!(
        CmMessage::parse(attr::REJ, &b),
        Err(Error::BadMad("REJ ARI length"))
    );
}

#[test]
fn the_table_covers_the_class_data() {
    for a in ATTRS {
        assert_eq!(a.private_at + a.private_len, MAD_DATA_LEN, "{}", a.name);
    }
    assert!(ATTRS.windows(2).all(|w| w[0].id < w[1].id));
}
