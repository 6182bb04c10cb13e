//! Crash-class attacks against a victim device in a child process, so that a crash is seen
//! as a crash (the child exiting or killed by a signal) and not as a failed test thread.
//!
//! The test re-runs its own binary with `SOFTRDMA_CRASH_VICTIM` set: the child opens the
//! victim device (an advertised region and a secret one in the attacked QPs' PD, a secret in
//! another PD, a QP connected to the parent's bystander device) and answers commands on its
//! stdin (`QP`: a new QP connected to the attacker; `COUNTERS`; `QUIT`). The parent is the
//! attacker, a bare UDP socket at the address those QPs are connected to, speaking RoCEv2
//! built with `wire`, and the bystander, doing WRITE round trips between the phases. Every
//! read of the child's output has a deadline and the child is killed (by its pid) on any
//! failure (`support::ChildGuard`).
//!
//! Phases: every opcode byte with random headers, truncated packets of every length, bad
//! ICRCs, unknown QPNs, zero-length datagrams, 64 KiB datagrams (junk, and a well-formed
//! packet with a 64 KiB payload), GSO datagrams mixing good and bad segments, huge and
//! overflowing DMA lengths, misaligned and out-of-range atomics, READs at and beyond the
//! responder's depth with duplicate storms, extreme PSNs. After each phase the child must be
//! running; at the end it must answer the bystander's round trips (bounded p99), its secrets
//! must be intact and never have been sent, its RSS must not have grown, its counters must
//! account for every datagram and every packet, and it must exit cleanly when told to.

mod support;

use std::io::BufRead;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use softrdma::net::{PortOptions, RxBatch, TxBatch, UdpPort};
use softrdma::verbs::*;
use softrdma::wire::{
    AtomicEthRepr, Bth, BthRepr, HeaderRepr, IcrcContext, NakCode, Opcode, Packet, Psn, RethRepr,
    Syndrome,
};
use support::{ChildGuard, Rng, kv, parse_kv};

const ROLE: &str = "SOFTRDMA_CRASH_VICTIM";
const BYSTANDER_QPN: &str = "SOFTRDMA_CRASH_BYSTANDER_QPN";
const TEST: &str = "crash_class_attacks_leave_a_child_victim_alive";

const PORT: u16 = 24870;
const VICTIM: [u8; 4] = [127, 0, 7, 2];
const ATTACKER: [u8; 4] = [127, 0, 7, 3];
const BYSTANDER: [u8; 4] = [127, 0, 7, 1];
const STRANGER: [u8; 4] = [127, 0, 7, 4];
const ATTACKER_QPN: u32 = 0x99;
const EPSN: u32 = 0x12_3456;
const DEPTH: u8 = 16;
const PUBLIC: u8 = 0xa0;
const PUBLIC_LEN: usize = 64 << 10;
const CANARY: &[u8; 8] = b"SECRET\x5e\xc3";

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

fn device(ip: [u8; 4]) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = PORT;
    cfg.mode = PollMode::Blocking;
    cfg.pin_mode = PinMode::OnDemand;
    Device::open(cfg).unwrap()
}

