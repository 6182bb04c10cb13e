//! `softrdma perf`: perftest's tests on softrdma, server and client as two processes.
//!
//! Out of band, the two sides talk over TCP in lines of text: each sends
//! `qpn psn rkey vaddr gid` once; then the client drives rounds with `run TEST SIZE ITERS`,
//! the server answers `ready` once it is set up (receives posted), both run, the client sends
//! `end` and the server answers `ok`.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::verbs::{
    Access, Cq, Device, DeviceConfig, EMPTY_WC, Mr, Mtu, PinMode, PollMode, Qp, QpAttr, QpCap,
    QpInitAttr, RecvWr, SendFlags, SendWr, WcStatus, WorkCompletion, WrOpcode, random_psn,
};

/// The tests, named as perftest names its programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// RDMA WRITE bandwidth (`ib_write_bw`).
    #[value(name = "write_bw")]
    WriteBw,
    /// RDMA READ bandwidth (`ib_read_bw`).
    #[value(name = "read_bw")]
    ReadBw,
    /// SEND bandwidth (`ib_send_bw`).
    #[value(name = "send_bw")]
    SendBw,
    /// Fetch&Add (or Compare&Swap with `--cas`) rate (`ib_atomic_bw`).
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// RDMA WRITE latency, ping-pong (`ib_write_lat`).
    #[value(name = "write_lat")]
    WriteLat,
    /// RDMA READ latency (`ib_read_lat`).
    #[value(name = "read_lat")]
    ReadLat,
    /// SEND latency, ping-pong (`ib_send_lat`).
    #[value(name = "send_lat")]
    SendLat,
}

impl Test {
    fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }
    fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::AtomicBw => "atomic_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
        }
    }
    fn parse(s: &str) -> Option<Test> {
        [
            Test::WriteBw,
            Test::ReadBw,
            Test::SendBw,
            Test::AtomicBw,
            Test::WriteLat,
            Test::ReadLat,
            Test::SendLat,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }
}

/// Options shared by both sides.
#[derive(Clone, Debug, clap::Args)]
pub struct PerfOpts {
    /// Message size in bytes (atomics are always 8).
    #[arg(long, short = 's', default_value_t = 65536)]
    pub size: usize,
    /// Every power of two from 64 B to 1 MiB, one row each.
    #[arg(long, short = 'a')]
    pub all: bool,
    /// Iterations per size (default: 5000 for bandwidth, 2000 for latency; fewer for sizes
    /// above 64 KiB so a row moves about 1 GiB).
    #[arg(long, short = 'n')]
    pub iters: Option<u64>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    pub mtu: u32,
    /// Engine mode: busy-poll (lowest latency) or blocking (lowest CPU).
    #[arg(long, value_enum, default_value_t = Mode::Busy)]
    pub mode: Mode,
    /// Outstanding work requests (bandwidth tests).
    #[arg(long, default_value_t = 128)]
    pub tx_depth: u32,
    /// TCP port of the out-of-band exchange.
    #[arg(long, default_value_t = 18515)]
    pub tcp_port: u16,
    /// Compare&Swap instead of Fetch&Add (atomic_bw).
    #[arg(long)]
    pub cas: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Engine mode, as a command-line value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Busy-poll.
    Busy,
    /// Blocking.
    Blocking,
}

