//! Seed 001: "completing a receive work request represents a guarantee to the consumer that
//! the prior writes have been updated in its buffer" — checked on the real engine while the
//! network loses packets.
//!
//! In a network namespace of its own (see `support::netns`), nftables drops 5 % of the RoCEv2
//! datagrams delivered on `lo` (`numgen random`; a GSO datagram carries up to 64 KiB, so whole
//! bursts go). A requester posts, 160 times, a 64 KiB RDMA WRITE into its own slot of the
//! responder's region followed by a SEND naming that slot. Each time a receive completes, the
//! responder checks at once that every slot up to the one it names holds its WRITE's bytes.
//! The run must have lost packets (the requester retransmitted), and everything completes in
//! order with success. Blocking and busy-poll engines both.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use softrdma::verbs::*;

const ROLE: &str = "SOFTRDMA_LOSS_CHILD";
const TEST: &str = "a_receive_completion_finds_every_earlier_write_placed_under_loss";
const A: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 21);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 22);
const SLOT: usize = 64 << 10;
const MSGS: usize = 160;

#[test]
fn a_receive_completion_finds_every_earlier_write_placed_under_loss() {
    if std::env::var_os(ROLE).is_some() {
        inside_namespace();
        return;
    }
    if let Some(log) = support::netns::run_in_netns(
        TEST,
        ROLE,
        "dropping packets needs a network namespace and nft (Debian package nftables)",
    ) {
        assert!(log.contains("LOSS-DONE Blocking") && log.contains("LOSS-DONE BusyPoll"));
    }
}

fn nft(args: &[&str]) -> Result<(), String> {
    let out = Command::new("nft")
        .args(args)
        .output()
        .map_err(|e| format!("nft: {e} (install the Debian package nftables)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn inside_namespace() {
    let setup = || -> Result<(), String> {
        support::netns::lo_up().map_err(|e| e.to_string())?;
        nft(&["add", "table", "inet", "loss"])?;
        nft(&[
            "add",
            "chain",
            "inet",
            "loss",
            "input",
            "{ type filter hook input priority 0; }",
        ])?;
        nft(&[
            "add", "rule", "inet", "loss", "input", "udp", "dport", "4791", "numgen", "random",
            "mod", "100", "<", "5", "drop",
        ])
    };
    if let Err(e) = setup() {
        println!("NETNS-UNAVAILABLE {e}");
        return;
    }
    println!("NETNS-READY");
    for mode in [PollMode::Blocking, PollMode::BusyPoll] {
        run(mode);
        println!("LOSS-DONE {mode:?}");
    }
}

fn device(ip: Ipv4Addr, mode: PollMode) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::V4(ip));
    cfg.mode = mode;
    cfg.pin_mode = PinMode::OnDemand;
    Device::open(cfg).unwrap()
}

fn pattern(slot: usize, i: usize) -> u8 {
    (slot * 31 + i / 97 + 1) as u8
}

fn run(mode: PollMode) {
    let t0 = Instant::now();
    let (da, db) = (device(A, mode), device(B, mode));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (
        da.create_cq(4 * MSGS as u32, None).unwrap(),
        db.create_cq(4 * MSGS as u32, None).unwrap(),
    );
    let cap = QpCap {
        max_send_wr: 2 * MSGS as u32,
        max_recv_wr: MSGS as u32,
        ..QpCap::default()
    };
    let mut ia = QpInitAttr::new(&ca);
    ia.cap = cap;
    let mut ib = QpInitAttr::new(&cb);
    ib.cap = cap;
    let (qa, qb) = (pa.create_qp(&ia).unwrap(), pb.create_qp(&ib).unwrap());
    let (sa, sb) = (random_psn(), random_psn());
    let mut attr = QpAttr {
        path_mtu: Mtu::Mtu4096,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        // 4.096 us x 2^10 = 4.2 ms: losses are recovered quickly.
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        ..QpAttr::default()
    };
    attr.dest_qp_num = qb.qp_num();
    attr.sq_psn = sa;
    attr.rq_psn = sb;
    qa.connect(IpAddr::V4(B), &attr).unwrap();
    attr.dest_qp_num = qa.qp_num();
    attr.sq_psn = sb;
    attr.rq_psn = sa;
    qb.connect(IpAddr::V4(A), &attr).unwrap();

    let src: Vec<u8> = (0..MSGS * SLOT).map(|i| pattern(i / SLOT, i)).collect();
    let want = src.clone();
    let src = pa.reg_buffer(src, Access::LOCAL_WRITE).unwrap();
    let names = pa
        .reg_buffer(
            (0..MSGS as u32)
                .flat_map(u32::to_le_bytes)
                .collect::<Vec<_>>(),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let dst = pb
        .reg_buffer(
            vec![0u8; MSGS * SLOT],
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let inbox = pb
        .reg_buffer(vec![0u8; 4 * MSGS], Access::LOCAL_WRITE)
        .unwrap();
    for i in 0..MSGS {
        let sge = [inbox.sge(4 * i as u64, 4)];
        qb.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: &sge,
        })
        .unwrap();
    }
    for i in 0..MSGS {
        let sge = [src.sge((i * SLOT) as u64, SLOT as u32)];
        let write = SendWr::new(
            2 * i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: dst.iova() + (i * SLOT) as u64,
                rkey: dst.rkey(),
            },
        )
        .sg(&sge);
        let sge2 = [names.sge(4 * i as u64, 4)];
        let send = SendWr::new(2 * i as u64 + 1, WrOpcode::Send)
            .sg(&sge2)
            .flags(SendFlags::SIGNALED);
        qa.post_send_list(&[write, send]).unwrap();
    }

    // The responder checks each slot as soon as a receive names it (or a later one).
    let mut checked = 0usize;
    let mut slot = vec![0u8; SLOT];
    let mut name = [0u8; 4];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut wcs = [EMPTY_WC; 16];
    let mut received = 0usize;
    while received < MSGS {
        assert!(
            Instant::now() < deadline,
            "{mode:?}: {received} of {MSGS} receives in 60 s"
        );
        let n = cb.poll(&mut wcs);
        for w in &wcs[..n] {
            assert_eq!(w.status, WcStatus::Success, "{mode:?}: {w:?}");
            assert_eq!(w.wr_id, received as u64, "{mode:?}: receives in order");
            inbox.read(4 * w.wr_id, &mut name).unwrap();
            let upto = u32::from_le_bytes(name) as usize;
            assert_eq!(upto, received, "{mode:?}: the SEND's payload");
            while checked <= upto {
                dst.read((checked * SLOT) as u64, &mut slot).unwrap();
                assert!(
                    slot[..] == want[checked * SLOT..(checked + 1) * SLOT],
                    "{mode:?}: receive {upto} completed before the WRITE into slot {checked} was \
                     placed"
                );
                checked += 1;
            }
            received += 1;
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    let done = ca.wait(MSGS, Duration::from_secs(30));
    assert_eq!(done.len(), MSGS, "{mode:?}: signaled SENDs completed");
    assert!(done.iter().all(|w| w.status == WcStatus::Success));
    let c = qa.counters().comp;
    println!(
        "{mode:?}: {MSGS} WRITE+SEND pairs in {:?}, {} retransmissions, {} NAK-sequence, \
         responder duplicates {}",
        t0.elapsed(),
        c.retransmits,
        c.seq_naks_received,
        qb.counters().resp.duplicates
    );
    assert!(
        c.retransmits > 0,
        "{mode:?}: no packet was lost, so the run proved nothing"
    );
}