fn qp_attr(dest: u32, rq: u32, sq: u32) -> QpAttr {
    QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: all(),
        dest_qp_num: dest,
        rq_psn: rq,
        sq_psn: sq,
        max_rd_atomic: DEPTH,
        max_dest_rd_atomic: DEPTH,
        ..QpAttr::default()
    }
}

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// The child: the victim device, driven by commands on stdin until `QUIT` or end of input.
fn victim_role() {
    let bqpn: u32 = std::env::var(BYSTANDER_QPN).unwrap().parse().unwrap();
    let dev = device(VICTIM);
    let pd_a = dev.alloc_pd().unwrap();
    let pd_b = dev.alloc_pd().unwrap();
    let canary: Vec<u8> = CANARY.iter().copied().cycle().take(8192).collect();
    let public = pd_a.reg_buffer(vec![PUBLIC; PUBLIC_LEN], all()).unwrap();
    let secret_a = pd_a.reg_buffer(canary.clone(), all()).unwrap();
    let secret_b = pd_b.reg_buffer(canary.clone(), all()).unwrap();
    let landing = pd_a.reg_buffer(vec![0u8; 64], all()).unwrap();
    let cq = dev.create_cq(4096, None).unwrap();
    let vqb = pd_a.create_qp(&QpInitAttr::new(&cq)).unwrap();
    vqb.connect(IpAddr::from(BYSTANDER), &qp_attr(bqpn, 700, 500))
        .unwrap();
    println!(
        "VICTIM-READY vqb={} landing_va={} landing_rkey={} public_va={} public_rkey={} \
         secret_va={} secret_rkey={} secret_b_va={} secret_b_rkey={}",
        vqb.qp_num(),
        landing.iova(),
        landing.rkey(),
        public.iova(),
        public.rkey(),
        secret_a.iova(),
        secret_a.rkey(),
        secret_b.iova(),
        secret_b.rkey()
    );
    let mut qps: Vec<Qp> = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "QP" => {
                let qp = pd_a.create_qp(&QpInitAttr::new(&cq)).unwrap();
                qp.connect(IpAddr::from(ATTACKER), &qp_attr(ATTACKER_QPN, EPSN, 1))
                    .unwrap();
                println!("QPN qpn={}", qp.qp_num());
                qps.push(qp);
            }
            "COUNTERS" => {
                // Completions of the attacked QPs (errors) are not this test's subject.
                let mut wc = [EMPTY_WC; 64];
                while cq.poll(&mut wc) > 0 {}
                let c = dev.counters();
                let qp_packets: u64 = qps
                    .iter()
                    .chain([&vqb])
                    .map(|q| q.counters().packets_received)
                    .sum();
                let secrets_ok =
                    secret_a.to_vec().unwrap() == canary && secret_b.to_vec().unwrap() == canary;
                println!(
                    "COUNTERS rx_datagrams={} rx_packets={} rx_bad={} rx_icrc_solved={} \
                     rx_unknown_qp={} rx_wrong_peer={} qp_packets={qp_packets} rss_kib={} \
                     secrets_ok={} bystander_rts={}",
                    c.rx_datagrams.load(Relaxed),
                    c.rx_packets.load(Relaxed),
                    c.rx_bad.load(Relaxed),
                    c.rx_icrc_solved.load(Relaxed),
                    c.rx_unknown_qp.load(Relaxed),
                    c.rx_wrong_peer.load(Relaxed),
                    vm_rss_kib(),
                    u64::from(secrets_ok),
                    u64::from(vqb.query().0 == QpState::Rts),
                );
            }
            "QUIT" => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

/// The parent's view of the child.
struct VictimProc {
    child: ChildGuard,
}

impl VictimProc {
    fn counters(&mut self) -> Vec<(String, u64)> {
        self.child.send("COUNTERS");
        parse_kv(&self.child.expect("COUNTERS", Duration::from_secs(10)))
    }

    fn new_qp(&mut self) -> u32 {
        self.child.send("QP");
        kv(
            &parse_kv(&self.child.expect("QPN", Duration::from_secs(10))),
            "qpn",
        ) as u32
    }

    fn assert_alive(&mut self, after: &str) {
        assert!(
            self.child.alive(),
            "the victim died after {after}; its output:\n{}",
            self.child.log()
        );
    }
}

/// The hostile peer: sends from the address the attacked QPs are connected to, and a
/// stranger socket for bare datagrams.
struct Attacker {
    port: UdpPort,
    stranger: UdpSocket,
    victim: SocketAddr,
    rx: RxBatch,
    /// Datagrams sent to the victim, from either socket.
    sent: u64,
    /// Of those: ones certainly malformed or with a bad ICRC, ones for unknown QPs.
    bad: u64,
    unknown: u64,
    /// Every packet the victim sent back.
    seen: u64,
    leaks: Vec<String>,
}

impl Attacker {
    fn new() -> Attacker {
        let port = UdpPort::bind(
            SocketAddr::from((ATTACKER, PORT)),
            PortOptions {
                buffer_bytes: 16 << 20,
                ..PortOptions::default()
            },
        )
        .unwrap();
        port.set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        Attacker {
            port,
            stranger: UdpSocket::bind(SocketAddr::from((STRANGER, 0))).unwrap(),
            victim: SocketAddr::from((VICTIM, PORT)),
            rx: RxBatch::new(64, 65536),
            sent: 0,
            bad: 0,
            unknown: 0,
            seen: 0,
            leaks: Vec::new(),
        }
    }

    fn ctx(&self, id: u16) -> IcrcContext {
        IcrcContext {
            ip: softrdma::wire::IpHeader::V4 {
                src: Ipv4Addr::from(ATTACKER),
                dst: Ipv4Addr::from(VICTIM),
                id,
                dont_fragment: true,
            },
            src_port: PORT,
            dst_port: PORT,
        }
    }

    /// `hdr` + `payload` with a good ICRC for segment `id` of a datagram.
    fn packet_id(&self, hdr: HeaderRepr, payload: &[u8], id: u16) -> Vec<u8> {
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        let mut buf = vec![0u8; pkt.buffer_len()];
        let n = pkt.emit(&self.ctx(id), &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn packet(&self, hdr: HeaderRepr, payload: &[u8]) -> Vec<u8> {
        self.packet_id(hdr, payload, 0)
    }

    /// Rewrite the ICRC of arbitrary bytes (at least 4) as a sender would.
    fn reseal(&self, b: &mut [u8]) {
        let body = b.len() - 4;
        if let Ok(crc) = self.ctx(0).compute(&b[..body]) {
            b[body..].copy_from_slice(&crc.to_le_bytes());
        }
    }

    /// One datagram from the attacker's port; `segment` > 0 makes it a GSO datagram.
    fn send_seg(&mut self, bytes: &[u8], segment: u16) {
        let mut tx = TxBatch::new(1, bytes.len().max(1));
        assert!(tx.push(self.victim, bytes, segment));
        self.port.send(&mut tx).unwrap();
        self.sent += 1;
    }

    fn send(&mut self, bytes: &[u8]) {
        self.send_seg(bytes, 0);
    }

    fn send_stranger(&mut self, bytes: &[u8]) {
        self.stranger.send_to(bytes, self.victim).unwrap();
        self.sent += 1;
    }

    /// Read what the victim sent for `wait`: the syndromes of its acknowledgements; every
    /// payload is searched for the secret.
    fn drain(&mut self, wait: Duration) -> Vec<Option<Syndrome>> {
        let mut out = Vec::new();
        let end = Instant::now() + wait;
        while Instant::now() < end {
            let Ok(n) = self.port.recv(&mut self.rx) else {
                continue;
            };
            for i in 0..n {
                let Some(d) = self.rx.get(i) else { continue };
                for seg in d.segments() {
                    self.seen += 1;
                    let pkt = Packet::parse(seg).expect("the victim sent a malformed packet");
                    if seg.windows(6).any(|w| w == b"SECRET") && self.leaks.len() < 5 {
                        self.leaks.push(format!("{:?}", pkt.hdr));
                    }
                    out.push(pkt.hdr.aeth.map(|a| a.syndrome));
                }
            }
        }
        out
    }
}

fn req(op: Opcode, qpn: u32, psn: u32) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, qpn, Psn::new(psn)));
    h.bth.ack_req = true;
    h
}

