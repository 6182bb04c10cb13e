//! `qp_scale`: many RC QP pairs between two devices of one process, on loopback. Connects
//! `--pairs N` pairs, then posts one 64-byte WRITE on each at once and waits for all of them;
//! prints the connect cost per pair, the WRITE cost per operation (all posted to all
//! completed, divided by N), the resident memory per QP and whether every WRITE's data was
//! placed. `--table` runs 1, 10, 100, 1000 and 8000 pairs (or the `--pairs` list given,
//! comma-separated) and prints one line each.
//!
//! ```text
//! cargo run --release -p softrdma --example qp_scale -- --pairs 8000
//! cargo run --release -p softrdma --example qp_scale -- --table
//! ```

use std::net::IpAddr;
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

/// Run `pairs` QP pairs between devices on `ip_a` and `ip_b` (UDP port `port`).
pub fn run(pairs: usize, ip_a: IpAddr, ip_b: IpAddr, port: u16) -> Figures {
    const LEN: usize = 64;
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
    let cqe = (pairs + 16).min(1 << 20) as u32;
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
    init.cap.max_send_wr = 4;
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

    let t1 = Instant::now();
    for (i, (qa, _)) in qps.iter().enumerate() {
        let sge = [src.sge((i * LEN) as u64, LEN as u32)];
        let wr = SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite {
                remote_addr: dst.iova() + (i * LEN) as u64,
                rkey: dst.rkey(),
            },
        )
        .sg(&sge);
        qa.post_send(&wr).unwrap();
    }
    let deadline = Duration::from_secs(5 + pairs as u64 / 1000);
    let mut ok = 0;
    let mut done = 0;
    let mut buf = [EMPTY_WC; 64];
    while done < pairs && t1.elapsed() < deadline {
        let k = cqa.poll(&mut buf);
        for w in &buf[..k] {
            done += 1;
            if w.status == WcStatus::Success {
                ok += 1;
            } else if done - ok <= 3 {
                eprintln!("WRITE {} completed with {:?}", w.wr_id, w.status);
            }
        }
        if k == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let write = t1.elapsed();
    let rss1 = rss_bytes();
    let placed = dst
        .to_vec()
        .unwrap()
        .chunks(LEN)
        .zip(pattern.chunks(LEN))
        .filter(|(a, b)| a == b)
        .count();
    let retransmits = qps
        .iter()
        .map(|(qa, _)| qa.counters().comp.retransmits)
        .sum();
    Figures {
        pairs,
        connect_us: connect.as_secs_f64() * 1e6 / pairs as f64,
        write_us: write.as_secs_f64() * 1e6 / pairs as f64,
        rss_per_qp: rss1.saturating_sub(rss0) as f64 / (2 * pairs) as f64,
        ok,
        placed,
        retransmits,
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
    let list: Vec<usize> = match arg("--pairs") {
        Some(s) => s.split(',').filter_map(|v| v.parse().ok()).collect(),
        None if args.iter().any(|a| a == "--table") => vec![1, 10, 100, 1000, 8000],
        None => vec![1000],
    };
    println!("pairs  connect_us/pair  write_us/op  rss_bytes/qp  ok  placed  retransmits");
    for (k, &n) in list.iter().enumerate() {
        // A fresh pair of addresses per run (sockets of the run before may linger).
        let a = IpAddr::from([127, 0, 6, 2 * k as u8 + 1]);
        let b = IpAddr::from([127, 0, 6, 2 * k as u8 + 2]);
        let f = run(n, a, b, 24900);
        println!(
            "{:>5}  {:>15.1}  {:>11.2}  {:>12.0}  {:>5}  {:>6}  {:>11}",
            f.pairs, f.connect_us, f.write_us, f.rss_per_qp, f.ok, f.placed, f.retransmits
        );
    }
}
