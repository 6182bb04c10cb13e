//! Whole devices on the simulated network (`DeviceNet`): the engine's datapath (lending,
//! GSO datagrams, held acknowledgements, demultiplexing, the peer check, ICRC verification
//! with identification solving) under seeded loss, duplication, reordering, corruption and
//! GSO datagrams split into their segments.
//!
//! `SOFTRDMA_DEVICE_SEEDS=N` changes the seed count (default 1000); a failing seed replays
//! alone with `SOFTRDMA_SEED=S cargo test -p softrdma-sim --test sim_devices -- one_seed`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use softrdma_sim::Faults;
use softrdma_sim::workload::devices::{DeviceSeedReport, run_device_seed};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The faults of seed `s`: a clean network for one seed in eight, else up to 5 % loss,
/// 3 % duplication, 5 % reordering, 2 % corruption.
fn faults_of(s: u64) -> (Faults, f64) {
    if s.is_multiple_of(8) {
        return (Faults::NONE, 0.0);
    }
    let pick =
        |k: u64, max: f64| ((s.wrapping_mul(0x9e37_79b9) >> (k * 7)) % 101) as f64 / 100.0 * max;
    let f = Faults {
        loss: pick(0, 0.05),
        duplicate: pick(1, 0.03),
        reorder: pick(2, 0.05),
        corrupt: pick(3, 0.02),
        latency_ns: 2_000,
        jitter_ns: 1_000,
        reorder_delay_ns: 40_000,
    };
    (f, pick(4, 0.5))
}

fn run(seed: u64) -> Result<DeviceSeedReport, String> {
    let (f, split) = faults_of(seed);
    run_device_seed(seed, 24, f, split)
}

#[test]
fn seeds() {
    let n = env_u64("SOFTRDMA_DEVICE_SEEDS").unwrap_or(1000);
    let base = env_u64("SOFTRDMA_SEED_BASE").unwrap_or(0);
    let t = Instant::now();
    let mut total = DeviceSeedReport::default();
    let mut failures = Vec::new();
    for seed in base..base + n {
        match run(seed) {
            Ok(r) => {
                total.ops += r.ops;
                total.net.sent += r.net.sent;
                total.net.lost += r.net.lost;
                total.net.split += r.net.split;
                total.net.corrupted += r.net.corrupted;
                total.net.duplicated += r.net.duplicated;
                total.net.reordered += r.net.reordered;
                total.rx_bad += r.rx_bad;
                total.rx_icrc_solved += r.rx_icrc_solved;
                total.tx_zero_copy += r.tx_zero_copy;
            }
            Err(e) => failures.push(format!(
                "seed {seed}: {e}\n  replay: SOFTRDMA_SEED={seed} cargo test -p softrdma-sim --test sim_devices -- one_seed --nocapture"
            )),
        }
    }
    println!(
        "{n} seeds in {:.1} s: {} WRs, {} datagrams ({} lost, {} duplicated, {} reordered, {} corrupted, {} GSO split); devices: {} bad packets dropped, {} identifications solved, {} packets sent zero-copy",
        t.elapsed().as_secs_f64(),
        total.ops,
        total.net.sent,
        total.net.lost,
        total.net.duplicated,
        total.net.reordered,
        total.net.corrupted,
        total.net.split,
        total.rx_bad,
        total.rx_icrc_solved,
        total.tx_zero_copy
    );
    assert!(
        failures.is_empty(),
        "{} of {n} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    if n >= 50 {
        // The scenarios the faults are for happened.
        assert!(total.tx_zero_copy > 0, "no payload was lent");
        assert!(
            total.net.split > 0 && total.rx_icrc_solved > 0,
            "no split GSO datagram was solved"
        );
        assert!(
            total.net.corrupted > 0 && total.rx_bad > 0,
            "no corrupted packet was dropped"
        );
    }
}

#[test]
fn one_seed() {
    let Some(seed) = env_u64("SOFTRDMA_SEED") else {
        return;
    };
    let r = run(seed);
    println!("{r:?}");
    r.unwrap();
}

// ---------------------------------------------------------------------------- scenarios

