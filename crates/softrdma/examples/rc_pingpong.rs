//! `rc_pingpong`: ping-pong of SENDs over an RC QP, with the out-of-band exchange of rdma-core's
//! `ibv_rc_pingpong` (TCP, `LID:QPN:PSN:GID`), so either side can be the Debian tool.
//!
//! ```text
//! cargo run --release --example rc_pingpong -- --local 127.0.0.2            # server
//! cargo run --release --example rc_pingpong -- --local 127.0.0.1 127.0.0.2  # client
//! ```
//! Options as the C tool: `-p PORT` (18515), `-s SIZE` (4096), `-n ITERS` (1000),
//! `-r RX_DEPTH` (500), `-m MTU` (1024), `-e` (sleep on a completion channel), `-g IDX`
//! (accepted for compatibility; the GID is the device address). `--poll-fd` sleeps as an
//! epoll or async application does instead: a busy-poll device, `poll(2)` on the channel's
//! descriptor and a non-blocking `get_event` when it is readable (implies `-e`).

use std::net::{IpAddr, TcpListener};
use std::time::{Duration, Instant};

use softrdma::verbs::connect::{self, Dest};
use softrdma::verbs::*;

struct Opts {
    local: IpAddr,
    server: Option<String>,
    port: u16,
    size: u32,
    iters: u64,
    rx_depth: u32,
    mtu: Mtu,
    events: bool,
    poll_fd: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: rc_pingpong [--local IP] [-p port] [-s size] [-n iters] [-r rx_depth] [-m mtu] [-e] [--poll-fd] [-g idx] [server]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        local: IpAddr::from([127, 0, 0, 1]),
        server: None,
        port: 18515,
        size: 4096,
        iters: 1000,
        rx_depth: 500,
        mtu: Mtu::Mtu1024,
        events: false,
        poll_fd: false,
    };
    let mut a = std::env::args().skip(1);
    while let Some(x) = a.next() {
        let mut val = || a.next().unwrap_or_else(|| usage());
        match x.as_str() {
            "--local" => o.local = val().parse().unwrap_or_else(|_| usage()),
            "-p" => o.port = val().parse().unwrap_or_else(|_| usage()),
            "-s" => o.size = val().parse().unwrap_or_else(|_| usage()),
            "-n" => o.iters = val().parse().unwrap_or_else(|_| usage()),
            "-r" => o.rx_depth = val().parse().unwrap_or_else(|_| usage()),
            "-g" | "-d" | "-i" => {
                val();
            }
            "-m" => {
                o.mtu = match val().as_str() {
                    "256" => Mtu::Mtu256,
                    "512" => Mtu::Mtu512,
                    "1024" => Mtu::Mtu1024,
                    "2048" => Mtu::Mtu2048,
                    "4096" => Mtu::Mtu4096,
                    _ => usage(),
                }
            }
            "-e" => o.events = true,
            "--poll-fd" => {
                o.events = true;
                o.poll_fd = true;
            }
            s if !s.starts_with('-') => o.server = Some(s.to_owned()),
            _ => usage(),
        }
    }
    o
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse();
    let mut cfg = DeviceConfig::new(o.local);
    cfg.mode = if o.events && !o.poll_fd {
        PollMode::Blocking
    } else {
        PollMode::BusyPoll
    };
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let ch = dev.create_comp_channel()?;
    let cq = dev.create_cq(o.rx_depth + 1, o.events.then_some(&ch))?;
    let mr = pd.alloc_mr(o.size as usize, Access::LOCAL_WRITE)?;
    let mut init = QpInitAttr::new(&cq);
    init.cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: o.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd.create_qp(&init)?;
    let my = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid: dev.gid(),
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        0,
        my.qpn,
        my.psn,
        dev.addr()
    );

    let attr = |rem: &Dest| QpAttr {
        path_mtu: o.mtu,
        dest_qp_num: rem.qpn,
        rq_psn: rem.psn,
        sq_psn: my.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    let timeout = Duration::from_secs(30);
    let rem = match &o.server {
        Some(host) => {
            let rem = connect::client((host.as_str(), o.port), &my, timeout)?;
            qp.connect(rem.ip(), &attr(&rem))?;
            rem
        }
        None => {
            let lis = TcpListener::bind((o.local, o.port))?;
            let (s, rem) = connect::server_accept(&lis, timeout)?;
            qp.connect(rem.ip(), &attr(&rem))?;
            connect::server_finish(s, &my)?;
            rem
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        rem.ip()
    );

    let sge = [mr.sge(0, o.size)];
    for _ in 0..o.rx_depth {
        qp.post_recv(&RecvWr {
            wr_id: RECV_WRID,
            sg_list: &sge,
        })?;
    }
    if o.events {
        cq.req_notify(false);
    }
    let send = || {
        qp.post_send(
            &SendWr::new(SEND_WRID, WrOpcode::Send)
                .sg(&sge)
                .flags(SendFlags::SIGNALED),
        )
    };
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    // pending: what the current iteration still waits for (like the C tool's bitmask).
    let mut pending = RECV_WRID;
    if o.server.is_some() {
        send()?;
        pending |= SEND_WRID;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut wc = [EMPTY_WC; 2];
    while rcnt < o.iters || scnt < o.iters {
        if Instant::now() > deadline {
            return Err("timed out".into());
        }
        if o.poll_fd {
            // Sleep until the descriptor is readable (an event, or on a busy-poll device a
            // datagram), then take what is there without waiting.
            let mut p = libc::pollfd {
                fd: ch.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 1000) };
            if ch.get_event(Some(Duration::ZERO))?.is_some() {
                cq.req_notify(false);
            }
        } else if o.events && ch.get_event(Some(Duration::from_secs(30)))?.is_some() {
            cq.req_notify(false);
        }
        let n = cq.poll(&mut wc);
        for w in &wc[..n] {
            if w.status != WcStatus::Success {
                return Err(format!("failed status {:?} for wr_id {}", w.status, w.wr_id).into());
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    qp.post_recv(&RecvWr {
                        wr_id: RECV_WRID,
                        sg_list: &sge,
                    })?;
                }
                id => return Err(format!("completion for unknown wr_id {id}").into()),
            }
            pending &= !w.wr_id;
            if pending == 0 && scnt < o.iters {
                send()?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = o.size as f64 * o.iters as f64 * 2.0;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        secs,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        secs,
        secs * 1e6 / o.iters as f64
    );
    Ok(())
}
