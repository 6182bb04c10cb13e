//! `qp_scale`: many RC QP pairs between two devices of one process, on loopback. Connects
//! `--pairs N` pairs, then posts one 64-byte WRITE on each at once and waits for all of them;
//! prints the connect cost per pair, the WRITE cost per operation (all posted to all
//! completed, divided by N), the resident memory per QP and whether every WRITE's data was
//! placed. `--table` runs 1, 10, 100, 1000 and 8000 pairs (or the `--pairs` list given,
//! comma-separated) and prints one line each, with the ratios to the first.
//!
//! `--rate` measures the cost of one operation against the QP count instead: 64,000 WRITEs
//! (`--ops`), 64 (`--window`) outstanding at any time, WRITE k on pair k mod N; it prints the
//! wall time per WRITE and its ratio to the first (1 pair by default).
//!
//! ```text
//! cargo run --release -p softrdma --example qp_scale -- --pairs 8000
//! cargo run --release -p softrdma --example qp_scale -- --table
//! cargo run --release -p softrdma --example qp_scale -- --rate --pairs 1,100,1000,8000
//! ```

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use softrdma::verbs::*;

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// QP pairs.
    pub pairs: usize,
    /// Create and connect, per pair (µs).
    pub connect_us: f64,
    /// First post to last completion, per WRITE (µs).
    pub write_us: f64,
    /// Resident memory added per QP (bytes), QPs created and connected, one WRITE done.
    pub rss_per_qp: f64,
    /// WRITEs that completed successfully.
    pub ok: usize,
    /// WRITEs whose data was placed.
    pub placed: usize,
    /// Retransmissions over all requesters.
    pub retransmits: u64,
    /// Local ACK timeouts the WRITEs' own latencies allow: the sum over WRITEs of
    /// floor((completion - post) / timeout). A requester retransmits a one-packet WRITE once
    /// per expiry of its timer, and the timer restarts on each send, so a correct one never
    /// retransmits more often than this, however slowly the machine runs.
    pub expiries_allowed: u64,
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Two devices with `pairs` connected RC QP pairs (send queues of `depth`), a source region
/// holding every pair's pattern and a destination region on the other device.
pub struct Pairs {
    /// Kept open for as long as the QPs live.
    _devices: (Device, Device),
    cq: Cq,
    src: Mr,
    dst: Mr,
    pattern: Vec<u8>,
    qps: Vec<(Qp, Qp)>,
    /// Create and connect, per pair (µs).
    pub connect_us: f64,
    rss0: u64,
}

/// Bytes per WRITE.
const LEN: usize = 64;

impl Pairs {
    /// Open the devices on `ip_a` and `ip_b` (UDP port `port`) and connect `pairs` pairs.
    pub fn connect(pairs: usize, depth: u32, ip_a: IpAddr, ip_b: IpAddr, port: u16) -> Pairs {
        let open = |ip| {
            let mut cfg = DeviceConfig::new(ip);
            cfg.port = port;
            cfg.pin_mode = PinMode::OnDemand;
            if let Some(b) = std::env::var("QP_SCALE_SOCKBUF")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                cfg.socket_buffer = b;
            }
            Device::open(cfg).expect("open device")
        };
        let (da, db) = (open(ip_a), open(ip_b));
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let cqe = (pairs * depth as usize + 16).min(1 << 20) as u32;
        let (cqa, cqb) = (
            da.create_cq(cqe, None).unwrap(),
            db.create_cq(cqe, None).unwrap(),
        );
        let src = pa
            .reg_buffer(vec![0u8; pairs * LEN], Access::LOCAL_WRITE)
            .unwrap();
        let dst = pb
            .reg_buffer(
                vec![0u8; pairs * LEN],
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
        // Every WRITE carries its own pattern: pair i's 64 bytes start with i.
        let mut pattern = vec![0u8; pairs * LEN];
        for (i, c) in pattern.chunks_mut(LEN).enumerate() {
            c[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
            c[8..].fill((i % 251) as u8 + 1);
        }
        src.write(0, &pattern).unwrap();
        let mut init = QpInitAttr::new(&cqa);
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = 4;
        let mut init_b = QpInitAttr::new(&cqb);
        init_b.cap = init.cap;

        let rss0 = rss_bytes();
        let t0 = Instant::now();
        let mut qps = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            let qa = pa.create_qp(&init).unwrap();
            let qb = pb.create_qp(&init_b).unwrap();
            let (sa, sb) = (random_psn(), random_psn());
            let mut attr = QpAttr {
                path_mtu: Mtu::Mtu1024,
                qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                dest_qp_num: qb.qp_num(),
                sq_psn: sa,
                rq_psn: sb,
                ..QpAttr::default()
            };
            qa.connect(ip_b, &attr).unwrap();
            attr.dest_qp_num = qa.qp_num();
            attr.sq_psn = sb;
            attr.rq_psn = sa;
            qb.connect(ip_a, &attr).unwrap();
            qps.push((qa, qb));
        }
        let connect = t0.elapsed();
        drop(cqb);
        Pairs {
            _devices: (da, db),
            cq: cqa,
            src,
            dst,
            pattern,
            qps,
            connect_us: connect.as_secs_f64() * 1e6 / pairs as f64,
            rss0,
        }
    }

