//! `softrdma perf`: perftest's tests on softrdma, server and client as two processes.
//!
//! Out of band, the two sides talk over TCP in lines of text: each sends
//! `qpn psn rkey vaddr gid [UC|UD]` once (the server creates its QP with the client's
//! transport, RC when it names none); then the client drives rounds with
//! `run TEST SIZE ITERS`, the server answers `ready` once it is set up (receives posted), both
//! run, the client sends `end` and the server answers `ok` (after an unreliable bandwidth
//! round, `ok RECEIVED NANOSECONDS DROPS`: what reached it, from its `ready` to the last
//! arrival, and what its QP dropped).
//!
//! Over UC and UD nothing is acknowledged or resent: a send completes when its packet is built,
//! and a message the receiver has no receive for, or that the socket buffers overflow with, is
//! lost. Bandwidth rounds therefore report what the sender sent and what the receiver got, and
//! every wait is bounded (see [`IDLE_END`], [`ANSWER_TIMEOUT`]).

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma::rc::UnrelCounters;
use softrdma::verbs::{
    Access, Ah, Cq, Device, DeviceConfig, EMPTY_WC, GRH_LEN, Mr, Mtu, PinMode, PollMode, Qp,
    QpAttr, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, UdDest, WcStatus, WorkCompletion,
    WrOpcode, random_psn,
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
    /// SEND exchange: each round both sides send at once and wait for the other's message
    /// (an MPI ring exchange's pattern, `mpi_ring`'s); the time per round.
    #[value(name = "exchange_lat")]
    ExchangeLat,
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
            Test::ExchangeLat => "exchange_lat",
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
            Test::ExchangeLat,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }
}

/// The transport service, as perftest's `-c` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Connection {
    /// Reliable Connected.
    #[value(name = "rc")]
    Rc,
    /// Unreliable Connected: SEND and RDMA WRITE, nothing acknowledged or resent.
    #[value(name = "uc")]
    Uc,
    /// Unreliable Datagram: one-packet SENDs (at most the MTU), nothing acknowledged or
    /// resent.
    #[value(name = "ud")]
    Ud,
}

impl Connection {
    /// `RC`, `UC` or `UD`.
    pub fn name(self) -> &'static str {
        match self {
            Connection::Rc => "RC",
            Connection::Uc => "UC",
            Connection::Ud => "UD",
        }
    }
    fn parse(s: &str) -> Option<Connection> {
        [Connection::Rc, Connection::Uc, Connection::Ud]
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
    }
    fn qp_type(self) -> QpType {
        match self {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
        }
    }
    fn unreliable(self) -> bool {
        self != Connection::Rc
    }
    /// Whether `test` runs over this transport (UC has no READ or atomics; UD only SENDs).
    fn supports(self, test: Test) -> bool {
        match self {
            Connection::Rc => true,
            Connection::Uc => matches!(
                test,
                Test::WriteBw | Test::SendBw | Test::WriteLat | Test::SendLat
            ),
            Connection::Ud => matches!(test, Test::SendBw | Test::SendLat),
        }
    }
}

/// Q_Key of the UD QPs (perftest's default).
const QKEY: u32 = 0x1111_1111;

/// An unreliable bandwidth round ends when nothing has arrived at the receiver for this long
/// (the sender stopped, or everything it sends is lost).
pub const IDLE_END: Duration = Duration::from_secs(1);

/// Once the client has sent its last message (its `end` line is waiting), an unreliable
/// bandwidth round ends after this long without an arrival.
const GRACE: Duration = Duration::from_millis(100);

