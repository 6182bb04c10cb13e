//! `interop-peer`: softrdma's end of the interop tests, over the native Rust verbs API. The
//! other end is `c/rdma_peer.c` on Linux rdma_rxe (or another `interop-peer`); the protocol
//! is described in the crate documentation.
//!
//! ```text
//! interop-peer --ip 10.77.0.1 --role active|passive (--server IP:PORT | --listen PORT)
//!              [--mtu 1024|4096] [--gso on|off] [--busy-poll] [--timeout SECS]
//! ```
//! Exit status 0 only when every check passed (for the active side: its own and the peer's).
//! The last line is `counters: ...` (datapath and QP counters, `rx_icrc_solved` among them).

use std::io::{BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use softrdma::verbs::*;
use softrdma_interop::*;

struct Opts {
    ip: IpAddr,
    active: bool,
    server: Option<SocketAddr>,
    listen: Option<u16>,
    mtu: Mtu,
    gso: bool,
    busy: bool,
    timeout: Duration,
}

fn usage() -> ! {
    eprintln!(
        "usage: interop-peer --ip ADDR --role active|passive (--server IP:PORT | --listen PORT) \
         [--mtu 1024|4096] [--gso on|off] [--busy-poll] [--timeout SECS]"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        ip: IpAddr::from([10, 77, 0, 1]),
        active: false,
        server: None,
        listen: None,
        mtu: Mtu::Mtu1024,
        gso: false,
        busy: false,
        timeout: Duration::from_secs(120),
    };
    let mut role = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--ip" => o.ip = val().parse().unwrap_or_else(|_| usage()),
            "--role" => role = Some(val()),
            "--server" => o.server = Some(val().parse().unwrap_or_else(|_| usage())),
            "--listen" => o.listen = Some(val().parse().unwrap_or_else(|_| usage())),
            "--mtu" => {
                o.mtu = val()
                    .parse()
                    .ok()
                    .and_then(Mtu::from_bytes)
                    .unwrap_or_else(|| usage())
            }
            "--gso" => o.gso = val() == "on",
            "--busy-poll" => o.busy = true,
            "--timeout" => {
                o.timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage()))
            }
            _ => usage(),
        }
    }
    match role.as_deref() {
        Some("active") => o.active = true,
        Some("passive") => o.active = false,
        _ => usage(),
    }
    if o.server.is_some() == o.listen.is_some() {
        usage();
    }
    o
}

struct Run {
    dev: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    deadline: Instant,
    errors: usize,
}

impl Run {
    fn fail(&mut self, msg: String) {
        println!("FAIL: {msg}");
        self.errors += 1;
    }