    /// Post pair `i`'s WRITE (its 64 bytes to its place), work request id `i`.
    fn post(&self, i: usize) {
        assert!(self.try_post(i), "post_send on pair {i} refused");
    }

    /// [`Pairs::post`]; false when the send queue is full.
    fn try_post(&self, i: usize) -> bool {
        let sge = [self.src.sge((i * LEN) as u64, LEN as u32)];
        let wr = SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: self.dst.iova() + (i * LEN) as u64,
                rkey: self.dst.rkey(),
            },
        )
        .sg(&sge);
        self.qps[i].0.post_send(&wr).is_ok()
    }

    /// Poll completions until `want` more have arrived or `deadline` has passed; `each` sees
    /// every completion. Returns (completions, successes).
    fn reap(
        &self,
        want: usize,
        deadline: Duration,
        mut each: impl FnMut(&WorkCompletion),
    ) -> (usize, usize) {
        let t = Instant::now();
        let (mut done, mut ok) = (0, 0);
        while done < want && t.elapsed() < deadline {
            let (k, s) = self.poll_once(&mut each);
            (done, ok) = (done + k, ok + s);
            if k == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        (done, ok)
    }

    /// Poll the CQ once (up to 64 completions); `each` sees every completion. Returns
    /// (completions, successes).
    fn poll_once(&self, mut each: impl FnMut(&WorkCompletion)) -> (usize, usize) {
        let mut buf = [EMPTY_WC; 64];
        let k = self.cq.poll(&mut buf);
        let mut ok = 0;
        for w in &buf[..k] {
            if w.status == WcStatus::Success {
                ok += 1;
            } else {
                eprintln!("WRITE {} completed with {:?}", w.wr_id, w.status);
            }
            each(w);
        }
        (k, ok)
    }

    /// Pairs whose 64 bytes arrived intact.
    fn placed(&self) -> usize {
        self.dst
            .to_vec()
            .unwrap()
            .chunks(LEN)
            .zip(self.pattern.chunks(LEN))
            .filter(|(a, b)| a == b)
            .count()
    }

    /// Retransmissions over all requesters.
    fn retransmits(&self) -> u64 {
        self.qps
            .iter()
            .map(|(qa, _)| qa.counters().comp.retransmits)
            .sum()
    }
}

/// Run `pairs` QP pairs between devices on `ip_a` and `ip_b` (UDP port `port`): one WRITE
/// posted on every pair at once.
pub fn run(pairs: usize, ip_a: IpAddr, ip_b: IpAddr, port: u16) -> Figures {
    let p = Pairs::connect(pairs, 4, ip_a, ip_b, port);
    let t1 = Instant::now();
    let timeout_ns =
        softrdma::rc::timer::ack_timeout_ns(QpAttr::default().timeout).unwrap_or(u64::MAX);
    let mut posted = Vec::with_capacity(pairs);
    let mut expiries_allowed = 0u64;
    // A completion's latency is taken when it is polled: completions are also polled while
    // posting (every 64 WRITEs), so that early ones do not wait in the CQ for the last post.
    let mut note = |posted: &[Instant], w: &WorkCompletion| {
        if let Some(t) = posted.get(w.wr_id as usize) {
            expiries_allowed += t.elapsed().as_nanos() as u64 / timeout_ns;
        }
    };
    let (mut done, mut ok) = (0, 0);
    for i in 0..pairs {
        posted.push(Instant::now());
        p.post(i);
        if i % 64 == 63 {
            let (d, k) = p.poll_once(|w| note(&posted, w));
            (done, ok) = (done + d, ok + k);
        }
    }
    let deadline = Duration::from_secs(5 + pairs as u64 / 1000);
    let (_, k) = p.reap(pairs - done, deadline, |w| note(&posted, w));
    let ok = ok + k;
    let write = t1.elapsed();
    let rss1 = rss_bytes();
    Figures {
        pairs,
        connect_us: p.connect_us,
        write_us: write.as_secs_f64() * 1e6 / pairs as f64,
        rss_per_qp: rss1.saturating_sub(p.rss0) as f64 / (2 * pairs) as f64,
        ok,
        placed: p.placed(),
        retransmits: p.retransmits(),
        expiries_allowed,
    }
}

/// What a message-rate run measured.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    /// QP pairs.
    pub pairs: usize,
    /// Send queue depth of each pair.
    pub depth: u32,
    /// WRITEs completed successfully.
    pub ok: usize,
    /// Wall time per WRITE (µs): the cost of one operation at this QP count.
    pub write_us: f64,
    /// Retransmissions over all requesters.
    pub retransmits: u64,
    /// Pairs whose data was placed.
    pub placed: usize,
    /// Packets the responding device sent per WRITE (acknowledgements: below 1 when one
    /// acknowledges several WRITEs of a QP).
    pub acks_per_op: f64,
}

