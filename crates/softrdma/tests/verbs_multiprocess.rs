//! The verbs API between separate OS processes on loopback addresses: every opcode, SRQ,
//! completion-channel wake-ups, inline data, immediate data, SEND with Invalidate, windows of
//! both types, a bad R_Key, and a peer killed with SIGKILL.
//!
//! Each test re-runs this test binary as a child process (the responder, selected by the
//! environment variable `SOFTRDMA_CHILD`); the two sides exchange QPN, PSN, keys and results
//! over TCP in lines of text (`support::pair`).

mod support;

use std::net::IpAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use softrdma::verbs::*;
use support::pair::{Link, TwoProcesses, finish};

const PROCS: TwoProcesses = TwoProcesses {
    env: "SOFTRDMA_CHILD",
    net: [127, 0, 1],
    port: 7000,
    attr: qp_attr,
};
const ALL: Access = Access(1 | 2 | 4 | 8 | 16);

struct Node {
    dev: Device,
    pd: Pd,
    cq: Cq,
    mr: Mr,
}

fn node(ip: IpAddr, mode: PollMode) -> Node {
    let mut cfg = DeviceConfig::new(ip);
    cfg.mode = mode;
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg).expect("open device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024, None).unwrap();
    let mr = pd.alloc_mr(1 << 20, ALL).unwrap();
    Node { dev, pd, cq, mr }
}

fn qp_attr(peer_qpn: u32, my_psn: u32, peer_psn: u32) -> QpAttr {
    QpAttr {
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qpn,
        sq_psn: my_psn,
        rq_psn: peer_psn,
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        timeout: 12,
        retry_cnt: 3,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    }
}

/// Parent side ([`TwoProcesses::parent`]), announcing `n`'s region.
fn parent(test: &str, pair: u8, n: &Node, qps: &[&Qp]) -> (Child, Link, Vec<u64>) {
    let mr = &n.mr;
    PROCS.parent(test, pair, qps, &[u64::from(mr.rkey()), mr.iova()])
}

fn one(cq: &Cq) -> WorkCompletion {
    let v = cq.wait(1, Duration::from_secs(20));
    assert_eq!(v.len(), 1, "no completion within 20 s");
    v[0]
}

fn ok(wc: WorkCompletion, id: u64) -> WorkCompletion {
    assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    wc
}

// ---------------------------------------------------------------------------------------------