use softrdma::verbs::{
    Access, Cq, Device, EMPTY_WC, Mr, Mtu, Pd, Qp, QpAttr, QpInitAttr, RecvWr, SendFlags, SendWr,
    WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use softrdma_sim::DeviceNet;
use std::sync::atomic::Ordering::Relaxed;

struct S {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn side(net: &mut DeviceNet, last: u8, fill: u8) -> S {
    let dev = net.open(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq)).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_buffer(vec![fill; 256 * 1024], all).unwrap();
    S {
        dev,
        _pd: pd,
        cq,
        qp,
        mr,
    }
}

/// Connect `s`'s QP to QP `dest_qpn` at `remote` (one direction), with `retry_cnt` retries
/// of a 4 ms timer.
fn connect_to(s: &S, remote: IpAddr, dest_qpn: u32, retry_cnt: u8) {
    let attr = QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        timeout: 10,
        retry_cnt,
        rnr_retry: 7,
        dest_qp_num: dest_qpn,
        sq_psn: 100,
        rq_psn: 100,
        ..QpAttr::default()
    };
    s.qp.connect(remote, &attr).unwrap();
}

fn write(s: &S, wr_id: u64, peer: &Mr, off: u64, len: u32) {
    let sge = [s.mr.sge(off, len)];
    let wr = SendWr::new(
        wr_id,
        WrOpcode::RdmaWrite {
            remote_addr: peer.iova() + off,
            rkey: peer.rkey(),
        },
    )
    .sg(&sge)
    .flags(SendFlags::SIGNALED);
    s.qp.post_send(&wr).unwrap();
}

fn send(s: &S, wr_id: u64, len: u32) {
    let sge = [s.mr.sge(0, len)];
    let wr = SendWr::new(wr_id, WrOpcode::Send)
        .sg(&sge)
        .flags(SendFlags::SIGNALED);
    s.qp.post_send(&wr).unwrap();
}

fn poll(s: &S, into: &mut Vec<WorkCompletion>) {
    let mut wc = [EMPTY_WC; 16];
    loop {
        let n = s.cq.poll(&mut wc);
        into.extend_from_slice(&wc[..n]);
        if n < wc.len() {
            return;
        }
    }
}

fn counter(
    d: &Device,
    f: impl Fn(&softrdma::net::EngineCounters) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    f(d.counters()).load(Relaxed)
}

/// Packets for B's QP from a device other than its peer (with a valid ICRC, the right QPN
/// and a valid rkey), and packets for a QPN B does not have, change nothing at B and do not
/// disturb the connection's own traffic.
#[test]
fn foreign_peers_and_unknown_qpns_are_dropped() {
    let mut net = DeviceNet::new(7, Faults::NONE);
    let (a, b, c) = (
        side(&mut net, 1, 0xaa),
        side(&mut net, 2, 0),
        side(&mut net, 3, 0xee),
    );
    let c2 = {
        let qp = c._pd.create_qp(&QpInitAttr::new(&c.cq)).unwrap();
        S {
            dev: c.dev.clone(),
            _pd: c._pd.clone(),
            cq: c.cq.clone(),
            qp,
            mr: c.mr.clone(),
        }
    };
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    // C aims at B's connected QP (a foreign peer) and at a QPN B does not have.
    connect_to(&c, b.dev.addr(), b.qp.qp_num(), 2);
    connect_to(&c2, b.dev.addr(), 0x00ab_cdef, 2);
    let rb = b.mr.sge(128 * 1024, 4096);
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &[rb],
    })
    .unwrap();
    write(&c, 1, &b.mr, 0, 64 * 1024);
    write(&c2, 2, &b.mr, 0, 64 * 1024);
    write(&a, 3, &b.mr, 0, 64 * 1024);
    send(&a, 4, 100);
    let (mut wa, mut wb, mut wc) = (Vec::new(), Vec::new(), Vec::new());
    let done = net.run_until(10_000_000_000, |_| {
        poll(&a, &mut wa);
        poll(&b, &mut wb);
        poll(&c, &mut wc);
        wa.len() == 2 && wb.len() == 1 && wc.len() == 2
    });
    assert!(done, "a {wa:?} b {wb:?} c {wc:?}");
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!((wb[0].wr_id, wb[0].status), (9, WcStatus::Success));
    // C's WRITEs were never acknowledged: their retries ran out.
    assert!(
        wc.iter().all(|w| w.status == WcStatus::RetryExcErr),
        "{wc:?}"
    );
    // B holds A's bytes, none of C's.
    let got = b.mr.to_vec().unwrap();
    assert!(got[..64 * 1024].iter().all(|&x| x == 0xaa));
    assert!(counter(&b.dev, |c| &c.rx_wrong_peer) > 0);
    assert!(counter(&b.dev, |c| &c.rx_unknown_qp) > 0);
    assert_eq!(counter(&b.dev, |c| &c.rx_bad), 0);
}