/// An unreliable latency round whose answer (or whose peer's WRITE) has not come after this
/// long ends the test with an error: the message was lost, and nothing resends it.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Options shared by both sides.
#[derive(Clone, Debug, clap::Args)]
pub struct PerfOpts {
    /// Message size in bytes (atomics are always 8) [default: 65536; UD: the MTU, which is
    /// also the largest size UD takes].
    #[arg(long, short = 's')]
    pub size: Option<usize>,
    /// Every power of two from 64 B to 1 MiB (UD: to the MTU), one row each.
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
    /// Transport, as perftest's -c: rc (default), uc (write_bw, send_bw, write_lat,
    /// send_lat) or ud (send_bw, send_lat). The server follows the client's.
    #[arg(long, short = 'c', value_enum, ignore_case = true)]
    pub connection: Option<Connection>,
    /// Short for --connection ud.
    #[arg(long, conflicts_with_all = ["connection", "uc"])]
    pub ud: bool,
    /// Short for --connection uc.
    #[arg(long, conflicts_with = "connection")]
    pub uc: bool,
    /// Receives the SEND receiver keeps posted [default: 512; UC and UD: 16384, since a
    /// message that finds no receive is lost].
    #[arg(long)]
    pub rx_depth: Option<u32>,
    /// Latency tests in perftest's pattern (`ib_write_lat`, `ib_send_lat`): every work request
    /// signaled and its send completion awaited, the payload gathered from the registered
    /// buffer by its key. By default only every 64th is signaled and payloads up to 64 bytes
    /// are inline, which is less work per round.
    #[arg(long)]
    pub signal_all: bool,
}

impl PerfOpts {
    /// The transport asked for, if any (`--connection`, `--ud`, `--uc`).
    pub fn transport(&self) -> Option<Connection> {
        if self.ud {
            Some(Connection::Ud)
        } else if self.uc {
            Some(Connection::Uc)
        } else {
            self.connection
        }
    }
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
    conn: Connection,
    /// Length of every posted receive: one length fits every round (MAX_SIZE; UD: the GRH
    /// area and an MTU), since receives left posted by a round serve the next.
    recv_len: u32,
    /// Receives posted and not yet completed.
    posted_recvs: Cell<u32>,
    /// Receives to keep posted (the receive queue's size).
    rx_depth: u32,
    /// `--signal-all`: latency tests signal every request, send from the buffer by key and
    /// wait for each send completion.
    signal_all: bool,
}

const MAX_SIZE: usize = 1 << 20;
const RX_DEPTH: u32 = 512;
/// Receives an unreliable SEND receiver keeps posted by default: a datagram that finds none is
/// lost, and the engine places a whole receive batch (up to 32 GRO datagrams, each of many
/// packets) before the receiving thread can post again; 512 lost a third of a 64-byte stream.
const UNREL_RX_DEPTH: u32 = 16384;

/// Receives the SEND receiver keeps posted (`--rx-depth`).
fn rx_depth(opts: &PerfOpts, conn: Connection) -> u32 {
    let default = if conn.unreliable() {
        UNREL_RX_DEPTH
    } else {
        RX_DEPTH
    };
    opts.rx_depth.unwrap_or(default).clamp(1, MAX_QP_WR)
}

/// The device's limit on a queue's work requests.
const MAX_QP_WR: u32 = 1 << 15;

fn open(local: IpAddr, opts: &PerfOpts, buf_len: usize, conn: Connection) -> Res<Ctx> {
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
    let rx_depth = rx_depth(opts, conn);
    let depth = opts.tx_depth.max(rx_depth) * 2;
    let cq = dev.create_cq(depth, None)?;
    let mut init = QpInitAttr::new(&cq).with_type(conn.qp_type());
    init.cap = QpCap {
        max_send_wr: opts.tx_depth.max(16),
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&init)?;
    let access =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mr = pd.alloc_mr(buf_len, access)?;
    let recv_len = match conn {
        Connection::Ud => mtu_of(opts.mtu).bytes() + GRH_LEN as u32,
        _ => MAX_SIZE as u32,
    };
    Ok(Ctx {
        dev,
        cq,
        qp,
        mr,
        mode,
        conn,
        recv_len,
        posted_recvs: Cell::new(0),
        rx_depth,
        signal_all: opts.signal_all,
    })
}

struct Peer {
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    ip: IpAddr,
    conn: Connection,
    /// UD: where SENDs go (the peer's address handle, QPN and Q_Key).
    dest: Option<UdDest>,
}

fn hello(c: &Ctx, psn: u32) -> String {
    let ip = c.dev.addr();
    // RC says nothing of its transport: its line is what it was before UC and UD.
    let transport = match c.conn {
        Connection::Rc => "",
        Connection::Uc => " UC",
        Connection::Ud => " UD",
    };
    format!(
        "{} {} {} {} {}{transport}\n",
        c.qp.qp_num(),
        psn,
        c.mr.rkey(),
        c.mr.iova(),
        ip
    )
}