/// WRITE, WRITE with immediate, READ, SEND, SEND with immediate, inline SEND, Compare&Swap and
/// Fetch&Add, with the data checked on both sides.
#[test]
fn every_opcode_between_processes() {
    const T: &str = "every_opcode_between_processes";
    const P: u8 = 1;
    if PROCS.is_child(T) {
        let n = node(PROCS.addr(P, true), PollMode::Blocking);
        let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
        n.mr.write(0, &42u64.to_ne_bytes()).unwrap();
        let (mut l, _) = PROCS.child(P, &[&qp], &[n.mr.rkey() as u64, n.mr.iova()]);
        // Receives are posted once the QP is connected (a QP in RESET refuses them); the
        // requester's early SENDs meet RNR NAKs and are retried (rnr_retry 7).
        for i in 0..4 {
            qp.post_recv(&RecvWr {
                wr_id: 100 + i,
                sg_list: &[n.mr.sge(4096 * (i + 1), 4096)],
            })
            .unwrap();
        }
        // WRITE with immediate, SEND, SEND with immediate, inline SEND: four receives.
        let wcs: Vec<WorkCompletion> = (0..4).map(|_| one(&n.cq)).collect();
        let desc: Vec<String> = wcs
            .iter()
            .map(|w| {
                format!(
                    "{}:{:?}:{}:{}",
                    w.wr_id,
                    w.opcode,
                    w.byte_len,
                    w.imm_data.unwrap_or(0)
                )
            })
            .collect();
        l.send(&desc.join(" "));
        l.recv(); // parent done with atomics and READ
        let mut v = [0u8; 8];
        n.mr.read(0, &mut v).unwrap();
        let mut w = vec![0u8; 3000];
        n.mr.read(65536, &mut w).unwrap();
        let ok = w.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8);
        let mut s1 = vec![0u8; 5];
        n.mr.read(8192, &mut s1).unwrap();
        l.send(&format!(
            "{} {} {}",
            u64::from_ne_bytes(v),
            ok,
            String::from_utf8_lossy(&s1)
        ));
        return;
    }
    let n = node(PROCS.addr(P, false), PollMode::BusyPoll);
    let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
    let (child, mut l, peer) = parent(T, P, &n, &[&qp]);
    let (rkey, base) = (peer[0] as u32, peer[1]);
    let pattern: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
    n.mr.write(0, &pattern).unwrap();
    // RDMA WRITE (3 packets at MTU 1024) then WRITE with immediate (consumes receive 100).
    qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: base + 65536,
                rkey,
            },
        )
        .sg(&[n.mr.sge(0, 3000)]),
    )
    .unwrap();
    ok(one(&n.cq), 1);
    qp.post_send(
        &SendWr::new(
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: base + 70000,
                rkey,
                imm: 7,
            },
        )
        .sg(&[n.mr.sge(0, 16)]),
    )
    .unwrap();
    ok(one(&n.cq), 2);
    n.mr.write(200_000, b"hello").unwrap();
    qp.post_send(&SendWr::new(3, WrOpcode::Send).sg(&[n.mr.sge(200_000, 5)]))
        .unwrap();
    ok(one(&n.cq), 3);
    qp.post_send(&SendWr::new(4, WrOpcode::SendWithImm { imm: 0x1234 }).sg(&[n.mr.sge(0, 100)]))
        .unwrap();
    ok(one(&n.cq), 4);
    qp.post_send(
        &SendWr::new(5, WrOpcode::Send)
            .inline(b"inline!")
            .flags(SendFlags::SIGNALED | SendFlags::INLINE),
    )
    .unwrap();
    ok(one(&n.cq), 5);
    let recvs = l.recv();
    assert_eq!(
        recvs, "100:RecvRdmaWithImm:16:7 101:Recv:5:0 102:Recv:100:4660 103:Recv:7:0",
        "receive completions at the responder"
    );
    // Atomics on the responder's first 8 bytes (42): CAS 42 -> 50, then FADD 8 -> 58.
    qp.post_send(
        &SendWr::new(
            6,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: base,
                rkey,
                compare: 42,
                swap: 50,
            },
        )
        .sg(&[n.mr.sge(300_000, 8)]),
    )
    .unwrap();
    assert_eq!(ok(one(&n.cq), 6).opcode, WcOpcode::CompSwap);
    qp.post_send(
        &SendWr::new(
            7,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: base,
                rkey,
                add: 8,
            },
        )
        .sg(&[n.mr.sge(300_008, 8)]),
    )
    .unwrap();
    ok(one(&n.cq), 7);
    let mut got = [0u8; 16];
    n.mr.read(300_000, &mut got).unwrap();
    assert_eq!(
        u64::from_ne_bytes(got[..8].try_into().unwrap()),
        42,
        "CAS returns the original value"
    );
    assert_eq!(
        u64::from_ne_bytes(got[8..].try_into().unwrap()),
        50,
        "FADD returns the value before the add"
    );
    // READ back what we wrote.
    qp.post_send(
        &SendWr::new(
            8,
            WrOpcode::RdmaRead {
                remote_addr: base + 65536,
                rkey,
            },
        )
        .sg(&[n.mr.sge(400_000, 3000)]),
    )
    .unwrap();
    let w = ok(one(&n.cq), 8);
    assert_eq!((w.opcode, w.byte_len), (WcOpcode::RdmaRead, 3000));
    let mut back = vec![0u8; 3000];
    n.mr.read(400_000, &mut back).unwrap();
    assert_eq!(back, pattern);
    l.send("done");
    assert_eq!(
        l.recv(),
        "58 true hello",
        "responder memory after atomics, WRITE and SEND"
    );
    finish(child);
}