/// Every acknowledgement B sends for a while is lost (B holds them back and coalesces them
/// in busy-poll mode): A times out and resends, B answers the duplicates again, and every
/// WRITE completes exactly once with its bytes placed.
#[test]
fn held_acknowledgements_meet_loss() {
    let mut net = DeviceNet::new(11, Faults::NONE);
    let (a, b) = (side(&mut net, 1, 0x5a), side(&mut net, 2, 0));
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    let b_addr = SocketAddr::new(b.dev.addr(), 4791);
    let mut acks_dropped = 0u32;
    net.drop_if = Some(Box::new(move |d| {
        // RC ACK (BTH opcode 0x11) from B: the first 5 are lost (fewer than the 7 retries,
        // each of which draws one).
        let ack = d.src == b_addr && d.data.first() == Some(&0x11);
        if ack && acks_dropped < 5 {
            acks_dropped += 1;
            return true;
        }
        false
    }));
    for i in 0..32u64 {
        write(&a, i, &b.mr, i * 2048, 2048);
    }
    let mut wa = Vec::new();
    let done = net.run_until(10_000_000_000, |_| {
        poll(&a, &mut wa);
        wa.len() >= 32
    });
    assert!(done, "{} of 32 WRITEs completed", wa.len());
    let mut ids: Vec<u64> = wa.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..32).collect::<Vec<_>>(),
        "each WRITE completes once"
    );
    assert!(
        wa.iter().all(|w| w.status == WcStatus::Success),
        "{wa:?} {:?} {:?}",
        a.qp.counters(),
        b.qp.counters()
    );
    assert!(
        b.mr.to_vec().unwrap()[..64 * 1024]
            .iter()
            .all(|&x| x == 0x5a)
    );
    let (ca, cb) = (a.qp.counters(), b.qp.counters());
    assert!(
        ca.comp.retransmits + ca.comp.timeouts > 0,
        "A never resent: {ca:?}"
    );
    assert!(cb.resp.duplicates > 0, "B saw no duplicate: {cb:?}");
}

/// Every GSO datagram is split into its segments on the way (a receiver without GRO): each
/// segment's ICRC was computed with the identification of its place in the datagram, which
/// the receiver solves for; nothing is dropped as bad.
#[test]
fn split_gso_segments_are_verified_by_solving() {
    let mut net = DeviceNet::new(3, Faults::NONE);
    net.split = 1.0;
    let (a, b) = (side(&mut net, 1, 0x33), side(&mut net, 2, 0));
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    write(&a, 1, &b.mr, 0, 200 * 1024);
    let mut wa = Vec::new();
    assert!(net.run_until(5_000_000_000, |_| {
        poll(&a, &mut wa);
        !wa.is_empty()
    }));
    assert_eq!(wa[0].status, WcStatus::Success);
    assert!(
        b.mr.to_vec().unwrap()[..200 * 1024]
            .iter()
            .all(|&x| x == 0x33)
    );
    assert!(net.stats.split > 0);
    assert!(counter(&b.dev, |c| &c.rx_icrc_solved) > 0);
    assert_eq!(counter(&b.dev, |c| &c.rx_bad), 0);
    assert!(
        counter(&a.dev, |c| &c.tx_zero_copy) > 0,
        "the WRITE's payload was lent"
    );
}

