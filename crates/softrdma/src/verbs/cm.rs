//! The connection manager of a device: the CM ([`crate::cm::Agent`]) on the device's QP1,
//! driven by a thread of its own, and an API over it in rdma_cm's terms (listen on a port,
//! connect to an address and port, accept or reject a request, disconnect), blocking with
//! timeouts or as futures for async code (`connect_async`, `Listener::request`,
//! `accept_async`, `disconnect_async`; any executor: the manager's thread wakes them), so that
//! Rust programs connect RC QPs the way librdmacm programs do, and with the same messages
//! on the wire (REQ/REP/RTU with rdma_cm's IP header, DREQ/DREP).
//!
//! QP1 is an ordinary UD QP of the device with the GSI Q_Key; its thread sleeps on a
//! completion channel between MADs and timeouts, so connection management costs the data
//! path nothing while no connection is being made.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{
    Access, Ah, CompChannel, Cq, Device, Mr, Pd, Qp, QpAttr, QpInitAttr, QpType, RecvWr, SendWr,
    VerbsError, WcOpcode, WcStatus, WorkCompletion, WrOpcode, random_psn,
};
use crate::cm::{
    AcceptParams, Agent, AgentConfig, CmEvent, ConnId, ConnectParams, PeerParams, SidrAnswer,
    SidrParams,
};
use crate::rc::{GRH_LEN, Mtu, unreliable::grh_source};
use crate::wire::cm::{CmPath, rej_reason};
use crate::wire::cma::{CMA_HDR_LEN, CmaHdr, PortSpace};
use crate::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};

/// Receive buffers of QP1.
const RECV_SLOTS: u64 = 64;
/// Send buffers of QP1.
const SEND_SLOTS: u64 = 64;
const RECV_SLOT: u64 = (GRH_LEN + MAD_LEN) as u64;
/// `wr_id`s of sends start here.
const SEND_ID: u64 = 1 << 32;

/// Why a connection could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The peer rejected the connection (`wire::cm::rej_reason`), with its private data.
    #[error("rejected by the peer (reason {reason})")]
    Rejected {
        /// The REJ's reason.
        reason: u16,
        /// The REJ's private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered.
    #[error("the peer is unreachable")]
    Unreachable,
    /// Nothing happened within the time given.
    #[error("timed out")]
    Timeout,
    /// The connection went down.
    #[error("disconnected")]
    Disconnected,
    /// The CM refused the request.
    #[error("{0}")]
    Cm(#[from] crate::cm::Error),
    /// A verb failed (QP bring-up, QP1).
    #[error("{0}")]
    Verbs(#[from] VerbsError),
}

/// What a side offers for a connection: its READ/atomic depths, retry counts and private
/// data (`struct rdma_conn_param`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data: up to 56 bytes in a connect (the REQ's 92 less rdma_cm's header), 196 in
    /// an accept.
    pub private_data: Vec<u8>,
    /// READs and atomics this side accepts at once.
    pub responder_resources: u8,
    /// READs and atomics this side issues at once.
    pub initiator_depth: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

struct Shared {
    agent: Agent,
    /// Events of connections, by connection.
    events: HashMap<ConnId, VecDeque<CmEvent>>,
    /// Requests for each listening port, oldest first.
    requests: HashMap<u16, VecDeque<(ConnId, IpAddr, Box<PeerParams>)>>,
    /// Send slots free.
    free_sends: Vec<u64>,
    /// Where events of the low-level interface go (see [`ConnectionManager::set_hook`]).
    hook: Option<CmHook>,
    /// Services listened on through the low-level interface.
    raw_services: std::collections::HashSet<u64>,
    /// Tasks waiting in a future of the async API; woken whenever events are handed out.
    wakers: Vec<Waker>,
}

/// Receives the events of connections made through the low-level interface
/// ([`ConnectionManager::raw`]); called from the connection manager's thread (or the
/// caller's) with the manager's lock held, so it must not call back into the manager: what it
/// wants done at once it returns instead ([`HookVerdict`]).
pub type CmHook = Box<dyn Fn(CmEvent) -> HookVerdict + Send>;

/// What a [`CmHook`] asks of the manager for the event it was given, done as the hook returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookVerdict {
    /// The event was taken.
    Taken,
    /// Refuse the connection request the event reported, with this REJ reason
    /// (`wire::cm::rej_reason`; e.g. `INVALID_SERVICE_ID` when its listener has gone, or
    /// `CONSUMER_DEFINED` when its private data is not rdma_cm's): the peer learns of it at
    /// once instead of timing out. Ignored for other events.
    Reject(u16),
}

struct Inner {
    dev: Device,
    pd: Pd,
    qp: Qp,
    cq: Cq,
    channel: CompChannel,
    rbuf: Mr,
    sbuf: Mr,
    ahs: Mutex<HashMap<IpAddr, Ah>>,
    shared: Mutex<Shared>,
    cond: Condvar,
    stop: AtomicBool,
    epoch: Instant,
}

impl core::fmt::Debug for Inner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConnectionManager")
            .field("device", &self.dev.addr())
            .finish()
    }
}