    /// One completion, or an error at the deadline.
    fn wc(&self) -> Result<WorkCompletion, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.cq
            .wait(1, left)
            .first()
            .copied()
            .ok_or_else(|| "timed out waiting for a completion".to_string())
    }

    fn post(&self, wr: &SendWr<'_>) -> Result<(), String> {
        self.qp
            .post_send(wr)
            .map_err(|e| format!("post_send {}: {e}", wr.wr_id))
    }

    fn active(&mut self, peer: &Hello) -> Result<(), String> {
        for (r, &len) in SIZES.iter().enumerate() {
            let off = slice_off(r);
            let rd = [self.mr.sge(area(Area::D) + off, len)];
            let wrs = [self.mr.sge(area(Area::S) + off, len)];
            let snd = [self.mr.sge(area(Area::X) + off, len)];
            let base = r as u64 * 3;
            let read = WrOpcode::RdmaRead {
                remote_addr: peer.addr + area(Area::R) + off,
                rkey: peer.rkey,
            };
            let write = WrOpcode::RdmaWrite {
                remote_addr: peer.addr + area(Area::W) + off,
                rkey: peer.rkey,
            };
            let send = WrOpcode::SendWithImm {
                imm: IMM_BASE + r as u32,
            };
            let sig = SendFlags::SIGNALED;
            self.post(&SendWr::new(base, read).sg(&rd).flags(sig))?;
            // The WRITE is unsignaled: it asks for no ACK, and rxe (which acknowledges only
            // what asks) acknowledges it with the SEND behind it.
            self.post(&SendWr::new(base + 1, write).sg(&wrs).flags(SendFlags::NONE))?;
            self.post(&SendWr::new(base + 2, send).sg(&snd).flags(sig))?;
            for k in [0, 2] {
                let wc = self.wc()?;
                if wc.status != WcStatus::Success || wc.wr_id != base + k {
                    return Err(format!("round {r} ({len} bytes): {wc:?}"));
                }
            }
            let mut got = vec![0u8; len as usize];
            self.mr
                .read(area(Area::D) + off, &mut got)
                .map_err(|e| e.to_string())?;
            if let Some(i) = first_mismatch(&got, SEED_R, off) {
                self.fail(format!("READ of {len} bytes: byte {i} differs"));
            }
        }
        for (k, a) in ATOMICS.iter().enumerate() {
            let remote_addr = peer.addr + area(Area::A) + 8 * a.word;
            let op = if a.cas {
                WrOpcode::AtomicCmpAndSwp {
                    remote_addr,
                    rkey: peer.rkey,
                    compare: a.x,
                    swap: a.y,
                }
            } else {
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr,
                    rkey: peer.rkey,
                    add: a.x,
                }
            };
            let res = [self.mr.sge(OFF_AR + 8 * k as u64, 8)];
            self.post(
                &SendWr::new(1000 + k as u64, op)
                    .sg(&res)
                    .flags(SendFlags::SIGNALED),
            )?;
            let wc = self.wc()?;
            if wc.status != WcStatus::Success {
                return Err(format!("atomic {k}: {wc:?}"));
            }
            let mut got = [0u8; 8];
            self.mr
                .read(OFF_AR + 8 * k as u64, &mut got)
                .map_err(|e| e.to_string())?;
            let got = u64::from_ne_bytes(got);
            if got != a.expect {
                self.fail(format!(
                    "atomic {k} returned {got:#x}, expected {:#x}",
                    a.expect
                ));
            }
        }
        let fin = WrOpcode::SendWithImm { imm: FIN_IMM };
        self.post(&SendWr::new(2000, fin).flags(SendFlags::SIGNALED))?;
        let wc = self.wc()?;
        if wc.status != WcStatus::Success {
            return Err(format!("FIN: {wc:?}"));
        }
        Ok(())
    }

    fn passive(&mut self) -> Result<(), String> {
        for r in 0..=SIZES.len() {
            let wc = self.wc()?;
            let (want_len, want_imm) = match SIZES.get(r) {
                Some(&len) => (len, IMM_BASE + r as u32),
                None => (0, FIN_IMM),
            };
            if wc.status != WcStatus::Success {
                return Err(format!("receive {r}: {wc:?}"));
            }
            if wc.opcode != WcOpcode::Recv
                || wc.imm_data != Some(want_imm)
                || wc.byte_len != want_len
                || wc.wr_id != 100 + r as u64
            {
                self.fail(format!("receive {r}: {wc:?}"));
            }
        }
        // The FIN's completion means every earlier WRITE and atomic is done.
        let region = self.mr.to_vec().map_err(|e| e.to_string())?;
        for (r, &len) in SIZES.iter().enumerate() {
            let off = slice_off(r);
            let at = |a: Area| &region[(area(a) + off) as usize..][..len as usize];
            if let Some(i) = first_mismatch(at(Area::W), SEED_S, off) {
                self.fail(format!("WRITE of {len} bytes: byte {i} differs"));
            }
            if let Some(i) = first_mismatch(at(Area::V), SEED_X, off) {
                self.fail(format!("SEND of {len} bytes: byte {i} differs"));
            }
        }
        let a = area(Area::A) as usize;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&region[a + 8 * i..a + 8 * i + 8]);
            u64::from_ne_bytes(w)
        };
        let words = [word(0), word(1)];
        if words != ATOMIC_FINAL {
            self.fail(format!("atomic words are {:#x} {:#x}", words[0], words[1]));
        }
        Ok(())
    }

    fn counters(&self) -> String {
        let c = self.dev.counters();
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "rx_packets={} rx_bad={} rx_icrc_solved={} rx_unknown_qp={} rx_wrong_peer={} \
             tx_packets={} tx_datagrams={} tx_errors={} qp={:?}",
            l(&c.rx_packets),
            l(&c.rx_bad),
            l(&c.rx_icrc_solved),
            l(&c.rx_unknown_qp),
            l(&c.rx_wrong_peer),
            l(&c.tx_packets),
            l(&c.tx_datagrams),
            l(&c.tx_errors),
            self.qp.counters()
        )
    }
}

