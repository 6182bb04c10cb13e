//! A distributed spin-lock on RDMA Compare&Swap, shared by three processes.
//!
//! The *home* process owns an 8-byte lock word and an 8-byte counter in one registered
//! region. Each *worker* connects an RC QP to it and, `--rounds` times: acquires the lock with
//! Compare&Swap (0 → its id, retried until it succeeds), READs the counter, WRITEs it back
//! plus one — a read-modify-write that is only correct under the lock — and releases the lock
//! with Compare&Swap (its id → 0). Requests on one QP execute in order at the responder, so
//! the WRITE is placed before the releasing atomic runs. When every worker is done, home
//! checks that the counter equals workers × rounds.
//!
//! ```text
//! cargo run --release --example spinlock -- --home 127.0.0.10 --workers 3 &
//! for i in 1 2 3; do cargo run --release --example spinlock -- --worker $i --local 127.0.0.1$i --home 127.0.0.10 & done
//! ```
//! `--demo` runs home and three workers as four processes and reports.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::verbs::*;

const PORT: u16 = 18600;

fn arg(name: &str) -> Option<String> {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1).cloned())
}

fn flag(name: &str) -> bool {
    std::env::args().any(|x| x == name)
}

fn open(ip: IpAddr) -> Result<(Device, Pd, Cq), VerbsError> {
    let mut cfg = DeviceConfig::new(ip);
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(64, None)?;
    Ok((dev, pd, cq))
}

fn attr(qpn: u32, psn: u32, peer_psn: u32) -> QpAttr {
    QpAttr {
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: qpn,
        sq_psn: psn,
        rq_psn: peer_psn,
        qp_access_flags: Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn home(ip: IpAddr, workers: usize) -> Res<u64> {
    let (_dev, pd, cq) = open(ip)?;
    let mr = pd.alloc_mr(
        16,
        Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
    )?;
    let lis = TcpListener::bind((ip, PORT))?;
    let mut conns = Vec::new();
    for _ in 0..workers {
        let (s, _) = lis.accept()?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut line = String::new();
        r.read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let (wip, wqpn, wpsn): (IpAddr, u32, u32) = (f[0].parse()?, f[1].parse()?, f[2].parse()?);
        let qp = pd.create_qp(&QpInitAttr::new(&cq))?;
        let psn = random_psn();
        qp.connect(wip, &attr(wqpn, psn, wpsn))?;
        writeln!(&s, "{} {} {} {}", qp.qp_num(), psn, mr.rkey(), mr.iova())?;
        conns.push((qp, r));
    }
    // Wait for every worker's "done".
    let mut total = 0;
    for (_, r) in &mut conns {
        let mut line = String::new();
        r.read_line(&mut line)?;
        total += line
            .trim()
            .strip_prefix("done ")
            .ok_or("worker failed")?
            .parse::<u64>()?;
    }
    let mut b = [0u8; 16];
    mr.read(0, &mut b)?;
    let lock = u64::from_ne_bytes(b[..8].try_into()?);
    let counter = u64::from_ne_bytes(b[8..].try_into()?);
    println!("home: lock word {lock}, counter {counter}, expected {total}");
    if lock != 0 || counter != total {
        return Err("the lock did not protect the counter".into());
    }
    Ok(counter)
}

fn worker(id: u64, ip: IpAddr, home: IpAddr, rounds: u64) -> Res<()> {
    let (_dev, pd, cq) = open(ip)?;
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE)?;
    let qp = pd.create_qp(&QpInitAttr::new(&cq))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = loop {
        match TcpStream::connect((home, PORT)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let psn = random_psn();
    writeln!(&s, "{} {} {}", ip, qp.qp_num(), psn)?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let f: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse())
        .collect::<Result<_, _>>()?;
    qp.connect(home, &attr(f[0] as u32, psn, f[1] as u32))?;
    let (rkey, lock, counter) = (f[2] as u32, f[3], f[3] + 8);
    let run = |wr: SendWr<'_>| -> Res<()> {
        qp.post_send(&wr)?;
        let w = cq.wait(1, Duration::from_secs(30));
        match w.first() {
            Some(w) if w.status == WcStatus::Success => Ok(()),
            other => Err(format!("worker {id}: {other:?}").into()),
        }
    };
    let cas = |compare, swap| -> Res<u64> {
        let sge = [mr.sge(0, 8)];
        run(SendWr::new(
            1,
            WrOpcode::AtomicCmpAndSwp {
                remote_addr: lock,
                rkey,
                compare,
                swap,
            },
        )
        .sg(&sge))?;
        let mut b = [0u8; 8];
        mr.read(0, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    };
    let mut spins = 0u64;
    for _ in 0..rounds {
        while cas(0, id)? != 0 {
            spins += 1; // held by someone else
            if Instant::now() > deadline {
                return Err("lock never acquired".into());
            }
        }
        let sge = [mr.sge(8, 8)];
        run(SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote_addr: counter,
                rkey,
            },
        )
        .sg(&sge))?;
        let mut b = [0u8; 8];
        mr.read(8, &mut b)?;
        mr.write(8, &(u64::from_ne_bytes(b) + 1).to_ne_bytes())?;
        run(SendWr::new(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: counter,
                rkey,
            },
        )
        .sg(&sge))?;
        if cas(id, 0)? != id {
            return Err("released a lock we did not hold".into());
        }
    }
    writeln!(&s, "done {rounds}")?;
    println!("worker {id}: {rounds} rounds, {spins} failed acquisitions");
    Ok(())
}

fn main() -> Res<()> {
    let home_ip: IpAddr = arg("--home")
        .unwrap_or_else(|| "127.0.0.10".into())
        .parse()?;
    let rounds: u64 = arg("--rounds").map_or(Ok(200), |s| s.parse())?;
    if flag("--demo") {
        let me = std::env::current_exe()?;
        let r = rounds.to_string();
        let mut kids = vec![
            std::process::Command::new(&me)
                .args([
                    "--home-only",
                    "--workers",
                    "3",
                    "--home",
                    &home_ip.to_string(),
                ])
                .spawn()?,
        ];
        for i in 1..=3u8 {
            // Workers sit on the addresses after home's.
            let IpAddr::V4(h) = home_ip else {
                return Err("--demo needs an IPv4 home".into());
            };
            let o = h.octets();
            let local = format!("{}.{}.{}.{}", o[0], o[1], o[2], o[3].wrapping_add(i));
            kids.push(
                std::process::Command::new(&me)
                    .args([
                        "--worker",
                        &i.to_string(),
                        "--local",
                        &local,
                        "--home",
                        &home_ip.to_string(),
                        "--rounds",
                        &r,
                    ])
                    .spawn()?,
            );
        }
        let mut ok = true;
        for mut k in kids {
            ok &= k.wait()?.success();
        }
        return if ok {
            Ok(())
        } else {
            Err("a process failed".into())
        };
    }
    if let Some(id) = arg("--worker") {
        let local: IpAddr = arg("--local").ok_or("--local IP is required")?.parse()?;
        return worker(id.parse()?, local, home_ip, rounds);
    }
    let workers: usize = arg("--workers").map_or(Ok(3), |s| s.parse())?;
    home(home_ip, workers)?;
    Ok(())
}