fn mtu_of(v: u32) -> Mtu {
    match v {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Ctx {
    dev: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    mode: PollMode,
}

const MAX_SIZE: usize = 1 << 20;
const RX_DEPTH: u32 = 512;

fn open(local: IpAddr, opts: &PerfOpts, buf_len: usize) -> Res<Ctx> {
    let mut cfg = DeviceConfig::new(local);
    cfg.mode = if opts.mode == Mode::Busy {
        PollMode::BusyPoll
    } else {
        PollMode::Blocking
    };
    cfg.pin_mode = PinMode::OnDemand;
    cfg.active_mtu = mtu_of(opts.mtu);
    let mode = cfg.mode;
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let depth = opts.tx_depth.max(RX_DEPTH) * 2;
    let cq = dev.create_cq(depth, None)?;
    let mut init = QpInitAttr::new(&cq);
    init.cap = QpCap {
        max_send_wr: opts.tx_depth.max(16),
        max_recv_wr: RX_DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&init)?;
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(buf_len, access)?;
    Ok(Ctx {
        dev,
        cq,
        qp,
        mr,
        mode,
    })
}

struct Peer {
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    ip: IpAddr,
}

fn hello(c: &Ctx, psn: u32) -> String {
    let ip = c.dev.addr();
    format!(
        "{} {} {} {} {}\n",
        c.qp.qp_num(),
        psn,
        c.mr.rkey(),
        c.mr.iova(),
        ip
    )
}

fn parse_peer(line: &str) -> Res<Peer> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 {
        return Err(format!("bad exchange line {line:?}").into());
    }
    Ok(Peer {
        qpn: f[0].parse()?,
        psn: f[1].parse()?,
        rkey: f[2].parse()?,
        vaddr: f[3].parse()?,
        ip: f[4].parse()?,
    })
}

fn connect_qp(c: &Ctx, peer: &Peer, my_psn: u32, opts: &PerfOpts) -> Res<()> {
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let attr = QpAttr {
        path_mtu: mtu_of(opts.mtu),
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        sq_psn: my_psn,
        qp_access_flags: access,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    c.qp.connect(peer.ip, &attr)?;
    Ok(())
}

fn line(r: &mut impl BufRead) -> Res<String> {
    let mut s = String::new();
    if r.read_line(&mut s)? == 0 {
        return Err("peer closed the connection".into());
    }
    Ok(s.trim().to_owned())
}

fn iters_for(test: Test, size: usize, opts: &PerfOpts) -> u64 {
    opts.iters.unwrap_or_else(|| {
        let base: u64 = if test.is_bw() { 5000 } else { 2000 };
        let cap = ((1u64 << 30) / size.max(1) as u64).max(100);
        base.min(cap)
    })
}

fn sizes(test: Test, opts: &PerfOpts) -> Vec<usize> {
    if test == Test::AtomicBw {
        return vec![8];
    }
    if opts.all {
        (6..=20).map(|p| 1usize << p).collect()
    } else {
        vec![opts.size.clamp(1, MAX_SIZE)]
    }
}

/// Serve one client: answer rounds until it disconnects.
pub fn server(local: IpAddr, opts: &PerfOpts) -> Res<()> {
    let c = open(local, opts, MAX_SIZE * 2)?;
    let listener = TcpListener::bind(SocketAddr::new(local, opts.tcp_port))?;
    let (stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let peer = parse_peer(&line(&mut r)?)?;
    let psn = random_psn();
    w.write_all(hello(&c, psn).as_bytes())?;
    connect_qp(&c, &peer, psn, opts)?;
    loop {
        let cmd = match line(&mut r) {
            Ok(l) => l,
            Err(_) => return Ok(()),
        };
        let f: Vec<&str> = cmd.split_whitespace().collect();
        if f.first() == Some(&"bye") {
            return Ok(());
        }
        if f.len() != 4 || f[0] != "run" {
            return Err(format!("unexpected command {cmd:?}").into());
        }
        let test = Test::parse(f[1]).ok_or("unknown test")?;
        let size: usize = f[2].parse()?;
        let iters: u64 = f[3].parse()?;
        match test {
            Test::SendBw => {
                post_recvs(&c, size, RX_DEPTH)?;
                w.write_all(b"ready\n")?;
                recv_loop(&c, size, iters, None)?;
            }
            Test::SendLat => {
                post_recvs(&c, size, RX_DEPTH.min(iters as u32 + 1))?;
                w.write_all(b"ready\n")?;
                recv_loop(&c, size, iters, Some(&peer))?;
            }
            Test::WriteLat => {
                c.mr.write(size as u64 - 1, &[0])?;
                w.write_all(b"ready\n")?;
                write_pingpong(&c, &peer, size, iters, false)?;
            }
            _ => {
                w.write_all(b"ready\n")?;
                // Passive side: the engine answers the client's requests. In busy-poll mode
                // this thread drives it until the client's next line arrives.
                if c.mode == PollMode::BusyPoll {
                    while !readable(&r) {
                        for _ in 0..64 {
                            c.dev.progress();
                        }
                    }
                }
            }
        }
        let end = line(&mut r)?;
        if end != "end" {
            return Err(format!("expected end, got {end:?}").into());
        }
        // Leave nothing posted for the next round.
        drain(&c);
        w.write_all(b"ok\n")?;
    }
}

/// True when a line from the peer is waiting (buffered or on the socket).
fn readable(r: &BufReader<TcpStream>) -> bool {
    use std::os::fd::AsRawFd;
    if !r.buffer().is_empty() {
        return true;
    }
    let mut p = libc::pollfd {
        fd: r.get_ref().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

fn drain(c: &Ctx) {
    let mut wc = [EMPTY_WC; 32];
    while c.cq.poll(&mut wc) > 0 {}
}

fn post_recvs(c: &Ctx, size: usize, n: u32) -> Res<()> {
    for i in 0..n {
        let sge = [c.mr.sge(0, size as u32)];
        c.qp.post_recv(&RecvWr {
            wr_id: u64::from(i),
            sg_list: &sge,
        })?;
    }
    Ok(())
}

fn check(wc: &WorkCompletion) -> Res<()> {
    if wc.status != WcStatus::Success {
        return Err(format!(
            "work completion {} failed: {:?} ({:?})",
            wc.wr_id, wc.status, wc.opcode
        )
        .into());
    }
    Ok(())
}

/// Receive `iters` SENDs, reposting receives; when `echo` is set, answer each with a SEND.
fn recv_loop(c: &Ctx, size: usize, iters: u64, echo: Option<&Peer>) -> Res<()> {
    let mut got = 0u64;
    let mut posted = 0u64;
    let mut wc = [EMPTY_WC; 32];
    // Small answers are sent inline from here, as write_lat sends its WRITEs.
    let small = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(120);
    while got < iters {
        if Instant::now() > deadline {
            return Err("timed out receiving".into());
        }
        let n = c.cq.poll(&mut wc);
        for w in &wc[..n] {
            check(w)?;
            if w.opcode.is_recv() {
                got += 1;
                if echo.is_some() {
                    let sge = [c.mr.sge(MAX_SIZE as u64, size as u32)];
                    let flags = if posted % 64 == 63 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::NONE
                    };
                    let wr = if size <= 64 {
                        SendWr::new(posted, WrOpcode::Send)
                            .inline(&small[..size])
                            .flags(flags | SendFlags::INLINE)
                    } else {
                        SendWr::new(posted, WrOpcode::Send).sg(&sge).flags(flags)
                    };
                    c.qp.post_send(&wr)?;
                    posted += 1;
                }
                // The answer goes first; the receive is posted again behind it.
                let sge = [c.mr.sge(0, size as u32)];
                c.qp.post_recv(&RecvWr {
                    wr_id: w.wr_id,
                    sg_list: &sge,
                })?;
            }
        }
        if n == 0 {
            idle_after_poll(c);
        }
    }
    Ok(())
}

/// Wait a moment after a CQ poll found nothing: in busy-poll mode the poll itself drove the
/// engine (a system call), so go straight into the next one.
fn idle_after_poll(c: &Ctx) {
    match c.mode {
        PollMode::BusyPoll => {}
        PollMode::Blocking => std::thread::sleep(Duration::from_micros(5)),
    }
}

/// Wait a moment; returns whether something may have arrived meanwhile.
fn idle(c: &Ctx) -> bool {
    match c.mode {
        // Drive the engine from this thread: receive and process what has arrived.
        PollMode::BusyPoll => c.dev.progress() > 0,
        PollMode::Blocking => {
            std::thread::sleep(Duration::from_micros(5));
            true
        }
    }
}

/// Ping-pong of RDMA WRITEs: each side writes `size` bytes into the other's buffer and waits
/// for the other's write to land (its last byte turns into the round's marker). The client
/// starts. Returns the round-trip times.
fn write_pingpong(
    c: &Ctx,
    peer: &Peer,
    size: usize,
    iters: u64,
    client: bool,
) -> Res<Vec<Duration>> {
    let mut times = Vec::with_capacity(iters as usize);
    let mut wc = [EMPTY_WC; 32];
    let mut byte = [0u8];
    let mut src = vec![0u8; size];
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..iters {
        let marker = (i % 255) as u8 + 1;
        let t0 = Instant::now();
        let send = |c: &Ctx, src: &mut Vec<u8>| -> Res<()> {
            src[size - 1] = marker;
            let signaled = i % 64 == 63 || i + 1 == iters;
            let flags = if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::NONE
            };
            let wr = SendWr::new(
                i,
                WrOpcode::RdmaWrite {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                },
            );
            if size <= 64 {
                c.qp.post_send(&wr.inline(src).flags(flags | SendFlags::INLINE))?;
            } else {
                c.mr.write(MAX_SIZE as u64, src)?;
                let sge = [c.mr.sge(MAX_SIZE as u64, size as u32)];
                c.qp.post_send(&wr.sg(&sge).flags(flags))?;
            }
            Ok(())
        };
        if client {
            send(c, &mut src)?;
        }
        let mut spins = 0u32;
        let mut look = true;
        loop {
            if look {
                c.mr.read(size as u64 - 1, &mut byte)?;
                if byte[0] == marker {
                    break;
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && Instant::now() > deadline {
                return Err("timed out waiting for the peer's write".into());
            }
            // In busy-poll mode only a progress call that handled packets can have placed
            // the WRITE, unless the engine thread stepped in (this poller looked quiet to
            // it): look after such calls, and every 64th spin anyway.
            look = idle(c) || spins.is_multiple_of(64);
        }
        if !client {
            send(c, &mut src)?;
        }
        times.push(t0.elapsed());
        // Send completions (every 64th WRITE is signaled) are bookkeeping, not part of the
        // round trip.
        let n = c.cq.poll(&mut wc);
        for w in &wc[..n] {
            check(w)?;
        }
    }
    Ok(times)
}

/// Results of one row.
#[derive(Clone, Debug)]
pub struct Row {
    /// Test.
    pub test: Test,
    /// Message size.
    pub size: usize,
    /// Iterations.
    pub iters: u64,
    /// Bandwidth in MB/s (10^6 bytes), bandwidth tests.
    pub mb_per_s: f64,
    /// Messages per second, bandwidth tests.
    pub msg_rate: f64,
    /// Latencies in microseconds (one-way: half the round trip for ping-pong tests, as
    /// perftest reports), latency tests: min, typical (median), average, p99, max.
    pub lat_us: [f64; 5],
    /// CPU seconds (user + system) this process used per GB moved, bandwidth tests.
    pub cpu_s_per_gb: f64,
    /// The client QP's retransmission timeouts and go-back-N rounds during the row (a
    /// figure hurt by losses in the socket buffers shows here).
    pub timeouts: u64,
    /// See `timeouts`.
    pub retransmits: u64,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn bw_client(
    c: &Ctx,
    peer: &Peer,
    test: Test,
    size: usize,
    iters: u64,
    opts: &PerfOpts,
    progress: &mut Progress,
) -> Res<Row> {
    let depth = u64::from(opts.tx_depth.max(1));
    let cq_mod = (depth / 4).clamp(1, 64);
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut wc = [EMPTY_WC; 64];
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(300);
    while done < iters {
        // Keep `depth` requests in flight; every cq_mod-th (and the last) is signaled. Requests
        // go in lists of up to 16 per post (a doorbell is a system call here, as perftest's
        // --post_list batches them for hardware).
        let sge = [c.mr.sge(0, size as u32)];
        while posted < iters && posted - done < depth {
            let mut list: [Option<SendWr<'_>>; 16] = [None; 16];
            let mut k = 0;
            while k < 16 && posted + (k as u64) < iters && posted + (k as u64) - done < depth {
                let id = posted + k as u64;
                let signaled = id % cq_mod == cq_mod - 1 || id + 1 == iters;
                let flags = if signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::NONE
                };
                let op = match test {
                    Test::WriteBw => WrOpcode::RdmaWrite {
                        remote_addr: peer.vaddr,
                        rkey: peer.rkey,
                    },
                    Test::ReadBw => WrOpcode::RdmaRead {
                        remote_addr: peer.vaddr,
                        rkey: peer.rkey,
                    },
                    Test::SendBw => WrOpcode::Send,
                    Test::AtomicBw if opts.cas => WrOpcode::AtomicCmpAndSwp {
                        remote_addr: peer.vaddr,
                        rkey: peer.rkey,
                        compare: id,
                        swap: id + 1,
                    },
                    _ => WrOpcode::AtomicFetchAndAdd {
                        remote_addr: peer.vaddr,
                        rkey: peer.rkey,
                        add: 1,
                    },
                };
                list[k] = Some(SendWr::new(id, op).sg(&sge).flags(flags));
                k += 1;
            }
            let wrs: Vec<SendWr<'_>> = list[..k].iter().flatten().copied().collect();
            match c.qp.post_send_list(&wrs) {
                Ok(()) => posted += k as u64,
                Err((i, softrdma::verbs::VerbsError::Post(softrdma::rc::PostError::QueueFull))) => {
                    posted += i as u64;
                    break;
                }
                Err((_, e)) => return Err(e.into()),
            }
        }
        let n = c.cq.poll(&mut wc);
        for w in &wc[..n] {
            check(w)?;
            // A signaled completion retires every WR before it (completions are in order).
            done = (w.wr_id + 1).max(done);
        }
        if n == 0 {
            if Instant::now() > deadline {
                return Err(format!("timed out: {done} of {iters} completed").into());
            }
            idle_after_poll(c);
        }
        progress.update(done, iters);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let bytes = size as f64 * iters as f64;
    Ok(Row {
        test,
        size,
        iters,
        mb_per_s: bytes / secs / 1e6,
        msg_rate: iters as f64 / secs,
        lat_us: [0.0; 5],
        cpu_s_per_gb: cpu / (bytes / 1e9),
        timeouts: 0,
        retransmits: 0,
    })
}

fn lat_row(test: Test, size: usize, mut t: Vec<Duration>, halve: bool) -> Row {
    t.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / if halve { 2.0 } else { 1.0 };
    let n = t.len().max(1);
    let avg = t.iter().map(|d| us(*d)).sum::<f64>() / n as f64;
    let at = |q: f64| us(t[((n as f64 * q) as usize).min(n - 1)]);
    Row {
        test,
        size,
        iters: t.len() as u64,
        mb_per_s: 0.0,
        msg_rate: 0.0,
        lat_us: [at(0.0), at(0.5), avg, at(0.99), at(1.0)],
        cpu_s_per_gb: 0.0,
        timeouts: 0,
        retransmits: 0,
    }
}

fn read_lat_client(c: &Ctx, peer: &Peer, size: usize, iters: u64) -> Res<Vec<Duration>> {
    let mut times = Vec::with_capacity(iters as usize);
    let mut wc = [EMPTY_WC; 4];
    for i in 0..iters {
        let sge = [c.mr.sge(0, size as u32)];
        let t0 = Instant::now();
        c.qp.post_send(
            &SendWr::new(
                i,
                WrOpcode::RdmaRead {
                    remote_addr: peer.vaddr,
                    rkey: peer.rkey,
                },
            )
            .sg(&sge),
        )?;
        let deadline = t0 + Duration::from_secs(30);
        loop {
            let n = c.cq.poll(&mut wc);
            if n > 0 {
                check(&wc[0])?;
                break;
            }
            if Instant::now() > deadline {
                return Err("timed out waiting for a READ".into());
            }
            idle_after_poll(c);
        }
        times.push(t0.elapsed());
    }
    Ok(times)
}

fn send_lat_client(c: &Ctx, size: usize, iters: u64) -> Res<Vec<Duration>> {
    post_recvs(c, size, RX_DEPTH.min(iters as u32 + 1))?;
    let mut times = Vec::with_capacity(iters as usize);
    let mut wc = [EMPTY_WC; 8];
    // Small messages are sent inline from here, as write_lat sends its WRITEs.
    let small = [0u8; 64];
    for i in 0..iters {
        let sge = [c.mr.sge(MAX_SIZE as u64, size as u32)];
        let flags = if i % 64 == 63 {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        let wr = SendWr::new(i, WrOpcode::Send);
        let wr = if size <= 64 {
            wr.inline(&small[..size]).flags(flags | SendFlags::INLINE)
        } else {
            wr.sg(&sge).flags(flags)
        };
        let t0 = Instant::now();
        c.qp.post_send(&wr)?;
        let deadline = t0 + Duration::from_secs(30);
        let mut spins = 0u32;
        let answer = 'wait: loop {
            let n = c.cq.poll(&mut wc);
            for w in &wc[..n] {
                check(w)?;
                if w.opcode.is_recv() {
                    break 'wait w.wr_id;
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && Instant::now() > deadline {
                return Err("timed out waiting for the answer".into());
            }
            if n == 0 {
                idle_after_poll(c);
            }
        };
        times.push(t0.elapsed());
        // Reposting the receive is bookkeeping between round trips (as the send completions
        // of write_lat), not part of one.
        let sge = [c.mr.sge(0, size as u32)];
        c.qp.post_recv(&RecvWr {
            wr_id: answer,
            sg_list: &sge,
        })?;
    }
    Ok(times)
}

/// A progress line on standard error for runs longer than a second.
pub struct Progress {
    start: Instant,
    last: Instant,
    label: String,
    shown: bool,
    tty: bool,
}

impl Progress {
    fn new(label: String) -> Progress {
        let now = Instant::now();
        use std::io::IsTerminal;
        Progress {
            start: now,
            last: now,
            label,
            shown: false,
            tty: std::io::stderr().is_terminal(),
        }
    }
    fn update(&mut self, done: u64, total: u64) {
        if !self.tty {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.start) < Duration::from_secs(1)
            || now.duration_since(self.last) < Duration::from_millis(250)
        {
            return;
        }
        self.last = now;
        self.shown = true;
        let pct = done as f64 * 100.0 / total.max(1) as f64;
        let bar = "#".repeat((pct / 5.0) as usize);
        eprint!("\r{:<24} [{bar:<20}] {pct:5.1}%", self.label);
    }
    fn finish(&self) {
        if self.shown {
            eprint!("\r{:<60}\r", "");
        }
    }
}

/// Run `test` as the client against the server at `server`, printing rows as they finish.
pub fn client(
    local: IpAddr,
    server: IpAddr,
    test: Test,
    opts: &PerfOpts,
    out: &mut dyn Write,
) -> Res<Vec<Row>> {
    let c = open(local, opts, MAX_SIZE * 2)?;
    let stream = connect_retry(
        SocketAddr::new(server, opts.tcp_port),
        Duration::from_secs(20),
    )?;
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let psn = random_psn();
    w.write_all(hello(&c, psn).as_bytes())?;
    let peer = parse_peer(&line(&mut r)?)?;
    connect_qp(&c, &peer, psn, opts)?;
    header(test, opts, out)?;
    let mut rows = Vec::new();
    for size in sizes(test, opts) {
        let iters = iters_for(test, size, opts);
        writeln!(w, "run {} {size} {iters}", test.name())?;
        let ready = line(&mut r)?;
        if ready != "ready" {
            return Err(format!("server: {ready}").into());
        }
        let mut progress = Progress::new(format!("{} {size} B", test.name()));
        let before = c.qp.counters().comp;
        let mut row = match test {
            t if t.is_bw() => bw_client(&c, &peer, t, size, iters, opts, &mut progress)?,
            Test::WriteLat => {
                c.mr.write(size as u64 - 1, &[0])?;
                lat_row(
                    test,
                    size,
                    write_pingpong(&c, &peer, size, iters, true)?,
                    true,
                )
            }
            Test::ReadLat => lat_row(test, size, read_lat_client(&c, &peer, size, iters)?, false),
            _ => lat_row(test, size, send_lat_client(&c, size, iters)?, true),
        };
        progress.finish();
        let after = c.qp.counters().comp;
        row.timeouts = after.timeouts - before.timeouts;
        row.retransmits = after.retransmits - before.retransmits;
        w.write_all(b"end\n")?;
        let ok = line(&mut r)?;
        if ok != "ok" {
            return Err(format!("server: {ok}").into());
        }
        drain(&c);
        print_row(&row, opts, out)?;
        rows.push(row);
    }
    w.write_all(b"bye\n")?;
    Ok(rows)
}

fn connect_retry(addr: SocketAddr, total: Duration) -> Res<TcpStream> {
    let deadline = Instant::now() + total;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("connecting to {addr}: {e}").into());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn header(test: Test, opts: &PerfOpts, out: &mut dyn Write) -> Res<()> {
    if opts.json {
        return Ok(());
    }
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )?;
    writeln!(
        out,
        " softrdma perf {}  (RC, path MTU {}, {} mode)",
        test.name(),
        opts.mtu,
        if opts.mode == Mode::Busy {
            "busy-poll"
        } else {
            "blocking"
        }
    )?;
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )?;
    if test.is_bw() {
        writeln!(
            out,
            " {:>10} {:>12} {:>14} {:>14} {:>14}",
            "#bytes", "#iterations", "BW [MB/sec]", "MsgRate[Mpps]", "CPU [s/GB]"
        )?;
    } else {
        writeln!(
            out,
            " {:>10} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10} {:>10}",
            "#bytes",
            "#iterations",
            "t_min[us]",
            "t_max[us]",
            "t_typical[us]",
            "t_avg[us]",
            "99%[us]",
            ""
        )?;
    }
    Ok(())
}

fn print_row(row: &Row, opts: &PerfOpts, out: &mut dyn Write) -> Res<()> {
    if opts.json {
        let v = serde_json::json!({
            "test": row.test.name(), "size": row.size, "iters": row.iters, "mb_per_s": row.mb_per_s,
            "msg_rate": row.msg_rate, "cpu_s_per_gb": row.cpu_s_per_gb,
            "lat_min_us": row.lat_us[0], "lat_typical_us": row.lat_us[1], "lat_avg_us": row.lat_us[2],
            "lat_p99_us": row.lat_us[3], "lat_max_us": row.lat_us[4],
            "mtu": opts.mtu, "mode": if opts.mode == Mode::Busy { "busy" } else { "blocking" },
            "timeouts": row.timeouts, "retransmits": row.retransmits,
        });
        writeln!(out, "{v}")?;
    } else if row.test.is_bw() {
        writeln!(
            out,
            " {:>10} {:>12} {:>14.1} {:>14.4} {:>14.3}",
            row.size,
            row.iters,
            row.mb_per_s,
            row.msg_rate / 1e6,
            row.cpu_s_per_gb
        )?;
    } else {
        let l = row.lat_us;
        writeln!(
            out,
            " {:>10} {:>12} {:>10.2} {:>10.2} {:>12.2} {:>10.2} {:>10.2}",
            row.size, row.iters, l[0], l[4], l[1], l[2], l[3]
        )?;
    }
    out.flush()?;
    Ok(())
}