/// Two QPs of the responder take their receives from one SRQ; the responder sleeps on a
/// completion channel and is woken by each arrival.
#[test]
fn srq_and_completion_channel_wakeups() {
    const T: &str = "srq_and_completion_channel_wakeups";
    const P: u8 = 2;
    if PROCS.is_child(T) {
        let n = node(PROCS.addr(P, true), PollMode::Blocking);
        let ch = n.dev.create_comp_channel().unwrap();
        let cq = n.dev.create_cq(64, Some(&ch)).unwrap();
        let srq = n.pd.create_srq(16, 1).unwrap();
        let mut attr = QpInitAttr::new(&cq);
        attr.srq = Some(srq.clone());
        let q1 = n.pd.create_qp(&attr).unwrap();
        let q2 = n.pd.create_qp(&attr).unwrap();
        for i in 0..4u64 {
            srq.post_recv(&RecvWr {
                wr_id: i,
                sg_list: &[n.mr.sge(i * 256, 256)],
            })
            .unwrap();
        }
        let (mut l, _) = PROCS.child(P, &[&q1, &q2], &[]);
        let mut seen = Vec::new();
        let mut wakeups = 0;
        while seen.len() < 4 {
            cq.req_notify(false);
            let mut wc = [EMPTY_WC; 4];
            let k = cq.poll(&mut wc);
            if k == 0 {
                let ev = ch.get_event(Some(Duration::from_secs(20))).unwrap();
                assert_eq!(ev, Some(cq.id()), "channel woke for our CQ");
                wakeups += 1;
                continue;
            }
            for w in &wc[..k] {
                assert_eq!(w.status, WcStatus::Success);
                seen.push(format!(
                    "{}@{}",
                    w.byte_len,
                    if w.qp_num == q1.qp_num() { 1 } else { 2 }
                ));
            }
        }
        seen.sort();
        l.send(&format!("{} wakeups={}", seen.join(","), wakeups > 0));
        return;
    }
    let n = node(PROCS.addr(P, false), PollMode::Blocking);
    let q1 = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
    let q2 = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
    let (child, mut l, _) = parent(T, P, &n, &[&q1, &q2]);
    for (i, (qp, len)) in [(&q1, 10u32), (&q2, 20), (&q1, 30), (&q2, 40)]
        .into_iter()
        .enumerate()
    {
        std::thread::sleep(Duration::from_millis(30)); // let the responder fall asleep
        qp.post_send(&SendWr::new(i as u64, WrOpcode::Send).sg(&[n.mr.sge(0, len)]))
            .unwrap();
        ok(one(&n.cq), i as u64);
    }
    assert_eq!(l.recv(), "10@1,20@2,30@1,40@2 wakeups=true");
    finish(child);
}