/// An exchange in which each side waits for its own SEND's completion (its ACK) and for the
/// peer's SEND before posting the next one, as MPI does over UCX's zero-copy sends: each side
/// holds back the ACK of the SEND it received (for its answer to carry), and its answer
/// waits for the ACK the other side holds. An application's poll that finds nothing lets
/// an ACK held for ACK_GRACE go, so a round takes a few microseconds of virtual time, not
/// ACK_DELAY.
#[test]
fn an_exchange_of_signaled_sends_does_not_wait_for_held_acks() {
    use softrdma::params::{ACK_DELAY, ACK_GRACE};
    let mut net = DeviceNet::new(5, Faults::NONE);
    // The applications poll every 250 ns.
    net.max_step_ns = 250;
    let (a, b) = (side(&mut net, 1, 0x11), side(&mut net, 2, 0x22));
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    const ROUNDS: u64 = 200;
    let start = net.now();
    for round in 0..ROUNDS {
        for s in [&a, &b] {
            let sge = [s.mr.sge(128 * 1024, 4096)];
            s.qp.post_recv(&RecvWr {
                wr_id: round,
                sg_list: &sge,
            })
            .unwrap();
            send(s, round, 4096);
        }
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        let done = net.run_until(1_000_000_000, |_| {
            poll(&a, &mut wa);
            poll(&b, &mut wb);
            wa.len() == 2 && wb.len() == 2
        });
        assert!(done, "round {round}: a {wa:?} b {wb:?}");
        assert!(
            wa.iter().chain(&wb).all(|w| w.status == WcStatus::Success),
            "{wa:?} {wb:?}"
        );
    }
    // Each round waited ACK_DELAY (17 us per round) before held ACKs were let go by empty
    // polls.
    let per_round = (net.now() - start) / ROUNDS;
    const { assert!(ACK_GRACE + 2_000 < ACK_DELAY / 2) };
    assert!(
        per_round <= ACK_GRACE + 2_000,
        "{per_round} ns of virtual time per round"
    );
}

/// Busy-poll doorbells and SENDs: the first SEND posted to a QP with packets in flight since
/// the application's last poll goes out at once (a ping-pong's answer), the ones after it
/// without a poll in between wait for the next poll and leave together (a burst); one-sided
/// posts wait whenever the QP has packets in flight.
#[test]
fn a_burst_of_sends_waits_for_the_next_poll_but_its_first_send_does_not() {
    let mut net = DeviceNet::new(9, Faults::NONE);
    let (a, b) = (side(&mut net, 1, 0x44), side(&mut net, 2, 0));
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    for i in 0..8u64 {
        let sge = [b.mr.sge(128 * 1024 + i * 64, 64)];
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &sge,
        })
        .unwrap();
    }
    let deferred = |s: &S| counter(&s.dev, |c| &c.posts_deferred);
    // Posts as the C path makes them (`ibv_post_send`): one request per batch.
    let post = |s: &S, wr: &SendWr<'_>| {
        let mut batch = s.qp.post_batch();
        batch.post(wr).unwrap();
    };
    let src = [a.mr.sge(0, 64)];
    let send_wr = |id: u64| {
        SendWr::new(id, WrOpcode::Send)
            .sg(&src)
            .flags(SendFlags::SIGNALED)
    };
    let big = [a.mr.sge(0, 64 * 1024)];
    let write_wr = |id: u64, sg| {
        SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.iova(),
                rkey: b.mr.rkey(),
            },
        )
        .sg(sg)
        .flags(SendFlags::SIGNALED)
    };
    // A WRITE in flight, then a poll by the application.
    post(&a, &write_wr(100, &big));
    net.advance(100);
    poll(&a, &mut Vec::new());
    assert_eq!(deferred(&a), 0);
    net.advance(100);
    post(&a, &send_wr(0));
    assert_eq!(deferred(&a), 0, "the first SEND since the poll waited");
    for i in 1..4 {
        net.advance(100);
        post(&a, &send_wr(i));
    }
    assert_eq!(deferred(&a), 3, "the burst behind it went out one by one");
    net.advance(100);
    post(&a, &write_wr(101, &src));
    assert_eq!(
        deferred(&a),
        4,
        "a WRITE behind packets in flight went out at once"
    );
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let done = net.run_until(1_000_000_000, |_| {
        poll(&a, &mut wa);
        poll(&b, &mut wb);
        wa.len() == 6 && wb.len() == 4
    });
    assert!(done, "a {wa:?} b {wb:?}");
    assert!(
        wa.iter().chain(&wb).all(|w| w.status == WcStatus::Success),
        "{wa:?} {wb:?}"
    );
    let mut got: Vec<u64> = wb.iter().map(|w| w.wr_id).collect();
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2, 3]);
}