fn with_reth(op: Opcode, qpn: u32, psn: u32, va: u64, rkey: u32, len: u32) -> HeaderRepr {
    let mut h = req(op, qpn, psn);
    h.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    h
}

fn atomic(op: Opcode, qpn: u32, psn: u32, va: u64, rkey: u32) -> HeaderRepr {
    let mut h = req(op, qpn, psn);
    h.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: 1,
        compare: 0,
    });
    h
}

struct Bystander {
    _dev: Device,
    cq: Cq,
    qp: Qp,
    src: Mr,
    rtts: Vec<Duration>,
}

impl Bystander {
    fn round_trips(&mut self, n: u32, va: u64, rkey: u32) {
        let sge = [self.src.sge(0, 8)];
        for i in 0..n {
            let t = Instant::now();
            let wr = SendWr::new(
                u64::from(i),
                WrOpcode::RdmaWrite {
                    remote_addr: va,
                    rkey,
                },
            )
            .sg(&sge);
            self.qp.post_send(&wr).unwrap();
            let wc = self.cq.wait(1, Duration::from_secs(5));
            assert_eq!(wc.len(), 1, "bystander WRITE {i} did not complete");
            assert_eq!(wc[0].status, WcStatus::Success, "bystander WRITE {i}");
            self.rtts.push(t.elapsed());
        }
    }
}