/// The connection manager of one device (it owns the device's QP1). Dropping the last
/// handle stops its thread.
#[derive(Debug)]
pub struct ConnectionManager {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return Instant::now().elapsed().as_nanos() as u64 ^ 0x5eed;
    }
    u64::from_ne_bytes(b)
}

/// The IPv4-mapped (or IPv6) GID of an address.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The attributes that bring an RC QP to RTS toward a peer that sent `peer` (its QPN, the PSN
/// to send from, its depths and RNR retry count), with `rq_psn` the PSN this side advertised.
fn rc_attr(mtu: Mtu, peer: &PeerParams, rq_psn: u32, param: &ConnParam, retry_cnt: u8) -> QpAttr {
    QpAttr {
        path_mtu: mtu,
        dest_qp_num: peer.qpn,
        rq_psn,
        sq_psn: peer.starting_psn,
        max_rd_atomic: param.initiator_depth.min(peer.responder_resources),
        max_dest_rd_atomic: param.responder_resources,
        retry_cnt,
        rnr_retry: peer.rnr_retry_count,
        timeout: 14,
        min_rnr_timer: 12,
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..QpAttr::default()
    }
}

fn mtu_of(code: u8) -> Mtu {
    match code {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

impl ConnectionManager {
    /// Open the connection manager of `dev`: create its QP1 and start its thread. One per
    /// device (a second fails with `NoResources`: QP1 exists).
    pub fn open(dev: &Device) -> Result<ConnectionManager, VerbsError> {
        let pd = dev.alloc_pd()?;
        let channel = dev.create_comp_channel()?;
        let cq = dev.create_cq((RECV_SLOTS + SEND_SLOTS) as u32, Some(&channel))?;
        let mut attr = QpInitAttr::new(&cq).with_type(QpType::Ud);
        attr.cap.max_recv_wr = RECV_SLOTS as u32;
        attr.cap.max_send_wr = SEND_SLOTS as u32;
        let qp = Qp::create_numbered(&pd, &attr, Some(GSI_QPN))?;
        qp.ready_ud(GSI_QKEY, random_psn())?;
        let rbuf = pd.alloc_mr((RECV_SLOTS * RECV_SLOT) as usize, Access::LOCAL_WRITE)?;
        let sbuf = pd.alloc_mr((SEND_SLOTS * MAD_LEN as u64) as usize, Access::LOCAL_WRITE)?;
        for i in 0..RECV_SLOTS {
            qp.post_recv(&RecvWr {
                wr_id: i,
                sg_list: &[rbuf.sge(i * RECV_SLOT, RECV_SLOT as u32)],
            })?;
        }
        let ca_guid = u64::from_be_bytes(dev.gid()[8..].try_into().unwrap_or([0; 8]));
        let agent = Agent::new(
            AgentConfig {
                ca_guid,
                listen_grace_ns: 200_000_000,
                connect_grace_ns: 500_000_000,
                ..AgentConfig::default()
            },
            seed(),
        );
        let inner = Arc::new(Inner {
            dev: dev.clone(),
            pd,
            qp,
            cq,
            channel,
            rbuf,
            sbuf,
            ahs: Mutex::new(HashMap::new()),
            shared: Mutex::new(Shared {
                agent,
                events: HashMap::new(),
                requests: HashMap::new(),
                free_sends: (0..SEND_SLOTS).collect(),
                hook: None,
                raw_services: std::collections::HashSet::new(),
                wakers: Vec::new(),
            }),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let run = inner.clone();
        let thread = crate::thread::spawn("softrdma-cm", move || run.run())?;
        Ok(ConnectionManager {
            inner,
            thread: Some(thread),
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Connections (and resolutions) the CM holds, time-wait included.
    pub fn conn_count(&self) -> usize {
        lock(&self.inner.shared).agent.conn_count()
    }

    /// What the CM counted.
    pub fn counters(&self) -> crate::cm::CmCounters {
        lock(&self.inner.shared).agent.counters()
    }

    /// Listen on `port` of rdma_cm's TCP port space: REQs for it wait in the listener.
    pub fn listen(&self, port: u16) -> Result<Listener<'_>, CmError> {
        let mut s = lock(&self.inner.shared);
        s.agent.listen(PortSpace::Tcp.service_id(port))?;
        s.requests.insert(port, VecDeque::new());
        // REQs held for the port come out of the listen.
        self.inner.flush(&mut s);
        Ok(Listener { cm: self, port })
    }

    /// Connect the fresh RC QP `qp` to whoever listens on `dst` (IP and rdma_cm port): REQ,
    /// then, on the REP, `qp` is brought to RTS with the peer's QPN and PSN and the RTU sent.
    pub fn connect(
        &self,
        qp: &Qp,
        dst: SocketAddr,
        param: &ConnParam,
        timeout: Duration,
    ) -> Result<Connection<'_>, CmError> {
        let (conn, rq_psn) = self.send_req(qp, dst, param)?;
        let e = self.inner.wait_event(conn.id, timeout)?;
        conn.on_rep(qp, e, rq_psn, param)
    }

    /// [`ConnectionManager::connect`] for async code: the future ends when the connection is
    /// up or refused (no timeout of its own: wrap it in the runtime's). Dropping it before
    /// then abandons the connection (the peer is told, as when a [`Connection`] drops).
    pub async fn connect_async(
        &self,
        qp: &Qp,
        dst: SocketAddr,
        param: &ConnParam,
    ) -> Result<Connection<'_>, CmError> {
        let (conn, rq_psn) = self.send_req(qp, dst, param)?;
        let e = std::future::poll_fn(|cx| self.inner.poll_event(conn.id, cx)).await;
        conn.on_rep(qp, e, rq_psn, param)
    }

    /// Send the REQ of a connect; returns the connection (not yet up) and the PSN it
    /// advertised.
    fn send_req(
        &self,
        qp: &Qp,
        dst: SocketAddr,
        param: &ConnParam,
    ) -> Result<(Connection<'_>, u32), CmError> {
        let dev = &self.inner.dev;
        let src = dev.addr();
        let mut private = vec![0u8; CMA_HDR_LEN];
        CmaHdr {
            src,
            src_port: (seed() as u16) | 0x8000,
            dst: dst.ip(),
        }
        .emit(&mut private)
        .map_err(crate::cm::Error::from)?;
        private.extend_from_slice(&param.private_data);
        // As Linux's CM: a REQ's (and a REP's) starting PSN is the PSN its sender expects to
        // receive first; the peer sends from it.
        let rq_psn = random_psn();
        let mtu = dev.config().active_mtu;
        let p = ConnectParams {
            peer: dst.ip(),
            service_id: PortSpace::Tcp.service_id(dst.port()),
            qpn: qp.qp_num(),
            starting_psn: rq_psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            path_mtu: mtu as u8,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            transport: 0,
            path: self.path_to(dst.ip()),
            private_data: private,
            // The RTU goes once `qp` is up (`on_rep`), so the peer's first packets find it
            // ready.
            defer_rtu: true,
        };
        let id = {
            let mut s = lock(&self.inner.shared);
            let now = self.inner.now();
            let id = s.agent.connect(now, p)?;
            s.events.insert(id, VecDeque::new());
            self.inner.flush(&mut s);
            id
        };
        let conn = Connection {
            cm: self,
            id,
            peer: dst.ip(),
            private_data: Vec::new(),
        };
        Ok((conn, rq_psn))
    }
}

mod conn;
mod raw;

pub use conn::{ConnRequest, Connection, Listener};
pub use raw::RawCm;

impl Inner {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The next event of connection `id`, waiting up to `timeout`.
    fn wait_event(&self, id: ConnId, timeout: Duration) -> Result<CmEvent, CmError> {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.shared);
        loop {
            if let Some(e) = s.events.get_mut(&id).and_then(|q| q.pop_front()) {
                return Ok(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            s = self
                .cond
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Send what the agent queued and hand out its events (a REJ an event leads to goes out
    /// in the same call).
    fn flush(&self, s: &mut Shared) {
        self.send_queued(s);
        if self.hand_out_events(s) {
            self.send_queued(s);
            self.cond.notify_all();
            // Wakers only schedule their task (what executors' wakers do): waking them under
            // the lock is safe, and their polls wait for it.
            for w in s.wakers.drain(..) {
                w.wake();
            }
        }
    }

    /// Register the task of `cx` to be woken at the next events.
    fn register(s: &mut Shared, cx: &Context<'_>) {
        if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            s.wakers.push(cx.waker().clone());
        }
    }

    /// Poll for the next event of connection `id` (async API).
    fn poll_event(&self, id: ConnId, cx: &Context<'_>) -> Poll<CmEvent> {
        let mut s = lock(&self.shared);
        if let Some(e) = s.events.get_mut(&id).and_then(|q| q.pop_front()) {
            return Poll::Ready(e);
        }
        Self::register(&mut s, cx);
        Poll::Pending
    }

    /// Post the MADs the agent queued on QP1.
    fn send_queued(&self, s: &mut Shared) {
        while let Some(t) = s.agent.poll_transmit() {
            let Some(slot) = s.free_sends.pop() else {
                // Every send buffer is in flight: the MAD is lost, as on a full send queue;
                // the CM's retries cover it.
                continue;
            };
            let off = slot * MAD_LEN as u64;
            if self.sbuf.write(off, &t.mad).is_err() {
                s.free_sends.push(slot);
                continue;
            }
            let ah = {
                let mut ahs = self.ahs.lock().unwrap_or_else(PoisonError::into_inner);
                ahs.entry(t.dst)
                    .or_insert_with(|| Ah::new(&self.pd, t.dst))
                    .clone()
            };
            let sge = [self.sbuf.sge(off, MAD_LEN as u32)];
            let wr = SendWr::new(SEND_ID + slot, WrOpcode::Send)
                .sg(&sge)
                .ud(ah.dest(GSI_QPN, GSI_QKEY));
            if self.qp.post_send(&wr).is_err() {
                s.free_sends.push(slot);
            }
        }
    }

    /// Hand the agent's events to their waiters, listeners or the hook; true if there were
    /// any.
    fn hand_out_events(&self, s: &mut Shared) -> bool {
        let mut woke = false;
        while let Some(e) = s.agent.poll_event() {
            woke = true;
            match e {
                CmEvent::ConnectRequest { conn, peer, params } => {
                    if s.raw_services.contains(&params.service_id)
                        && let Some(h) = &s.hook
                    {
                        if let HookVerdict::Reject(reason) =
                            h(CmEvent::ConnectRequest { conn, peer, params })
                        {
                            let _ = s.agent.reject_with(conn, reason, &[]);
                        }
                        continue;
                    }
                    let port = PortSpace::of_service_id(params.service_id).map(|(_, p)| p);
                    match port.and_then(|p| s.requests.get_mut(&p)) {
                        Some(q) => q.push_back((conn, peer, params)),
                        None => {
                            let _ = s.agent.reject(conn, &[]);
                        }
                    }
                }
                CmEvent::SidrRequest {
                    conn, service_id, ..
                } if !s.raw_services.contains(&service_id) || s.hook.is_none() => {
                    let _ = s
                        .agent
                        .reject_with(conn, rej_reason::INVALID_SERVICE_ID, &[]);
                }
                CmEvent::SidrRequest { conn, .. } => {
                    if let Some(h) = &s.hook
                        && let HookVerdict::Reject(reason) = h(e)
                    {
                        let _ = s.agent.reject_with(conn, reason, &[]);
                    }
                }
                e => {
                    let id = e.conn();
                    if let Some(q) = s.events.get_mut(&id) {
                        q.push_back(e);
                    } else if let Some(h) = &s.hook {
                        let _ = h(e);
                    }
                }
            }
        }
        woke
    }

    /// A completion of QP1.
    fn complete(&self, s: &mut Shared, wc: &WorkCompletion) {
        if wc.wr_id >= SEND_ID {
            s.free_sends.push(wc.wr_id - SEND_ID);
            return;
        }
        let slot = wc.wr_id;
        if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
            let mut buf = [0u8; RECV_SLOT as usize];
            let len = (wc.byte_len as usize).min(buf.len());
            if self.rbuf.read(slot * RECV_SLOT, &mut buf[..len]).is_ok() && len >= GRH_LEN {
                let grh: &[u8; GRH_LEN] = buf[..GRH_LEN].try_into().unwrap_or(&[0; GRH_LEN]);
                if let Some((src, _)) = grh_source(grh) {
                    let src = match src {
                        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
                        v4 => v4,
                    };
                    let now = self.now();
                    s.agent.handle_mad(now, src, &buf[GRH_LEN..len]);
                }
            }
        }
        if !self.stop.load(Ordering::Acquire) {
            let _ = self.qp.post_recv(&RecvWr {
                wr_id: slot,
                sg_list: &[self.rbuf.sge(slot * RECV_SLOT, RECV_SLOT as u32)],
            });
        }
    }

    /// The thread: MADs in, timeouts, MADs out, events to the waiting callers.
    fn run(&self) {
        let mut wcs = [super::EMPTY_WC; 16];
        while !self.stop.load(Ordering::Acquire) {
            self.cq.req_notify(false);
            loop {
                let n = self.cq.poll(&mut wcs);
                if n == 0 {
                    break;
                }
                let mut s = lock(&self.shared);
                for wc in &wcs[..n] {
                    self.complete(&mut s, wc);
                }
                self.flush(&mut s);
            }
            let wait = {
                let mut s = lock(&self.shared);
                let now = self.now();
                s.agent.handle_timeout(now);
                self.flush(&mut s);
                s.agent
                    .next_timeout()
                    .map_or(Duration::from_millis(50), |t| {
                        Duration::from_nanos(t.saturating_sub(now))
                    })
                    .min(Duration::from_millis(50))
            };
            let _ = self
                .channel
                .get_event(Some(wait.max(Duration::from_micros(100))));
        }
    }
}
