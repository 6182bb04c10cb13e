//! UD and UC queue pairs between two devices over real UDP sockets on loopback: datagrams
//! with their GRH area, Q_Key rules, address handles from a received GRH, oversize posts,
//! receive-queue exhaustion; UC SEND and WRITE with immediate.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use softrdma::verbs::*;

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(ip: [u8; 4], port: u16, mode: PollMode, t: QpType) -> Side {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = port;
    cfg.mode = mode;
    cfg.pin_mode = PinMode::OnDemand;
    cfg.active_mtu = Mtu::Mtu1024;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256, None).unwrap();
    let attr = QpInitAttr::new(&cq).with_type(t);
    let qp = pd.create_qp(&attr).unwrap();
    Side { dev, pd, cq, qp }
}

fn one(cq: &Cq) -> WorkCompletion {
    let v = cq.wait(1, Duration::from_secs(10));
    assert_eq!(v.len(), 1, "no completion within 10 s");
    v[0]
}

fn none_within(cq: &Cq, ms: u64) {
    let v = cq.wait(1, Duration::from_millis(ms));
    assert!(v.is_empty(), "unexpected completion {v:?}");
}

const QKEY: u32 = 0x1111_2222;

#[test]
fn ud_datagrams_carry_the_grh_area_and_obey_the_q_key() {
    for (mode, port) in [(PollMode::Blocking, 25791), (PollMode::BusyPoll, 25792)] {
        let a = side([127, 0, 0, 1], port, mode, QpType::Ud);
        let b = side([127, 0, 0, 2], port, mode, QpType::Ud);
        a.qp.ready_ud(QKEY, random_psn()).unwrap();
        b.qp.ready_ud(QKEY, random_psn()).unwrap();
        let rbuf =
            b.pd.reg_buffer(vec![0u8; 4096], Access::LOCAL_WRITE)
                .unwrap();
        for i in 0..4u64 {
            b.qp.post_recv(&RecvWr {
                wr_id: 100 + i,
                sg_list: &[rbuf.sge(i * 1024, 1024)],
            })
            .unwrap();
        }
        let payload: Vec<u8> = (0..900).map(|i| (i * 7 % 253) as u8).collect();
        let smr =
            a.pd.reg_buffer(payload.clone(), Access::LOCAL_WRITE)
                .unwrap();
        let ah = Ah::new(&a.pd, b.dev.addr());
        let sge = [smr.sge(0, 900)];
        // Right Q_Key, with immediate.
        let wr = SendWr::new(1, WrOpcode::SendWithImm { imm: 0x55 })
            .sg(&sge)
            .ud(ah.dest(b.qp.qp_num(), QKEY));
        a.qp.post_send(&wr).unwrap();
        let s = one(&a.cq);
        assert_eq!((s.wr_id, s.status), (1, WcStatus::Success));
        let r = one(&b.cq);
        assert_eq!(
            (r.wr_id, r.status, r.byte_len, r.imm_data, r.src_qp, r.grh),
            (
                100,
                WcStatus::Success,
                (GRH_LEN + 900) as u32,
                Some(0x55),
                a.qp.qp_num(),
                Some(softrdma::verbs::NetworkHdr::Ipv4)
            )
        );
        let got = rbuf.to_vec().unwrap();
        assert_eq!(&got[GRH_LEN..GRH_LEN + 900], &payload[..]);
        let grh: [u8; GRH_LEN] = got[..GRH_LEN].try_into().unwrap();
        assert!(grh[..20].iter().all(|&x| x == 0));
        assert_eq!(grh[20], 0x45, "IPv4 header in the last 20 bytes");
        assert_eq!(&grh[32..36], &[127, 0, 0, 1]);
        assert_eq!(&grh[36..40], &[127, 0, 0, 2]);
        // UDP length = 8 + BTH 12 + DETH 8 + ImmDt 4 + 900 + ICRC 4; IP adds 20.
        assert_eq!(
            u16::from_be_bytes([grh[22], grh[23]]),
            20 + 8 + 12 + 8 + 4 + 900 + 4
        );

        // A wrong Q_Key is dropped and counted; the receive stays posted.
        let wr = SendWr::new(2, WrOpcode::Send)
            .sg(&sge)
            .ud(ah.dest(b.qp.qp_num(), QKEY ^ 1));
        a.qp.post_send(&wr).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        none_within(&b.cq, 200);
        assert_eq!(b.qp.counters().unrel.qkey_drops, 1);

        // A Q_Key with the high bit set sends the QP's own (the same as b's here).
        let wr = SendWr::new(3, WrOpcode::Send)
            .sg(&sge[..])
            .ud(ah.dest(b.qp.qp_num(), 0x8000_0000));
        a.qp.post_send(&wr).unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
        let r = one(&b.cq);
        assert_eq!((r.wr_id, r.status), (101, WcStatus::Success));

        // The sender's address handle from the GRH area answers it.
        let back = Ah::from_grh(&b.pd, &grh).expect("an IPv4 GRH area");
        assert_eq!(back.remote().ip(), a.dev.addr());
        let rb =
            a.pd.reg_buffer(vec![0u8; 1024], Access::LOCAL_WRITE)
                .unwrap();
        a.qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: &[rb.sge(0, 1024)],
        })
        .unwrap();
        let reply =
            b.pd.reg_buffer(vec![0xabu8; 16], Access::LOCAL_WRITE)
                .unwrap();
        let sge2 = [reply.sge(0, 16)];
        b.qp.post_send(
            &SendWr::new(4, WrOpcode::Send)
                .sg(&sge2)
                .ud(back.dest(r.src_qp, QKEY)),
        )
        .unwrap();
        assert_eq!(one(&b.cq).wr_id, 4);
        let r = one(&a.cq);
        assert_eq!((r.wr_id, r.byte_len, r.src_qp), (9, 56, b.qp.qp_num()));
        println!("{mode:?}: {:?}", b.qp.counters().unrel);
    }
}