#[test]
fn crash_class_attacks_leave_a_child_victim_alive() {
    if std::env::var_os(ROLE).is_some() {
        victim_role();
        return;
    }
    let bdev = device(BYSTANDER);
    let bpd = bdev.alloc_pd().unwrap();
    let bcq = bdev.create_cq(64, None).unwrap();
    let bqp = bpd.create_qp(&QpInitAttr::new(&bcq)).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env(BYSTANDER_QPN, bqp.qp_num().to_string());
    let mut v = VictimProc {
        child: ChildGuard::spawn(cmd).unwrap(),
    };
    let ready = parse_kv(&v.child.expect("VICTIM-READY", Duration::from_secs(30)));
    let k = |name: &str| kv(&ready, name);
    bqp.connect(IpAddr::from(VICTIM), &qp_attr(k("vqb") as u32, 500, 700))
        .unwrap();
    let mut by = Bystander {
        src: bpd.reg_buffer(vec![1u8; 8], Access::LOCAL_WRITE).unwrap(),
        _dev: bdev.clone(),
        cq: bcq,
        qp: bqp,
        rtts: Vec::new(),
    };
    let (lva, lkey) = (k("landing_va"), k("landing_rkey") as u32);
    let (pva, pkey) = (k("public_va"), k("public_rkey") as u32);
    let (sva, skey) = (k("secret_va"), k("secret_rkey") as u32);
    let (sbva, sbkey) = (k("secret_b_va"), k("secret_b_rkey") as u32);
    by.round_trips(50, lva, lkey);
    by.rtts.clear();

    let mut a = Attacker::new();
    let mut rng = Rng(0xc0ff_ee00_dead_beef);
    let by_tx = || bdev.counters().tx_datagrams.load(Relaxed);
    let c0 = v.counters();
    let by_tx0 = by_tx();
    let rss0 = kv(&c0, "rss_kib");
    let t0 = Instant::now();

    // Wait until the victim has received every datagram sent so far (the attack is paced so
    // that none is lost to a full socket buffer and the counts below are exact).
    let settle = |v: &mut VictimProc, a: &mut Attacker| {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let c = v.counters();
            let got = kv(&c, "rx_datagrams") - kv(&c0, "rx_datagrams");
            if got >= a.sent + (by_tx() - by_tx0) || Instant::now() > end {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let phase = |name: &str, v: &mut VictimProc, a: &mut Attacker, by: &mut Bystander| {
        settle(v, a);
        a.drain(Duration::from_millis(5));
        v.assert_alive(name);
        by.round_trips(10, lva, lkey);
    };

    // 1. Every opcode byte, each with headers of random bytes of several lengths and a good
    //    ICRC, at the expected PSN of a live QP (a fresh one every 64 opcodes).
    let mut qpn = 0;
    for op in 0..=255u8 {
        if op % 64 == 0 {
            qpn = v.new_qp();
        }
        for len in [0usize, 4, 16, 28, 32, 60, 1100] {
            let mut b = vec![0u8; 12 + len + 4];
            for x in &mut b {
                *x = rng.next() as u8;
            }
            let bth = req(Opcode(op), qpn, EPSN).bth;
            bth.emit(&mut Bth::new_unchecked(&mut b[..12])).unwrap();
            b[0] = op;
            a.reseal(&mut b);
            a.send(&b);
        }
        if op % 32 == 31 {
            settle(&mut v, &mut a);
        }
    }
    phase("every opcode byte", &mut v, &mut a, &mut by);

    // 2. Truncated packets: every prefix of a WRITE, a READ and an atomic.
    let qpn = v.new_qp();
    let templates = [
        a.packet(
            with_reth(Opcode::RC_WRITE_ONLY, qpn, EPSN, pva, pkey, 64),
            &[7; 64],
        ),
        a.packet(
            with_reth(Opcode::RC_READ_REQUEST, qpn, EPSN, sva, skey, 64),
            &[],
        ),
        a.packet(atomic(Opcode::RC_FETCH_ADD, qpn, EPSN, pva, pkey), &[]),
    ];
    for t in &templates {
        for cut in 1..t.len() {
            a.send(&t[..cut]);
            a.bad += 1;
        }
        settle(&mut v, &mut a);
    }
    phase("truncated packets", &mut v, &mut a, &mut by);

    // 3. Bad ICRCs: each bit of the ICRC of a far-ahead WRITE flipped, many times over.
    let far = a.packet(
        with_reth(Opcode::RC_WRITE_ONLY, qpn, EPSN + 100_000, pva, pkey, 64),
        &[7; 64],
    );
    for i in 0..2048 {
        let mut b = far.clone();
        let n = b.len();
        b[n - 4 + (i / 8) % 4] ^= 1 << (i % 8);
        a.send(&b);
        a.bad += 1;
        if i % 256 == 255 {
            settle(&mut v, &mut a);
        }
    }
    phase("bad ICRCs", &mut v, &mut a, &mut by);

    // 4. Unknown QPNs (the victim's QPNs are random 24-bit numbers; these are counted only
    //    when they are not one of them, which a collision would make them).
    for i in 0..2048u32 {
        let q = (rng.next() as u32) & 0xff_ffff;
        let b = a.packet(
            with_reth(Opcode::RC_WRITE_ONLY, q, EPSN, pva, pkey, 8),
            &[1; 8],
        );
        a.send(&b);
        a.unknown += 1;
        if i % 256 == 255 {
            settle(&mut v, &mut a);
        }
    }
    phase("unknown QPNs", &mut v, &mut a, &mut by);

    // 5. Zero-length datagrams, from the peer's address and from a stranger.
    for i in 0..1024 {
        if i % 2 == 0 {
            a.send(&[]);
        } else {
            a.send_stranger(&[]);
        }
        if i % 256 == 255 {
            settle(&mut v, &mut a);
        }
    }
    phase("zero-length datagrams", &mut v, &mut a, &mut by);

    // 6. 64 KiB datagrams: junk, and a well-formed WRITE with a 64 KiB payload (past any MTU)
    //    to the advertised region with its key.
    let blob: Vec<u8> = (0..65_000).map(|_| rng.next() as u8).collect();
    let qpn = v.new_qp();
    let huge = a.packet(
        with_reth(Opcode::RC_WRITE_ONLY, qpn, EPSN, pva, pkey, 65_000 - 48),
        &blob[..65_000 - 48],
    );
    for i in 0..96 {
        match i % 3 {
            0 => a.send_stranger(&blob),
            1 => a.send(&blob),
            _ => a.send(&huge),
        }
        if i % 16 == 15 {
            settle(&mut v, &mut a);
        }
    }
    phase("64 KiB datagrams", &mut v, &mut a, &mut by);

    // 7. GSO datagrams (the victim receives them whole when it uses GRO): 40 segments of
    //    1032 bytes, good WRITEs to a live QP (ICRC for their segment's IPv4 ID) between
    //    bad ICRCs and unknown QPNs.
    let qpn = v.new_qp();
    let mut psn = EPSN;
    for d in 0..16 {
        let mut dgram = Vec::new();
        for s in 0..40u16 {
            let va = pva + u64::from(s % 8) * 1000;
            let mut seg = match s % 4 {
                0 => a.packet_id(
                    with_reth(Opcode::RC_WRITE_ONLY, qpn ^ 0x5a5a, psn, va, pkey, 1000),
                    &[2; 1000],
                    s,
                ),
                _ => {
                    let b = a.packet_id(
                        with_reth(Opcode::RC_WRITE_ONLY, qpn, psn, va, pkey, 1000),
                        &[3; 1000],
                        s,
                    );
                    psn += 1;
                    b
                }
            };
            if s % 4 == 2 && d % 2 == 1 {
                // A bad ICRC in the middle: the writes after it are out of sequence.
                let n = seg.len();
                seg[n - 1] ^= 0x80;
            }
            dgram.extend_from_slice(&seg);
        }
        a.send_seg(&dgram, 1032);
        settle(&mut v, &mut a);
    }
    phase("GSO datagrams", &mut v, &mut a, &mut by);

    // 8. Huge and overflowing DMA lengths, each on a fresh QP (a NAK is fatal to it).
    let huge_dma: [(Opcode, u64, u32, u32); 8] = [
        (Opcode::RC_WRITE_FIRST, pva, pkey, u32::MAX),
        (Opcode::RC_WRITE_ONLY, pva, pkey, 1 << 31),
        (Opcode::RC_WRITE_ONLY, u64::MAX - 8, pkey, 64),
        (Opcode::RC_READ_REQUEST, pva, pkey, u32::MAX),
        (Opcode::RC_READ_REQUEST, pva, pkey, 1 << 31),
        (Opcode::RC_READ_REQUEST, u64::MAX - 10, pkey, 100),
        (Opcode::RC_READ_REQUEST, sva, skey ^ 1, u32::MAX),
        (Opcode::RC_WRITE_FIRST, sbva, sbkey, u32::MAX),
    ];
    for (op, va, key, len) in huge_dma {
        let qpn = v.new_qp();
        let payload: &[u8] = match op {
            Opcode::RC_WRITE_FIRST => &[9; 1024],
            Opcode::RC_WRITE_ONLY => &[9; 64],
            _ => &[],
        };
        let b = a.packet(with_reth(op, qpn, EPSN, va, key, len), payload);
        a.send(&b);
        // A WRITE FIRST is followed by MIDDLE packets, as if the stream went on.
        if op == Opcode::RC_WRITE_FIRST {
            for i in 1..64 {
                let b = a.packet(req(Opcode::RC_WRITE_MIDDLE, qpn, EPSN + i), &[9; 1024]);
                a.send(&b);
            }
        }
        settle(&mut v, &mut a);
    }
    phase("huge DMA lengths", &mut v, &mut a, &mut by);

    // 9. Misaligned and out-of-range atomics: the NAK is Invalid Request whatever the key
    //    (valid, wrong, another PD's).
    let mut naks = Vec::new();
    for (va, key) in [
        (pva + 3, pkey),
        (pva + 3, pkey ^ 0x100),
        (sbva + 5, sbkey),
        (u64::MAX - 3, pkey),
    ] {
        for op in [Opcode::RC_FETCH_ADD, Opcode::RC_COMPARE_SWAP] {
            let qpn = v.new_qp();
            let b = a.packet(atomic(op, qpn, EPSN, va, key), &[]);
            a.send(&b);
            settle(&mut v, &mut a);
            naks.extend(a.drain(Duration::from_millis(30)));
        }
    }
    assert_eq!(naks.len(), 8, "{naks:?}");
    assert!(
        naks.iter()
            .all(|s| *s == Some(Syndrome::Nak(NakCode::InvalidRequest))),
        "misaligned atomics: {naks:?}"
    );
    phase("misaligned atomics", &mut v, &mut a, &mut by);

    // 10. READs at the responder's depth and past it, then storms of duplicates of them,
    //     while the attacker reads nothing (its responses pile up).
    let qpn = v.new_qp();
    let len = PUBLIC_LEN as u32;
    let per = len / 1024;
    for r in 0..u32::from(DEPTH) * 2 {
        let b = a.packet(
            with_reth(Opcode::RC_READ_REQUEST, qpn, EPSN + r * per, pva, pkey, len),
            &[],
        );
        a.send(&b);
    }
    settle(&mut v, &mut a);
    for round in 0..8 {
        for r in 0..u32::from(DEPTH) {
            let b = a.packet(
                with_reth(Opcode::RC_READ_REQUEST, qpn, EPSN + r * per, pva, pkey, len),
                &[],
            );
            a.send(&b);
        }
        if round % 2 == 1 {
            by.round_trips(5, lva, lkey);
        }
        settle(&mut v, &mut a);
    }
    a.drain(Duration::from_millis(100));
    phase("READs at depth", &mut v, &mut a, &mut by);

    // 11. Extreme PSNs on a fresh QP, requests for the secrets.
    let qpn = v.new_qp();
    for p in [
        0,
        0xff_ffff,
        EPSN - 1,
        EPSN + 0x7f_ffff,
        EPSN + 0x80_0000,
        EPSN + 0x80_0001,
        EPSN + 1024,
        EPSN + 1025,
        EPSN + 1,
    ] {
        let p = p & 0xff_ffff;
        let b = a.packet(
            with_reth(Opcode::RC_READ_REQUEST, qpn, p, sva, skey, 4096),
            &[],
        );
        a.send(&b);
        let b = a.packet(
            with_reth(Opcode::RC_WRITE_ONLY, qpn, p, sbva, sbkey, 8),
            &[4; 8],
        );
        a.send(&b);
    }
    phase("extreme PSNs", &mut v, &mut a, &mut by);

    // The victim is alive, serves the bystander, and accounts for everything.
    by.round_trips(100, lva, lkey);
    settle(&mut v, &mut a);
    let c = v.counters();
    let d = |name: &str| kv(&c, name) - kv(&c0, name);
    let attack = t0.elapsed();
    by.rtts.sort();
    let p99 = by.rtts[by.rtts.len() * 99 / 100];
    let max = *by.rtts.last().unwrap();
    eprintln!(
        "{} datagrams in {attack:?}; victim {c:?} (from {c0:?}); {} packets back; bystander \
         p99 {p99:?} max {max:?}",
        a.sent, a.seen
    );
    assert!(a.leaks.is_empty(), "secret bytes sent: {:?}", a.leaks);
    assert_eq!(kv(&c, "secrets_ok"), 1, "a secret region changed");
    assert_eq!(
        kv(&c, "bystander_rts"),
        1,
        "the bystander's QP at the victim failed"
    );
    assert!(
        p99 < Duration::from_millis(100) && max < Duration::from_secs(1),
        "bystander round trips p99 {p99:?} max {max:?}"
    );
    assert_eq!(
        d("rx_datagrams"),
        a.sent + (by_tx() - by_tx0),
        "datagrams received vs sent (the attack is paced: none may be lost)"
    );
    assert_eq!(
        kv(&c, "rx_packets"),
        kv(&c, "rx_bad") + kv(&c, "rx_unknown_qp") + kv(&c, "rx_wrong_peer") + kv(&c, "qp_packets"),
        "every packet is bad, for no QP, from the wrong peer, or handed to a QP: {c:?}"
    );
    // A junk packet whose ICRC happens to solve for some IPv4 ID (2^-16) is not counted bad.
    assert!(
        d("rx_bad") + d("rx_icrc_solved") >= a.bad,
        "bad {} solved {} of {} certainly bad",
        d("rx_bad"),
        d("rx_icrc_solved"),
        a.bad
    );
    assert!(d("rx_unknown_qp") >= a.unknown - 2, "{c:?}");
    assert_eq!(d("rx_wrong_peer"), 0, "{c:?}");
    let grown = kv(&c, "rss_kib").saturating_sub(rss0);
    assert!(grown < 16 * 1024, "the victim's RSS grew by {grown} KiB");

    v.child.send("QUIT");
    let st = v.child.wait(Duration::from_secs(10));
    assert!(
        st.is_some_and(|s| s.success()),
        "the victim did not exit cleanly: {st:?}\n{}",
        v.child.log()
    );
}