fn parse_peer(line: &str) -> Res<Peer> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 5 && f.len() != 6 {
        return Err(format!("bad exchange line {line:?}").into());
    }
    let conn = match f.get(5) {
        None => Connection::Rc,
        Some(t) => Connection::parse(t).ok_or_else(|| format!("unknown transport {t:?}"))?,
    };
    Ok(Peer {
        qpn: f[0].parse()?,
        psn: f[1].parse()?,
        rkey: f[2].parse()?,
        vaddr: f[3].parse()?,
        ip: f[4].parse()?,
        conn,
        dest: None,
    })
}

fn connect_qp(c: &Ctx, peer: &mut Peer, my_psn: u32, opts: &PerfOpts) -> Res<()> {
    if c.conn == Connection::Ud {
        c.qp.ready_ud(QKEY, my_psn)?;
        peer.dest = Some(Ah::new(c.qp.pd(), peer.ip).dest(peer.qpn, QKEY));
        return Ok(());
    }
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

fn sizes(test: Test, opts: &PerfOpts) -> Res<Vec<usize>> {
    if test == Test::AtomicBw {
        return Ok(vec![8]);
    }
    let conn = opts.transport().unwrap_or(Connection::Rc);
    if conn != Connection::Ud {
        return Ok(if opts.all {
            (6..=20).map(|p| 1usize << p).collect()
        } else {
            vec![opts.size.unwrap_or(65536).clamp(1, MAX_SIZE)]
        });
    }
    // A UD message is one packet: at most the MTU (perftest refuses more as well).
    let mtu = mtu_of(opts.mtu).bytes() as usize;
    if opts.all {
        return Ok((6..=20)
            .map(|p| 1usize << p)
            .filter(|s| *s <= mtu)
            .collect());
    }
    match opts.size {
        None => Ok(vec![mtu]),
        Some(s) if s > mtu => Err(format!(
            "a UD message is at most the MTU, {mtu} bytes (asked for {s}; see -s and --mtu)"
        )
        .into()),
        Some(s) => Ok(vec![s.max(1)]),
    }
}

/// Check that `test` runs over the transport and sizes asked for, before anything starts.
pub fn validate(test: Test, opts: &PerfOpts) -> Res<()> {
    let conn = opts.transport().unwrap_or(Connection::Rc);
    if !conn.supports(test) {
        return Err(format!(
            "{} does not run over {}: UC runs write_bw, send_bw, write_lat and send_lat; \
             UD runs send_bw and send_lat",
            test.name(),
            conn.name()
        )
        .into());
    }
    sizes(test, opts)?;
    Ok(())
}

/// Serve one client: answer rounds until it disconnects.
pub fn server(local: IpAddr, opts: &PerfOpts) -> Res<()> {
    let listener = TcpListener::bind(SocketAddr::new(local, opts.tcp_port))?;
    let (stream, _) = listener.accept()?;
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let mut peer = parse_peer(&line(&mut r)?)?;
    if let Some(t) = opts.transport()
        && t != peer.conn
    {
        return Err(format!(
            "the client runs {}, this server was started with {}",
            peer.conn.name(),
            t.name()
        )
        .into());
    }
    // The QP has the client's transport.
    let c = open(local, opts, MAX_SIZE * 2, peer.conn)?;
    let psn = random_psn();
    w.write_all(hello(&c, psn).as_bytes())?;
    connect_qp(&c, &mut peer, psn, opts)?;
    let unreliable = c.conn.unreliable();
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
        let mut arrivals = None;
        match test {
            Test::SendBw if unreliable => {
                top_up_recvs(&c, c.rx_depth)?;
                w.write_all(b"ready\n")?;
                arrivals = Some(unreliable_recv(&c, &r, size, iters, Count::Receives)?);
            }
            Test::WriteBw if unreliable => {
                w.write_all(b"ready\n")?;
                arrivals = Some(unreliable_recv(&c, &r, size, iters, Count::Packets)?);
            }
            Test::SendBw => {
                top_up_recvs(&c, c.rx_depth)?;
                w.write_all(b"ready\n")?;
                recv_loop(&c, &peer, size, iters, false, None)?;
            }
            Test::SendLat => {
                top_up_recvs(&c, lat_recvs(&c, iters))?;
                w.write_all(b"ready\n")?;
                // Unreliable: the client gives up on a lost datagram (its line or its
                // disconnection is waiting); so does this side then.
                recv_loop(&c, &peer, size, iters, true, unreliable.then_some(&r))?;
            }
            Test::WriteLat => {
                c.mr.write(size as u64 - 1, &[0])?;
                w.write_all(b"ready\n")?;
                write_pingpong(&c, &peer, size, iters, false)?;
            }
            Test::ExchangeLat => {
                top_up_recvs(&c, lat_recvs(&c, iters))?;
                w.write_all(b"ready\n")?;
                exchange(&c, &peer, size, iters)?;
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
        // Leave no completion behind for the next round (receives left posted serve it).
        drain(&c);
        match arrivals {
            Some(a) => writeln!(w, "ok {} {} {}", a.msgs, a.span.as_nanos().max(1), a.drops)?,
            None => w.write_all(b"ok\n")?,
        }
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
    loop {
        let n = c.cq.poll(&mut wc);
        if n == 0 {
            break;
        }
        // A datagram that came after an unreliable round ended used a receive.
        let used = wc[..n].iter().filter(|w| w.opcode.is_recv()).count() as u32;
        c.posted_recvs
            .set(c.posted_recvs.get().saturating_sub(used));
    }
}

/// Post receives until `n` are posted (those a round left posted serve the next: every
/// receive is `recv_len` long, enough for any round).
fn top_up_recvs(c: &Ctx, n: u32) -> Res<()> {
    for i in c.posted_recvs.get()..n {
        let sge = [c.mr.sge(0, c.recv_len)];
        c.qp.post_recv(&RecvWr {
            wr_id: u64::from(i),
            sg_list: &sge,
        })?;
        c.posted_recvs.set(i + 1);
    }
    Ok(())
}

/// Receives a ping-pong side keeps posted (one would do; at most 512, as over RC).
fn lat_recvs(c: &Ctx, iters: u64) -> u32 {
    RX_DEPTH.min(c.rx_depth).min(iters as u32 + 1)
}

/// Post again the receive that completion `wr_id` used.
fn repost(c: &Ctx, wr_id: u64) -> Res<()> {
    let sge = [c.mr.sge(0, c.recv_len)];
    c.qp.post_recv(&RecvWr {
        wr_id,
        sg_list: &sge,
    })?;
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

/// Receive `iters` SENDs, reposting receives; with `echo`, answer each with a SEND. With
/// `watch`, give up when the client's next line (or its disconnection) is waiting: over UC and
/// UD it ends the test when a datagram is lost.
fn recv_loop(
    c: &Ctx,
    peer: &Peer,
    size: usize,
    iters: u64,
    echo: bool,
    watch: Option<&BufReader<TcpStream>>,
) -> Res<()> {
    let mut got = 0u64;
    let mut posted = 0u64;
    let mut wc = [EMPTY_WC; 32];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next_look = Instant::now();
    while got < iters {
        let now = Instant::now();
        if now > deadline {
            return Err("timed out receiving".into());
        }
        let n = c.cq.poll(&mut wc);
        for w in &wc[..n] {
            check(w)?;
            if w.opcode.is_recv() {
                got += 1;
                if echo {
                    post_lat_send(c, peer, posted, size)?;
                    posted += 1;
                }
                // The answer goes first; the receive is posted again behind it.
                repost(c, w.wr_id)?;
            }
        }
        if n == 0 {
            if let Some(r) = watch
                && now >= next_look
            {
                next_look = now + Duration::from_millis(1);
                if readable(r) {
                    return Err(format!(
                        "the client ended the test after {got} of {iters} SENDs \
                         (a lost datagram: see its message)"
                    )
                    .into());
                }
            }
            idle_after_poll(c);
        }
    }
    Ok(())
}

/// A send work request addressed for the peer: over UD, to its address handle and QP.
fn to<'a>(peer: &Peer, wr: SendWr<'a>) -> SendWr<'a> {
    match peer.dest {
        Some(d) => wr.ud(d),
        None => wr,
    }
}

/// What an unreliable bandwidth round counts at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Count {
    /// Receive completions (SEND).
    Receives,
    /// Packets that reached the QP, in messages (RDMA WRITE completes nothing here).
    Packets,
}

/// What reached the receiver in an unreliable bandwidth round.
struct Arrivals {
    /// Messages.
    msgs: u64,
    /// From the receiver's `ready` to the last arrival.
    span: Duration,
    /// Messages the receiving QP dropped (no receive posted, too long, cut by a gap, ...).
    drops: u64,
}

fn unrel_drops(u: &UnrelCounters) -> u64 {
    u.qkey_drops
        + u.no_recv_drops
        + u.len_drops
        + u.uc_gap_drops
        + u.access_drops
        + u.suspended_drops
        + u.malformed
}

/// Receive an unreliable bandwidth round: count what arrives until all `iters` messages are
/// in, or the client has sent everything (its `end` line is waiting) and nothing arrived for
/// [`GRACE`], or nothing arrived for [`IDLE_END`]. Receives are reposted as they complete.
fn unreliable_recv(
    c: &Ctx,
    r: &BufReader<TcpStream>,
    size: usize,
    iters: u64,
    count: Count,
) -> Res<Arrivals> {
    let mtu = c.dev.config().active_mtu.bytes() as usize;
    let npkts = size.div_ceil(mtu).max(1) as u64;
    let before = c.qp.counters();
    let reached = |k: &softrdma::rc::QpCounters| k.packets_received - k.packets_dropped;
    let pkts0 = reached(&before);
    let mut pkts = pkts0;
    let start = Instant::now();
    let mut last = start;
    let mut next_look = start;
    let mut ended = false;
    let mut got = 0u64;
    let mut wc = [EMPTY_WC; 32];
    while got < iters {
        let arrived = match count {
            Count::Receives => {
                let n = c.cq.poll(&mut wc);
                for w in &wc[..n] {
                    check(w)?;
                    if w.opcode.is_recv() {
                        got += 1;
                        repost(c, w.wr_id)?;
                    }
                }
                n > 0
            }
            Count::Packets => {
                match c.mode {
                    PollMode::BusyPoll => {
                        for _ in 0..16 {
                            c.dev.progress();
                        }
                    }
                    PollMode::Blocking => std::thread::sleep(Duration::from_micros(20)),
                }
                let p = reached(&c.qp.counters());
                let moved = p != pkts;
                pkts = p;
                got = (p - pkts0) / npkts;
                moved
            }
        };
        let now = Instant::now();
        if arrived {
            last = now;
            continue;
        }
        if count == Count::Receives {
            idle_after_poll(c);
        }
        if now >= next_look {
            next_look = now + Duration::from_millis(1);
            ended = ended || readable(r);
            let quiet = now - last;
            if (ended && quiet >= GRACE) || quiet >= IDLE_END {
                break;
            }
        }
    }
    let after = c.qp.counters();
    Ok(Arrivals {
        msgs: got.min(iters),
        span: last - start,
        drops: unrel_drops(&after.unrel) - unrel_drops(&before.unrel),
    })
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
    let unreliable = c.conn.unreliable();
    for i in 0..iters {
        let marker = (i % 255) as u8 + 1;
        let t0 = Instant::now();
        let send = |c: &Ctx, src: &mut Vec<u8>| -> Res<()> {
            src[size - 1] = marker;
            let signaled = c.signal_all || i % 64 == 63 || i + 1 == iters;
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
            if size <= 64 && !c.signal_all {
                c.qp.post_send(&wr.inline(src).flags(flags | SendFlags::INLINE))?;
            } else {
                // Only the marker changes between rounds (as in perftest's `ib_write_lat`):
                // a copy of the whole payload per round would be timed with the WRITE.
                c.mr.write(MAX_SIZE as u64 + size as u64 - 1, &[marker])?;
                let sge = [c.mr.sge(MAX_SIZE as u64, size as u32)];
                c.qp.post_send(&wr.sg(&sge).flags(flags))?;
            }
            Ok(())
        };
        if client {
            send(c, &mut src)?;
            if c.signal_all {
                await_send_completion(c, &mut wc, deadline)?;
            }
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
            if spins.is_multiple_of(1024) {
                let now = Instant::now();
                if now > deadline {
                    return Err("timed out waiting for the peer's write".into());
                }
                if unreliable && now - t0 > ANSWER_TIMEOUT {
                    return Err(format!(
                        "round {i}: no WRITE from the peer within {} s: a packet was lost \
                         (UC resends nothing, and this test does not either)",
                        ANSWER_TIMEOUT.as_secs()
                    )
                    .into());
                }
            }
            // In busy-poll mode only a progress call that handled packets can have placed
            // the WRITE, unless the engine thread stepped in (this poller looked quiet to
            // it): look after such calls, and every 64th spin anyway.
            look = idle(c) || spins.is_multiple_of(64);
        }
        if !client {
            send(c, &mut src)?;
            if c.signal_all {
                await_send_completion(c, &mut wc, deadline)?;
            }
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

/// `--signal-all`: poll until the completion of the send just posted (signaled) arrives, as
/// perftest's latency tests do after each post; receive completions are not expected here.
fn await_send_completion(c: &Ctx, wc: &mut [WorkCompletion], deadline: Instant) -> Res<()> {
    let mut spins = 0u32;
    loop {
        let n = c.cq.poll(&mut wc[..1]);
        if n > 0 {
            return check(&wc[0]);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && Instant::now() > deadline {
            return Err("timed out waiting for a send completion".into());
        }
        idle_after_poll(c);
    }
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
    /// The transport.
    pub connection: Connection,
    /// UC and UD bandwidth tests: the messages that reached the receiver (SEND: its receive
    /// completions; UC WRITE: the packets that reached its QP, in messages). `mb_per_s` and
    /// `msg_rate` are then what the sender sent (a send completes when its packet is built).
    pub received: u64,
    /// UC and UD bandwidth tests: the receiver's message rate, received messages over the
    /// time from its `ready` to the last arrival.
    pub rx_msg_rate: f64,
    /// UC and UD bandwidth tests: the same in MB/s.
    pub rx_mb_per_s: f64,
    /// UC and UD bandwidth tests: messages the receiving QP dropped (no receive posted, too
    /// long, cut by a PSN gap, ...); the rest of the loss was in the sockets.
    pub rx_drops: u64,
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
                list[k] = Some(to(peer, SendWr::new(id, op).sg(&sge).flags(flags)));
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
        connection: c.conn,
        received: 0,
        rx_msg_rate: 0.0,
        rx_mb_per_s: 0.0,
        rx_drops: 0,
    })
}

fn lat_row(conn: Connection, test: Test, size: usize, mut t: Vec<Duration>, halve: bool) -> Row {
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
        connection: conn,
        received: 0,
        rx_msg_rate: 0.0,
        rx_mb_per_s: 0.0,
        rx_drops: 0,
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

fn send_lat_client(c: &Ctx, peer: &Peer, size: usize, iters: u64) -> Res<Vec<Duration>> {
    top_up_recvs(c, lat_recvs(c, iters))?;
    let mut times = Vec::with_capacity(iters as usize);
    let mut wc = [EMPTY_WC; 8];
    // Over UC and UD a lost SEND (or answer) is not resent: the round fails after a while.
    let bound = if c.conn.unreliable() {
        ANSWER_TIMEOUT
    } else {
        Duration::from_secs(30)
    };
    for i in 0..iters {
        let t0 = Instant::now();
        post_lat_send(c, peer, i, size)?;
        let deadline = t0 + bound;
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
                if c.conn.unreliable() {
                    return Err(lost_answer(c, i, iters));
                }
                return Err("timed out waiting for the answer".into());
            }
            if n == 0 {
                idle_after_poll(c);
            }
        };
        times.push(t0.elapsed());
        // Reposting the receive is bookkeeping between round trips (as the send completions
        // of write_lat), not part of one.
        repost(c, answer)?;
    }
    Ok(times)
}

/// Post SEND `i` of a latency test: `size` bytes, inline up to 64 bytes (as write_lat sends
/// its WRITEs) and signaled every 64th, unless `--signal-all` asks for perftest's pattern
/// (every one signaled, the payload gathered from the registered buffer).
fn post_lat_send(c: &Ctx, peer: &Peer, i: u64, size: usize) -> Res<()> {
    const SMALL: [u8; 64] = [0u8; 64];
    let sge = [c.mr.sge(MAX_SIZE as u64, size as u32)];
    let flags = if c.signal_all || i % 64 == 63 {
        SendFlags::SIGNALED
    } else {
        SendFlags::NONE
    };
    let wr = SendWr::new(i, WrOpcode::Send);
    let wr = if size <= 64 && !c.signal_all {
        wr.inline(&SMALL[..size]).flags(flags | SendFlags::INLINE)
    } else {
        wr.sg(&sge).flags(flags)
    };
    c.qp.post_send(&to(peer, wr))?;
    Ok(())
}

/// Both sides of `exchange_lat`: `iters` rounds, each a SEND posted to the peer and the wait
/// for the peer's SEND of the round (both cross on the wire, as the messages of an MPI ring
/// exchange do). Returns the time of each round.
fn exchange(c: &Ctx, peer: &Peer, size: usize, iters: u64) -> Res<Vec<Duration>> {
    let mut times = Vec::with_capacity(iters as usize);
    let mut wc = [EMPTY_WC; 8];
    let deadline = Instant::now() + Duration::from_secs(120);
    // A receive completion that arrived ahead of its round (the peer's next message, when this
    // side was slower to look): it counts for the next round.
    let mut early = 0u64;
    for i in 0..iters {
        let t0 = Instant::now();
        post_lat_send(c, peer, i, size)?;
        let mut spins = 0u32;
        while early == 0 {
            let n = c.cq.poll(&mut wc);
            for w in &wc[..n] {
                check(w)?;
                if w.opcode.is_recv() {
                    early += 1;
                    repost(c, w.wr_id)?;
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && Instant::now() > deadline {
                return Err(format!("timed out in round {i} of {iters} of the exchange").into());
            }
            if n == 0 {
                idle_after_poll(c);
            }
        }
        early -= 1;
        times.push(t0.elapsed());
    }
    Ok(times)
}

/// The error of an unreliable ping-pong whose answer did not come.
fn lost_answer(c: &Ctx, i: u64, iters: u64) -> Box<dyn std::error::Error> {
    let u = c.qp.counters().unrel;
    format!(
        "round {i} of {iters}: no answer within {} s: the SEND or its answer was lost \
         ({} resends nothing, and this test does not either, so that every timed round trip \
         is one SEND each way, as over RC); this side's drops: {} without a receive, {} other",
        ANSWER_TIMEOUT.as_secs(),
        c.conn.name(),
        u.no_recv_drops,
        unrel_drops(&u) - u.no_recv_drops
    )
    .into()
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
    validate(test, opts)?;
    let conn = opts.transport().unwrap_or(Connection::Rc);
    let c = open(local, opts, MAX_SIZE * 2, conn)?;
    let stream = connect_retry(
        SocketAddr::new(server, opts.tcp_port),
        Duration::from_secs(20),
    )?;
    stream.set_nodelay(true)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let psn = random_psn();
    w.write_all(hello(&c, psn).as_bytes())?;
    let mut peer = parse_peer(&line(&mut r)?)?;
    if peer.conn != conn {
        return Err(format!("the server runs {}, not {}", peer.conn.name(), conn.name()).into());
    }
    connect_qp(&c, &mut peer, psn, opts)?;
    header(test, opts, conn, out)?;
    let mut rows = Vec::new();
    for size in sizes(test, opts)? {
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
                    conn,
                    test,
                    size,
                    write_pingpong(&c, &peer, size, iters, true)?,
                    true,
                )
            }
            Test::ReadLat => lat_row(
                conn,
                test,
                size,
                read_lat_client(&c, &peer, size, iters)?,
                false,
            ),
            Test::ExchangeLat => {
                top_up_recvs(&c, lat_recvs(&c, iters))?;
                lat_row(conn, test, size, exchange(&c, &peer, size, iters)?, false)
            }
            _ => lat_row(
                conn,
                test,
                size,
                send_lat_client(&c, &peer, size, iters)?,
                true,
            ),
        };
        progress.finish();
        let after = c.qp.counters().comp;
        row.timeouts = after.timeouts - before.timeouts;
        row.retransmits = after.retransmits - before.retransmits;
        w.write_all(b"end\n")?;
        let ok = line(&mut r)?;
        let f: Vec<&str> = ok.split_whitespace().collect();
        match f[..] {
            ["ok"] => {}
            // An unreliable bandwidth round: what reached the server.
            ["ok", got, ns, drops] => {
                let got: u64 = got.parse()?;
                let secs = ns.parse::<u64>()? as f64 * 1e-9;
                row.received = got;
                row.rx_msg_rate = got as f64 / secs;
                row.rx_mb_per_s = got as f64 * size as f64 / secs / 1e6;
                row.rx_drops = drops.parse()?;
            }
            _ => return Err(format!("server: {ok}").into()),
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

fn header(test: Test, opts: &PerfOpts, conn: Connection, out: &mut dyn Write) -> Res<()> {
    if opts.json {
        return Ok(());
    }
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )?;
    writeln!(
        out,
        " softrdma perf {}  ({}, path MTU {}, {} mode)",
        test.name(),
        conn.name(),
        opts.mtu,
        if opts.mode == Mode::Busy {
            "busy-poll"
        } else {
            "blocking"
        }
    )?;
    if conn.unreliable() {
        if test.is_bw() {
            writeln!(
                out,
                " {}: nothing is acknowledged or resent. BW and MsgRate: what the sender sent (a send\n \
                 completes when its packet is built). Rx: what reached the receiver, over the time\n \
                 from its ready to its last arrival (it stops {} ms after the sender's last message,\n \
                 or after {} s with nothing); lost: sent but not received.",
                conn.name(),
                GRACE.as_millis(),
                IDLE_END.as_secs()
            )?;
        } else {
            writeln!(
                out,
                " {}: a lost message is not resent: a round trip unanswered for {} s ends the test\n \
                 with an error (resending would need a sequence number in each message; as it is,\n \
                 every timed round trip is one {} each way, as over RC).",
                conn.name(),
                ANSWER_TIMEOUT.as_secs(),
                if test == Test::WriteLat {
                    "WRITE"
                } else {
                    "SEND"
                }
            )?;
        }
    }
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )?;
    if test.is_bw() && conn.unreliable() {
        writeln!(
            out,
            " {:>10} {:>12} {:>14} {:>14} {:>14} {:>14} {:>14} {:>10} {:>8}",
            "#bytes",
            "#iterations",
            "BW [MB/sec]",
            "MsgRate[Mpps]",
            "CPU [s/GB]",
            "RxBW [MB/sec]",
            "RxMsgRate[Mpps]",
            "received",
            "lost[%]"
        )?;
    } else if test.is_bw() {
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
    let unreliable_bw = row.test.is_bw() && row.connection.unreliable();
    let lost = row.iters.saturating_sub(row.received);
    if opts.json {
        let mut v = serde_json::json!({
            "test": row.test.name(), "size": row.size, "iters": row.iters, "mb_per_s": row.mb_per_s,
            "msg_rate": row.msg_rate, "cpu_s_per_gb": row.cpu_s_per_gb,
            "lat_min_us": row.lat_us[0], "lat_typical_us": row.lat_us[1], "lat_avg_us": row.lat_us[2],
            "lat_p99_us": row.lat_us[3], "lat_max_us": row.lat_us[4],
            "mtu": opts.mtu, "mode": if opts.mode == Mode::Busy { "busy" } else { "blocking" },
            "timeouts": row.timeouts, "retransmits": row.retransmits,
            "connection": row.connection.name(),
        });
        if unreliable_bw {
            v["received"] = row.received.into();
            v["lost"] = lost.into();
            v["rx_msg_rate"] = row.rx_msg_rate.into();
            v["rx_mb_per_s"] = row.rx_mb_per_s.into();
            v["rx_drops"] = row.rx_drops.into();
        }
        writeln!(out, "{v}")?;
    } else if unreliable_bw {
        writeln!(
            out,
            " {:>10} {:>12} {:>14.1} {:>14.4} {:>14.3} {:>14.1} {:>14.4} {:>10} {:>8.2}",
            row.size,
            row.iters,
            row.mb_per_s,
            row.msg_rate / 1e6,
            row.cpu_s_per_gb,
            row.rx_mb_per_s,
            row.rx_msg_rate / 1e6,
            row.received,
            lost as f64 * 100.0 / row.iters.max(1) as f64
        )?;
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