fn run(o: &Opts) -> Result<usize, String> {
    let deadline = Instant::now() + o.timeout;
    let mut cfg = DeviceConfig::new(o.ip);
    cfg.active_mtu = o.mtu;
    cfg.gso = o.gso;
    cfg.pin_mode = PinMode::OnDemand;
    cfg.mode = if o.busy {
        PollMode::BusyPoll
    } else {
        PollMode::Blocking
    };
    let e = |what: &'static str| move |err: VerbsError| format!("{what}: {err}");
    let dev = Device::open(cfg).map_err(e("open device"))?;
    let pd = dev.alloc_pd().map_err(e("alloc_pd"))?;
    let cq = dev.create_cq(256, None).map_err(e("create_cq"))?;
    let qp = pd
        .create_qp(&QpInitAttr::new(&cq))
        .map_err(e("create_qp"))?;
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.reg_buffer(initial_region(), all).map_err(e("reg_mr"))?;

    let stream = match (o.server, o.listen) {
        (Some(addr), _) => {
            // The guest-side server may not listen yet: retry until the deadline.
            loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                    Ok(s) => break s,
                    Err(err) if Instant::now() > deadline => {
                        return Err(format!("connect {addr}: {err}"));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        }
        (None, Some(port)) => {
            let l = TcpListener::bind(SocketAddr::new(o.ip, port))
                .map_err(|err| format!("listen: {err}"))?;
            l.accept().map_err(|err| format!("accept: {err}"))?.0
        }
        (None, None) => unreachable!("checked by parse_opts"),
    };
    stream
        .set_read_timeout(Some(o.timeout))
        .map_err(|err| err.to_string())?;
    let mut w = stream.try_clone().map_err(|err| err.to_string())?;
    let mut r = BufReader::new(stream);
    let io = |err: std::io::Error| format!("tcp: {err}");

    let psn = random_psn();
    let me = Hello {
        qpn: qp.qp_num(),
        psn,
        gid: dev.gid(),
        addr: mr.iova(),
        rkey: mr.rkey(),
    };
    write_line(&mut w, &me.to_line()).map_err(io)?;
    let peer = Hello::parse(&read_line(&mut r).map_err(io)?).map_err(io)?;
    let remote_ip = {
        let v6 = std::net::Ipv6Addr::from(peer.gid);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    };
    let attr = QpAttr {
        path_mtu: o.mtu,
        qp_access_flags: all,
        dest_qp_num: peer.qpn,
        sq_psn: psn,
        rq_psn: peer.psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    qp.connect(remote_ip, &attr).map_err(e("connect"))?;
    if !o.active {
        for (r, &len) in SIZES.iter().enumerate() {
            let sge = [mr.sge(area(Area::V) + slice_off(r), len)];
            qp.post_recv(&RecvWr {
                wr_id: 100 + r as u64,
                sg_list: &sge,
            })
            .map_err(e("post_recv"))?;
        }
        qp.post_recv(&RecvWr {
            wr_id: 100 + SIZES.len() as u64,
            sg_list: &[],
        })
        .map_err(e("post_recv"))?;
    }
    write_line(&mut w, "R").map_err(io)?;
    if read_line(&mut r).map_err(io)? != "R" {
        return Err("peer not ready".into());
    }
    println!(
        "interop-peer: {} qpn {:#x} <-> {:#x} at {remote_ip}, mtu {}, gso {}",
        if o.active { "active" } else { "passive" },
        qp.qp_num(),
        peer.qpn,
        o.mtu.bytes(),
        o.gso
    );
    let mut run = Run {
        dev,
        cq,
        qp,
        mr,
        deadline,
        errors: 0,
    };
    let res = if o.active {
        run.active(&peer).and_then(|()| {
            let verdict = read_line(&mut r).map_err(io)?;
            println!("interop-peer: passive side says: {verdict}");
            if !verdict.starts_with("OK") {
                run.errors += 1;
            }
            Ok(())
        })
    } else {
        run.passive().and_then(|()| {
            let v = if run.errors == 0 { "OK" } else { "FAIL data" };
            write_line(&mut w, v).map_err(io)?;
            // Keep the QP until the active side has its FIN acknowledged and closes.
            let _ = read_line(&mut r);
            Ok(())
        })
    };
    println!("counters: {}", run.counters());
    let _ = w.flush();
    res.map(|()| run.errors)
}

fn main() -> ExitCode {
    let o = parse_opts();
    let role = if o.active { "active" } else { "passive" };
    match run(&o) {
        Ok(0) => {
            println!("interop-peer: {role} passed");
            ExitCode::SUCCESS
        }
        Ok(n) => {
            println!("interop-peer: {role} FAILED ({n} errors)");
            ExitCode::from(1)
        }
        Err(err) => {
            println!("interop-peer: {role} FAILED: {err}");
            ExitCode::from(2)
        }
    }
}
