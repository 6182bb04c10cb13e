//! A client that asks for huge READ response streams cannot stall the other connections of
//! the device that answers them: the engine sends each QP's answers a budget at a time,
//! round-robin with receiving and with the device's other QPs.
//!
//! On one pair of devices a hostile QP posts 16 READs of 128 MiB each (2 GiB of responses,
//! the most its responder accepts outstanding) while a bystander QP on the same devices runs
//! a ping-pong of 8-byte WRITEs, each waiting for its completion (the peer's ACK). The
//! bystander's round trips must stay short and it must never exhaust its retries; the READs
//! must then complete with their data.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrdma::verbs::*;

const READ_LEN: usize = 128 << 20;
const READS: u64 = 16;

struct Dev {
    dev: Device,
    pd: Pd,
    cq: Cq,
}

fn dev(ip: [u8; 4], port: u16, mode: PollMode) -> Dev {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = port;
    cfg.mode = mode;
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256, None).unwrap();
    Dev { dev, pd, cq }
}

/// A connected QP pair between `a` and `b`, on CQs of its own; `timeout` is the requester's
/// local ACK timeout code.
fn qp_pair(a: &Dev, b: &Dev, timeout: u8) -> (Qp, Cq, Qp, Cq) {
    let (cqa, cqb) = (
        a.dev.create_cq(64, None).unwrap(),
        b.dev.create_cq(64, None).unwrap(),
    );
    let qa = a.pd.create_qp(&QpInitAttr::new(&cqa)).unwrap();
    let qb = b.pd.create_qp(&QpInitAttr::new(&cqb)).unwrap();
    let (pa, pb) = (random_psn(), random_psn());
    let mut attr = QpAttr {
        path_mtu: Mtu::Mtu4096,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        max_rd_atomic: READS as u8,
        max_dest_rd_atomic: READS as u8,
        timeout,
        ..QpAttr::default()
    };
    attr.dest_qp_num = qb.qp_num();
    attr.sq_psn = pa;
    attr.rq_psn = pb;
    qa.connect(b.dev.addr(), &attr).unwrap();
    attr.dest_qp_num = qa.qp_num();
    attr.sq_psn = pb;
    attr.rq_psn = pa;
    qb.connect(a.dev.addr(), &attr).unwrap();
    (qa, cqa, qb, cqb)
}

/// The two tests take turns: each moves a GiB through loopback on a small machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn hostile_reads_leave_bystanders_responsive(port: u16, mode: PollMode) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let a = dev([127, 0, 3, 1], port, mode);
    let b = dev([127, 0, 3, 2], port, mode);
    let _ = (&a.cq, &b.cq);
    // The hostile pair: a reads from b.
    let (ha, hcq, _hb, _hcqb) = qp_pair(&a, &b, 14);
    // The bystander pair: a writes 8 bytes to b and waits for the ACK. Its timeout is
    // 4.096 us x 2^12 = 16.8 ms; seven retries span about 134 ms.
    let (ya, ycq, _yb, _ycqb) = qp_pair(&a, &b, 12);

    let src: Vec<u8> = (0..READ_LEN).map(|i| (i * 7 + i / 4093) as u8).collect();
    let want = src.clone();
    let src = b.pd.reg_buffer(src, Access::REMOTE_READ).unwrap();
    let dst =
        a.pd.reg_buffer(vec![0u8; READ_LEN], Access::LOCAL_WRITE)
            .unwrap();
    let ping = a.pd.reg_buffer(vec![1u8; 8], Access::LOCAL_WRITE).unwrap();
    let pong =
        b.pd.reg_buffer(vec![0u8; 8], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();

    // One bystander round trip before the storm (it warms both paths).
    let write = |id: u64| -> (Duration, WorkCompletion) {
        let sge = [ping.sge(0, 8)];
        let wr = SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: pong.iova(),
                rkey: pong.rkey(),
            },
        )
        .sg(&sge);
        let t = Instant::now();
        ya.post_send(&wr).unwrap();
        let v = ycq.wait(1, Duration::from_secs(5));
        assert_eq!(v.len(), 1, "{mode:?}: no bystander completion within 5 s");
        (t.elapsed(), v[0])
    };
    let (_, wc) = write(0);
    assert_eq!(wc.status, WcStatus::Success);

    // Every READ reads the whole source into the same destination.
    let sge = [dst.sge(0, READ_LEN as u32)];
    for i in 0..READS {
        let wr = SendWr::new(
            100 + i,
            WrOpcode::RdmaRead {
                remote_addr: src.iova(),
                rkey: src.rkey(),
            },
        )
        .sg(&sge);
        ha.post_send(&wr).unwrap();
    }
    let t0 = Instant::now();
    let mut reads = Vec::new();
    let mut rtts = Vec::new();
    // The bystander pings while the READs are answered (bounded in count and in time).
    for id in 1..=50_000u64 {
        let (rtt, wc) = write(id);
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "{mode:?}: bystander WRITE {id} failed after {:?} (round trips so far: max {:?})",
            t0.elapsed(),
            rtts.iter().max()
        );
        rtts.push(rtt);
        let mut wcs = [EMPTY_WC; 16];
        let k = hcq.poll(&mut wcs);
        reads.extend_from_slice(&wcs[..k]);
        if reads.len() as u64 == READS || t0.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    let elapsed = t0.elapsed();
    reads.extend(hcq.wait(
        (READS as usize).saturating_sub(reads.len()),
        Duration::from_secs(10),
    ));
    rtts.sort();
    let p = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    let (p50, p99, max) = (p(0.5), p(0.99), *rtts.last().unwrap());
    eprintln!(
        "{mode:?}: {} bystander round trips during {elapsed:?} of READs: p50 {p50:?} \
         p99 {p99:?} max {max:?}; retransmits: bystander {}, READs {}",
        rtts.len(),
        ya.counters().comp.retransmits,
        ha.counters().comp.retransmits,
    );
    assert_eq!(reads.len() as u64, READS, "{mode:?}: READs completed");
    for w in &reads {
        assert_eq!(w.status, WcStatus::Success, "{mode:?}: READ {w:?}");
    }
    assert!(dst.to_vec().unwrap() == want, "{mode:?}: READ data");
    assert!(
        rtts.len() >= 10,
        "{mode:?}: only {} bystander round trips while the READs ran",
        rtts.len()
    );
    // Round trips queue behind up to a socket buffer (8 MiB) of READ responses at the
    // client, and an ACK lost to that full buffer costs a 16.8 ms timeout; one READ's stream
    // built in one pass (150 ms and more) stalled them past the seven retries, which the
    // status check above refuses. The single slowest round trip is not bounded tightly: a
    // container's CPU quota can take the whole process off the CPU for a 100 ms period
    // (seen in CI: one round trip of 131 ms with no retransmission, p99 273 us). At most 1 %
    // of them may wait for a timeout.
    let slow = rtts
        .iter()
        .filter(|r| **r > Duration::from_micros(16_800))
        .count();
    assert!(
        p99 < Duration::from_millis(25) && slow * 100 <= rtts.len() && max < Duration::from_secs(1),
        "{mode:?}: bystander round trips p99 {p99:?} max {max:?}, {slow} of {} above 16.8 ms",
        rtts.len()
    );
}

#[test]
fn hostile_reads_leave_bystanders_responsive_blocking() {
    hostile_reads_leave_bystanders_responsive(24891, PollMode::Blocking);
}

#[test]
fn hostile_reads_leave_bystanders_responsive_busy_poll() {
    hostile_reads_leave_bystanders_responsive(24892, PollMode::BusyPoll);
}