/// Message rate over `pairs` QP pairs: `ops` WRITEs in all, `window` outstanding at any time
/// whatever the QP count, WRITE k on pair k mod `pairs` (round-robin: with thousands of QPs
/// every WRITE finds its QP's state cold). The per-operation cost then grows only with what
/// the QP count costs, not with a deeper queue.
pub fn rate(
    pairs: usize,
    ops: usize,
    window: usize,
    ip_a: IpAddr,
    ip_b: IpAddr,
    port: u16,
) -> Rate {
    // Completions come back out of order across QPs: a few WRs of slack per QP.
    let depth = window.div_ceil(pairs).clamp(1, 64) as u32 + 3;
    let p = Pairs::connect(pairs, depth, ip_a, ip_b, port);
    let mut next = 0;
    // Post WRITE `next` on its pair, or (its send queue full) on the next pairs.
    let post_next = |next: &mut usize| {
        for _ in 0..pairs {
            let i = *next % pairs;
            *next += 1;
            if p.try_post(i) {
                return;
            }
        }
    };
    let t = Instant::now();
    for _ in 0..window.min(ops) {
        post_next(&mut next);
    }
    let deadline = Duration::from_secs(10 + ops as u64 / 10_000);
    let mut posted = window.min(ops);
    let (_, ok) = p.reap(ops, deadline, |_| {
        if posted < ops {
            post_next(&mut next);
            posted += 1;
        }
    });
    let elapsed = t.elapsed();
    let acks = p._devices.1.counters().tx_packets.load(Ordering::Relaxed);
    if std::env::var_os("QP_SCALE_DEBUG").is_some() {
        for d in [&p._devices.0, &p._devices.1] {
            eprintln!("{:?}", d.counters());
        }
    }
    Rate {
        pairs,
        depth,
        ok,
        write_us: elapsed.as_secs_f64() * 1e6 / ops as f64,
        retransmits: p.retransmits(),
        placed: p.placed(),
        acks_per_op: acks as f64 / ops as f64,
    }
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|x| x == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let rate_mode = args.iter().any(|a| a == "--rate");
    let list: Vec<usize> = match arg("--pairs") {
        Some(s) => s.split(',').filter_map(|v| v.parse().ok()).collect(),
        None if rate_mode => vec![1, 10, 100, 1000, 4000, 8000],
        None if args.iter().any(|a| a == "--table") => vec![1, 10, 100, 1000, 8000],
        None => vec![1000],
    };
    if rate_mode {
        let ops: usize = arg("--ops").and_then(|v| v.parse().ok()).unwrap_or(64_000);
        let window: usize = arg("--window").and_then(|v| v.parse().ok()).unwrap_or(64);
        println!(
            "pairs    qps  sq  write_us/op  ratio_to_first      ok  placed  retransmits  acks/op"
        );
        let mut first = None;
        for (k, &n) in list.iter().enumerate() {
            let a = IpAddr::from([127, 0, 6, 2 * k as u8 + 1]);
            let b = IpAddr::from([127, 0, 6, 2 * k as u8 + 2]);
            let r = rate(n, ops.max(n), window, a, b, 24900);
            let base = *first.get_or_insert(r.write_us);
            println!(
                "{:>5}  {:>5}  {:>2}  {:>11.2}  {:>14.2}  {:>6}  {:>6}  {:>11}  {:>7.2}",
                r.pairs,
                2 * r.pairs,
                r.depth,
                r.write_us,
                r.write_us / base,
                r.ok,
                r.placed,
                r.retransmits,
                r.acks_per_op
            );
        }
        return;
    }
    println!("pairs  connect_us/pair  write_us/op  rss_bytes/qp  ok  placed  retransmits");
    let mut first: Option<Figures> = None;
    for (k, &n) in list.iter().enumerate() {
        // A fresh pair of addresses per run (sockets of the run before may linger).
        let a = IpAddr::from([127, 0, 6, 2 * k as u8 + 1]);
        let b = IpAddr::from([127, 0, 6, 2 * k as u8 + 2]);
        let f = run(n, a, b, 24900);
        println!(
            "{:>5}  {:>15.1}  {:>11.2}  {:>12.0}  {:>5}  {:>6}  {:>11}",
            f.pairs, f.connect_us, f.write_us, f.rss_per_qp, f.ok, f.placed, f.retransmits
        );
        if let Some(b) = first {
            println!(
                "       ratio to {} pairs: connect {:.2}x, WRITE {:.2}x",
                b.pairs,
                f.connect_us / b.connect_us,
                f.write_us / b.write_us
            );
        } else {
            first = Some(f);
        }
    }
}