/// Type 1 and type 2 windows: access within the window's range and rights works, outside
/// fails with REM_ACCESS_ERR; SEND with Invalidate kills the type 2 window's R_Key.
#[test]
fn memory_windows_of_both_types() {
    const T: &str = "memory_windows_of_both_types";
    const P: u8 = 3;
    if PROCS.is_child(T) {
        let n = node(PROCS.addr(P, true), PollMode::Blocking);
        let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
        let mw1 = n.pd.alloc_mw(MwType::Type1).unwrap();
        let mw2 = n.pd.alloc_mw(MwType::Type2).unwrap();
        let (mut l, _) = PROCS.child(P, &[&qp], &[]);
        qp.post_recv(&RecvWr {
            wr_id: 9,
            sg_list: &[n.mr.sge(900_000, 64)],
        })
        .unwrap();
        // Type 1: bound through the verb to [4096, 4096+1024), write only.
        let k1 = mw1
            .bind(&qp, &n.mr, n.mr.iova() + 4096, 1024, Access::REMOTE_WRITE)
            .unwrap();
        // Type 2: bound by a work request on this QP to [8192, 8192+512), read and write.
        let new2 = (mw2.rkey() & !0xff) | ((mw2.rkey().wrapping_add(1)) & 0xff);
        let bind = MwBind {
            mw: &mw2,
            new_rkey: new2,
            mr: Some(&n.mr),
            addr: n.mr.iova() + 8192,
            length: 512,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        };
        (qp.post_batch())
            .bind_mw(50, SendFlags::SIGNALED, &bind)
            .unwrap();
        // The window records its bind at once: its new key, and the region it holds.
        assert_eq!(mw2.rkey(), new2);
        ok(one(&n.cq), 50);
        l.send(&format!("{} {} {}", k1, new2, n.mr.iova()));
        let inv = ok(one(&n.cq), 9);
        let mut b = [0u8; 4];
        n.mr.read(4096, &mut b).unwrap();
        let mut c = [0u8; 4];
        n.mr.read(8192, &mut c).unwrap();
        l.send(&format!(
            "{:?} {:?} {:?}",
            inv.invalidated_rkey == Some(new2),
            b,
            c
        ));
        l.recv(); // stay until the requester is done
        return;
    }
    let n = node(PROCS.addr(P, false), PollMode::Blocking);
    let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
    let (child, mut l, _) = parent(T, P, &n, &[&qp]);
    let v = l.nums();
    let (k1, k2, base) = (v[0] as u32, v[1] as u32, v[2]);
    n.mr.write(0, &[1, 2, 3, 4]).unwrap();
    let w = |id, key, at: u64| {
        SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: at,
                rkey: key,
            },
        )
    };
    qp.post_send(&w(1, k1, base + 4096).sg(&[n.mr.sge(0, 4)]))
        .unwrap();
    ok(one(&n.cq), 1);
    qp.post_send(&w(2, k2, base + 8192).sg(&[n.mr.sge(0, 4)]))
        .unwrap();
    ok(one(&n.cq), 2);
    // SEND with Invalidate of the type 2 window.
    qp.post_send(&SendWr::new(3, WrOpcode::SendWithInv { rkey: k2 }).sg(&[n.mr.sge(0, 4)]))
        .unwrap();
    ok(one(&n.cq), 3);
    assert_eq!(l.recv(), "true [1, 2, 3, 4] [1, 2, 3, 4]");
    // Outside the type 1 window's range: remote access error, the QP goes to error.
    qp.post_send(&w(4, k1, base + 4096 + 1020).sg(&[n.mr.sge(0, 8)]))
        .unwrap();
    assert_eq!(one(&n.cq).status, WcStatus::RemAccessErr);
    l.send("bye");
    finish(child);
}

/// A WRITE with a bad R_Key: REM_ACCESS_ERR at the requester, the responder QP in error, and
/// later work requests flushed.
#[test]
fn bad_rkey_is_a_remote_access_error() {
    const T: &str = "bad_rkey_is_a_remote_access_error";
    const P: u8 = 4;
    if PROCS.is_child(T) {
        let n = node(PROCS.addr(P, true), PollMode::Blocking);
        let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
        let (mut l, _) = PROCS.child(P, &[&qp], &[]);
        qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[n.mr.sge(0, 64)],
        })
        .unwrap();
        l.recv(); // the parent saw its error
        // The receive posted before is flushed when the QP enters the error state.
        let w = one(&n.cq);
        l.send(&format!("{:?} {:?}", qp.query().0, w.status));
        return;
    }
    let n = node(PROCS.addr(P, false), PollMode::Blocking);
    let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
    let (child, mut l, _) = parent(T, P, &n, &[&qp]);
    qp.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 0xdead_beef,
            },
        )
        .sg(&[n.mr.sge(0, 64)]),
    )
    .unwrap();
    qp.post_send(&SendWr::new(2, WrOpcode::Send).sg(&[n.mr.sge(0, 8)]))
        .unwrap();
    let w = n.cq.wait(2, Duration::from_secs(20));
    assert_eq!(w.len(), 2);
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((w[1].wr_id, w[1].status), (2, WcStatus::WrFlushErr));
    l.send("seen");
    assert_eq!(l.recv(), "Err WrFlushErr");
    finish(child);
}

