//! `write_bw`: the smallest useful RDMA WRITE bandwidth test on the verbs API. The server
//! registers a buffer and publishes its address and R_Key; the client streams WRITEs into it
//! with `--depth` requests in flight and prints the bandwidth. (`softrdma perf write_bw` is the
//! full tool.)
//!
//! ```text
//! cargo run --release --example write_bw -- --local 127.0.0.2                 # server
//! cargo run --release --example write_bw -- --local 127.0.0.1 --server 127.0.0.2
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::verbs::*;

fn arg(name: &str, default: &str) -> String {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let local: IpAddr = arg("--local", "127.0.0.1").parse()?;
    let size: u32 = arg("--size", "65536").parse()?;
    let count: u64 = arg("--count", "20000").parse()?;
    let depth: u64 = arg("--depth", "64").parse()?;
    let mut cfg = DeviceConfig::new(local);
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(256, None)?;
    let mut init = QpInitAttr::new(&cq);
    init.cap.max_send_wr = depth as u32 + 1;
    let qp = pd.create_qp(&init)?;
    let mr = pd.alloc_mr(size as usize, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let psn = random_psn();
    let attr = |qpn: u32, peer_psn: u32| QpAttr {
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: qpn,
        sq_psn: psn,
        rq_psn: peer_psn,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let me = format!(
        "{} {} {} {} {}\n",
        local,
        qp.qp_num(),
        psn,
        mr.rkey(),
        mr.iova()
    );
    let server = arg("--server", "");
    if server.is_empty() {
        let (s, _) = TcpListener::bind((local, 18700))?.accept()?;
        let mut line = String::new();
        BufReader::new(s.try_clone()?).read_line(&mut line)?;
        let f: Vec<&str> = line.split_whitespace().collect();
        qp.connect(f[0].parse()?, &attr(f[1].parse()?, f[2].parse()?))?;
        (&s).write_all(me.as_bytes())?;
        // Wait until the client closes the connection.
        let mut rest = String::new();
        let _ = BufReader::new(s).read_line(&mut rest);
        return Ok(());
    }
    let s = TcpStream::connect((server.parse::<IpAddr>()?, 18700))?;
    (&s).write_all(me.as_bytes())?;
    let mut line = String::new();
    BufReader::new(s.try_clone()?).read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    qp.connect(f[0].parse()?, &attr(f[1].parse()?, f[2].parse()?))?;
    let (rkey, vaddr): (u32, u64) = (f[3].parse()?, f[4].parse()?);
    let sge = [mr.sge(0, size)];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wc = [EMPTY_WC; 32];
    let t0 = Instant::now();
    while done < count {
        while posted < count && posted - done < depth {
            // Signal every 16th request and the last; completions retire in order.
            let flags = if posted % 16 == 15 || posted + 1 == count {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            qp.post_send(
                &SendWr::new(
                    posted,
                    WrOpcode::RdmaWrite {
                        remote_addr: vaddr,
                        rkey,
                    },
                )
                .sg(&sge)
                .flags(flags),
            )?;
            posted += 1;
        }
        let n = cq.poll(&mut wc);
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!("{:?}", w.status).into());
            }
            done = w.wr_id + 1;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err("timed out".into());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{count} WRITEs of {size} B in {secs:.3} s: {:.1} MB/s",
        count as f64 * f64::from(size) / secs / 1e6
    );
    Ok(())
}