/// Busy-poll CQ polls after a receive that emptied the socket (the application draining its
/// CQ, as libfabric's RxM polls twice more before it answers): the first `DRAIN_SKIPS` that
/// find the CQ empty leave the socket alone (a system call that would find nothing on the way
/// to the answer); the next one receives. A post ends the drain, and so does `DRAIN_SKIP` of
/// time: what waits is received at once then; a poll of an armed CQ is never skipped.
#[test]
fn polls_draining_a_cq_leave_the_socket_alone_until_a_post_or_a_few_polls() {
    use softrdma::params::{DRAIN_SKIP, DRAIN_SKIPS};
    let mut net = DeviceNet::new(13, Faults::NONE);
    let (a, b) = (side(&mut net, 1, 0x66), side(&mut net, 2, 0));
    connect_to(&a, b.dev.addr(), b.qp.qp_num(), 7);
    connect_to(&b, a.dev.addr(), a.qp.qp_num(), 7);
    for i in 0..16u64 {
        let sge = [b.mr.sge(i * 64, 64)];
        b.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &sge,
        })
        .unwrap();
    }
    let mut wc = [EMPTY_WC; 4];
    // One SEND waits in B's socket (with whatever else was sent: B's ACKs go to A); B's
    // poll receives it and empties the socket.
    let deliver_one = |net: &mut DeviceNet| {
        send(&a, 0, 64);
        // A's poll sends a post its doorbell left for it (a burst behind unacknowledged ones).
        poll(&a, &mut Vec::new());
        assert!(net.deliver_sent() >= 1);
    };
    // A receive that empties the socket, after the last one's drain ended (in time).
    let drain = |net: &mut DeviceNet, wc: &mut [WorkCompletion]| {
        net.advance(DRAIN_SKIP + 1);
        deliver_one(net);
        net.advance(100);
        let n = b.cq.poll(wc);
        assert!(
            wc[..n].iter().any(|w| w.opcode == WcOpcode::Recv),
            "the message in the socket: {:?}",
            &wc[..n]
        );
    };

    // The next DRAIN_SKIPS empty polls skip the socket, though a message waits there.
    drain(&mut net, &mut wc);
    deliver_one(&mut net);
    for k in 0..DRAIN_SKIPS {
        net.advance(100);
        assert_eq!(b.cq.poll(&mut wc), 0, "poll {k} after the drain looked");
    }
    net.advance(100);
    assert_eq!(b.cq.poll(&mut wc), 1, "the poll after the skips receives");

    // A post ends the drain: the application answered.
    drain(&mut net, &mut wc);
    deliver_one(&mut net);
    write(&b, 50, &a.mr, 0, 8);
    net.advance(100);
    let n = b.cq.poll(&mut wc);
    assert!(
        wc[..n].iter().any(|w| w.opcode == WcOpcode::Recv),
        "a poll after a post receives: {:?}",
        &wc[..n]
    );

    // So does time.
    drain(&mut net, &mut wc);
    deliver_one(&mut net);
    net.advance(DRAIN_SKIP + 1);
    assert_eq!(b.cq.poll(&mut wc), 1, "a poll DRAIN_SKIP later receives");

    // A poll of an armed CQ (the last look before its thread sleeps) receives at once.
    drain(&mut net, &mut wc);
    deliver_one(&mut net);
    b.cq.req_notify(false);
    net.advance(100);
    let n = b.cq.poll(&mut wc);
    assert!(
        wc[..n].iter().any(|w| w.opcode == WcOpcode::Recv),
        "an armed CQ's poll receives: {:?}",
        &wc[..n]
    );

    // A poll that found nothing in the socket starts no drain.
    net.advance(DRAIN_SKIP + 1);
    assert_eq!(b.cq.poll(&mut wc), 0);
    deliver_one(&mut net);
    net.advance(100);
    let n = b.cq.poll(&mut wc);
    assert!(
        wc[..n].iter().any(|w| w.opcode == WcOpcode::Recv),
        "an empty receive is no drain: {:?}",
        &wc[..n]
    );
}