#[test]
fn ud_refuses_oversize_posts_and_drops_what_finds_no_receive() {
    let a = side([127, 0, 0, 1], 25793, PollMode::Blocking, QpType::Ud);
    let b = side([127, 0, 0, 2], 25793, PollMode::Blocking, QpType::Ud);
    a.qp.ready_ud(QKEY, 0).unwrap();
    b.qp.ready_ud(QKEY, 0).unwrap();
    let smr =
        a.pd.reg_buffer(vec![1u8; 2048], Access::LOCAL_WRITE)
            .unwrap();
    let ah = Ah::new(&a.pd, b.dev.addr());
    // One byte over the MTU (1024): refused at post time, nothing queued.
    let big = [smr.sge(0, 1025)];
    let e =
        a.qp.post_send(
            &SendWr::new(1, WrOpcode::Send)
                .sg(&big)
                .ud(ah.dest(b.qp.qp_num(), QKEY)),
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // No destination on a UD QP: refused.
    let ok = [smr.sge(0, 1024)];
    assert!(
        a.qp.post_send(&SendWr::new(2, WrOpcode::Send).sg(&ok))
            .is_err()
    );
    // READ on UD: refused.
    let rd = SendWr::new(
        3,
        WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        },
    )
    .sg(&ok)
    .ud(ah.dest(b.qp.qp_num(), QKEY));
    assert!(a.qp.post_send(&rd).is_err());
    // An MTU-sized datagram with no receive posted: dropped and counted, never RNR.
    for i in 0..3 {
        a.qp.post_send(
            &SendWr::new(10 + i, WrOpcode::Send)
                .sg(&ok)
                .ud(ah.dest(b.qp.qp_num(), QKEY)),
        )
        .unwrap();
        assert_eq!(one(&a.cq).status, WcStatus::Success);
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.qp.counters().unrel.no_recv_drops, 3);
    // MTU-sized payloads from a registered buffer are lent to the socket, not copied.
    assert_eq!(a.dev.counters().tx_zero_copy.load(Ordering::Relaxed), 3);
    // A receive too short for GRH + payload: the datagram is dropped, the receive kept.
    let rbuf =
        b.pd.reg_buffer(vec![0u8; 2048], Access::LOCAL_WRITE)
            .unwrap();
    b.qp.post_recv(&RecvWr {
        wr_id: 50,
        sg_list: &[rbuf.sge(0, 1024)],
    })
    .unwrap();
    a.qp.post_send(
        &SendWr::new(20, WrOpcode::Send)
            .sg(&ok)
            .ud(ah.dest(b.qp.qp_num(), QKEY)),
    )
    .unwrap();
    none_within(&b.cq, 200);
    assert_eq!(b.qp.counters().unrel.len_drops, 1);
    let small = [smr.sge(0, 100)];
    a.qp.post_send(
        &SendWr::new(21, WrOpcode::Send)
            .sg(&small)
            .ud(ah.dest(b.qp.qp_num(), QKEY)),
    )
    .unwrap();
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.byte_len), (50, 140));
    assert_eq!(
        b.dev.counters().rx_wrong_peer.load(Ordering::Relaxed),
        0,
        "UD takes datagrams from any sender"
    );
}