/// The responder is killed with SIGKILL during a stream of WRITEs: the requester's outstanding
/// work completes with RETRY_EXC_ERR (then flushes) within the retry budget; nothing hangs.
#[test]
fn peer_killed_mid_transfer_ends_in_retry_exceeded() {
    const T: &str = "peer_killed_mid_transfer_ends_in_retry_exceeded";
    const P: u8 = 5;
    if PROCS.is_child(T) {
        let n = node(PROCS.addr(P, true), PollMode::Blocking);
        let qp = n.pd.create_qp(&QpInitAttr::new(&n.cq)).unwrap();
        let (_l, _) = PROCS.child(P, &[&qp], &[n.mr.rkey() as u64, n.mr.iova()]);
        std::thread::sleep(Duration::from_secs(60)); // killed long before this
        return;
    }
    let n = node(PROCS.addr(P, false), PollMode::Blocking);
    let mut init = QpInitAttr::new(&n.cq);
    init.cap.max_send_wr = 64;
    let qp = n.pd.create_qp(&init).unwrap();
    let (mut child, _l, peer) = parent(T, P, &n, &[&qp]);
    let (rkey, base) = (peer[0] as u32, peer[1]);
    // Keep 32 WRITEs of 256 KiB in flight; kill the responder after the first completions.
    let mut posted = 0u64;
    let mut completed = Vec::new();
    let mut killed_at = None;
    let start = Instant::now();
    let post = |posted: &mut u64| {
        let sge = [n.mr.sge(0, 256 << 10)];
        let wr = SendWr::new(
            *posted,
            WrOpcode::RdmaWrite {
                remote_addr: base,
                rkey,
            },
        )
        .sg(&sge)
        .flags(SendFlags::SIGNALED);
        qp.post_send(&wr).unwrap();
        *posted += 1;
    };
    while start.elapsed() < Duration::from_secs(30) {
        while posted < 10_000 && posted - completed.len() as u64 <= 32 && killed_at.is_none() {
            post(&mut posted);
        }
        let mut wc = [EMPTY_WC; 32];
        let k = n.cq.poll(&mut wc);
        completed.extend_from_slice(&wc[..k]);
        if killed_at.is_none() && completed.len() >= 4 {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            killed_at = Some(Instant::now());
            // Work after the kill, whatever was still in flight (a fast peer may have
            // acknowledged everything posted before it).
            for _ in 0..8 {
                post(&mut posted);
            }
        }
        if killed_at.is_some() && completed.len() as u64 == posted {
            break;
        }
        if k == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let killed_at = killed_at.expect("the transfer never started");
    let elapsed = killed_at.elapsed();
    assert_eq!(completed.len() as u64, posted, "every posted WR completes");
    let first_err = completed
        .iter()
        .position(|w| w.status != WcStatus::Success)
        .expect("an error after the kill");
    assert_eq!(
        completed[first_err].status,
        WcStatus::RetryExcErr,
        "{:?}",
        completed[first_err]
    );
    assert!(
        completed[first_err + 1..]
            .iter()
            .all(|w| w.status == WcStatus::WrFlushErr)
    );
    // Budget: timeout 12 (16.8 ms) x (retry_cnt 3 + 1), plus scheduling slack.
    assert!(
        elapsed < Duration::from_secs(2),
        "retry budget exceeded: {elapsed:?}"
    );
    println!(
        "RETRY_EXC_ERR {elapsed:?} after SIGKILL; {} ok, {} flushed",
        first_err,
        completed.len() - first_err - 1
    );
}