#[test]
fn uc_send_and_write_with_immediate() {
    for (mode, port) in [(PollMode::Blocking, 25794), (PollMode::BusyPoll, 25795)] {
        let a = side([127, 0, 0, 1], port, mode, QpType::Uc);
        let b = side([127, 0, 0, 2], port, mode, QpType::Uc);
        let (pa, pb) = (random_psn(), random_psn());
        let mut attr = QpAttr {
            path_mtu: Mtu::Mtu1024,
            qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            ..QpAttr::default()
        };
        attr.dest_qp_num = b.qp.qp_num();
        attr.sq_psn = pa;
        attr.rq_psn = pb;
        a.qp.connect(b.dev.addr(), &attr).unwrap();
        attr.dest_qp_num = a.qp.qp_num();
        attr.sq_psn = pb;
        attr.rq_psn = pa;
        b.qp.connect(a.dev.addr(), &attr).unwrap();

        let len = 50_000usize;
        let src: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        let smr = a.pd.reg_buffer(src.clone(), Access::LOCAL_WRITE).unwrap();
        let dmr =
            b.pd.reg_buffer(vec![0u8; len], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
        let rbuf =
            b.pd.reg_buffer(vec![0u8; len], Access::LOCAL_WRITE)
                .unwrap();
        for i in 0..2 {
            b.qp.post_recv(&RecvWr {
                wr_id: 70 + i,
                sg_list: &[rbuf.sge(0, len as u32)],
            })
            .unwrap();
        }
        let sge = [smr.sge(0, len as u32)];
        a.qp.post_send(
            &SendWr::new(
                1,
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: dmr.iova(),
                    rkey: dmr.rkey(),
                    imm: 7,
                },
            )
            .sg(&sge),
        )
        .unwrap();
        a.qp.post_send(&SendWr::new(2, WrOpcode::Send).sg(&sge))
            .unwrap();
        assert_eq!(one(&a.cq).wr_id, 1);
        assert_eq!(one(&a.cq).wr_id, 2);
        let r = one(&b.cq);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len, r.imm_data),
            (70, WcOpcode::RecvRdmaWithImm, len as u32, Some(7))
        );
        assert_eq!(dmr.to_vec().unwrap(), src);
        let r = one(&b.cq);
        assert_eq!(
            (r.wr_id, r.opcode, r.byte_len),
            (71, WcOpcode::Recv, len as u32)
        );
        assert_eq!(rbuf.to_vec().unwrap(), src);
        // The payloads left the registered buffer without a copy into the transmit buffer.
        assert!(a.dev.counters().tx_zero_copy.load(Ordering::Relaxed) >= 2 * 48);
        // READ does not exist on UC.
        let rd = SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote_addr: dmr.iova(),
                rkey: dmr.rkey(),
            },
        )
        .sg(&sge);
        assert!(a.qp.post_send(&rd).is_err());
    }
}
