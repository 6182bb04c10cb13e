//! `rdma_cm_id`s and the calls on them.

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard, PoisonError};

use softrdma::cm::{
    AcceptParams, CmEvent, ConnId, ConnectParams, PeerParams, SidrAnswer, SidrParams,
};
use softrdma::verbs::{ConnectionManager, HookVerdict, random_psn};
use softrdma::wire::cm::{rej_reason, sidr_status};
use softrdma::wire::cma::{CMA_HDR_LEN, CmaHdr, PortSpace};

use super::abi::*;
use super::addr::{device_toward, device_with, of_storage, to_storage};
use super::{Apply, Channel, Event, Global, dev_cm, global, record_conn};
use crate::abi::*;
use crate::device::Device;
use crate::registry::{self, Kind};

/// `IBV_QPS_*`, `IBV_QP_*` and access flags used here.
const QPS_INIT: c_int = 1;
const QPS_RTR: c_int = 2;
const QPS_RTS: c_int = 3;
const QPS_ERR: c_int = 6;
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
const ACCESS_REMOTE_READ: u32 = 1 << 2;
const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
const QP_QKEY: c_int = 1 << 6;
const QPT_RC: c_int = 2;
const QPT_UD: c_int = 4;
/// `RDMA_UDP_QKEY`: the Q_Key of the UDP port space's QPs (Linux's rdma_cm sets it).
pub(super) const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The CM port space of an id's `ps` (TCP and UDP are supported).
fn port_space(ps: c_int) -> PortSpace {
    if ps == RDMA_PS_UDP {
        PortSpace::Udp
    } else {
        PortSpace::Tcp
    }
}

/// What the library keeps about an id.
#[derive(Debug, Default)]
struct State {
    dev: Option<&'static Device>,
    /// Bound (or resolved) local address and port.
    port: u16,
    listen_sid: Option<u64>,
    conn: Option<ConnId>,
    /// Passive: the REQ's parameters.
    req: Option<Box<PeerParams>>,
    /// The PSN this side expects to receive first: what its REQ or REP carries as the
    /// starting PSN (the peer sends from it; Linux's CM reads both messages this way).
    rq_psn: u32,
    /// `rdma_create_ep`'s QP attributes, for the ids `rdma_get_request` hands out.
    ep_attr: Option<ibv_qp_init_attr>,
    /// The CQs and channels `rdma_create_qp` made (destroyed with the QP).
    own_cqs: bool,
    ack_timeout: u8,
}

/// An id: the C struct first, then the library's state and its path record.
#[repr(C)]
pub struct Id {
    id: rdma_cm_id,
    path: ibv_sa_path_rec,
    /// A synchronous id (no channel given) waits on a channel of its own.
    own_channel: bool,
    st: Mutex<State>,
}

impl core::fmt::Debug for Id {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Id").finish_non_exhaustive()
    }
}

impl Id {
    fn st(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The id behind a C pointer, if live.
///
/// # Safety
/// Valid until `rdma_destroy_id`, which the C API forbids to race with other calls on it.
unsafe fn id_of<'a>(p: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    if !registry::contains(p.cast_const(), Kind::CmId) {
        return Err(libc::EINVAL);
    }
    // SAFETY: registered pointers are live Ids (C struct first).
    Ok(unsafe { &mut *p.cast::<Id>() })
}

fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
) -> Result<*mut Id, c_int> {
    let (channel, own) = if channel.is_null() {
        (Channel::new()?.cast::<rdma_event_channel>(), true)
    } else {
        (channel, false)
    };
    // SAFETY: all-zero is a valid rdma_cm_id and path record (NULL pointers, zero numbers).
    let mut c: rdma_cm_id = unsafe { core::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = if ps == RDMA_PS_UDP { QPT_UD } else { QPT_RC };
    let p = Box::into_raw(Box::new(Id {
        id: c,
        // SAFETY: as above.
        path: unsafe { core::mem::zeroed() },
        own_channel: own,
        st: Mutex::new(State {
            ack_timeout: 14,
            ..State::default()
        }),
    }));
    registry::insert(p.cast_const().cast::<rdma_cm_id>(), Kind::CmId);
    Ok(p)
}

fn channel_of<'a>(id: &Id) -> Option<&'a Channel> {
    // SAFETY: an id's channel outlives it (the C API), or is its own.
    unsafe { Channel::from_c(id.id.channel) }
}

fn queue(id: &mut Id, ev: Box<Event>) {
    if let Some(c) = channel_of(id) {
        c.push(ev);
    }
}

/// Wait on a synchronous id's own channel for `want`; any other outcome is its errno.
fn wait_sync(id: &mut Id, want: c_int) -> Result<(), c_int> {
    let ch = channel_of(id).ok_or(libc::EINVAL)?;
    loop {
        let mut ev = ch.pop()?;
        apply(&mut ev);
        let (event, status) = (ev.ev.event, ev.ev.status);
        if event == want {
            return Ok(());
        }
        return Err(match event {
            event::REJECTED => libc::ECONNREFUSED,
            event::UNREACHABLE | event::CONNECT_ERROR => libc::ETIMEDOUT,
            event::DISCONNECTED => libc::ECONNRESET,
            event::ADDR_ERROR | event::ROUTE_ERROR => {
                if status < 0 {
                    -status
                } else {
                    libc::EHOSTUNREACH
                }
            }
            _ => continue,
        });
    }
}

/// The id's device, its CM, context and default PD.
fn dev_of(
    id: &Id,
) -> Result<
    (
        &'static Device,
        *mut ibv_context,
        *mut ibv_pd,
        &'static ConnectionManager,
    ),
    c_int,
> {
    let dev = id.st().dev.ok_or(libc::EINVAL)?;
    let (ctx, pd, cm) = dev_cm(&mut global(), dev)?;
    Ok((dev, ctx, pd, cm))
}

fn set_device(id: &mut Id, dev: &'static Device) -> Result<(), c_int> {
    let (ctx, pd, _) = dev_cm(&mut global(), dev)?;
    id.id.verbs = ctx;
    id.id.port_num = 1;
    if id.id.pd.is_null() {
        id.id.pd = pd;
    }
    id.st().dev = Some(dev);
    Ok(())
}

fn gid_of(ip: IpAddr) -> ibv_gid {
    let raw = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    ibv_gid { raw }
}

/// `rdma_create_event_channel`.
pub(crate) unsafe extern "C" fn create_event_channel() -> *mut rdma_event_channel {
    crate::errno::ffi_ptr(|| Ok(Channel::new()?.cast()))
}

/// `rdma_destroy_event_channel`.
pub(crate) unsafe extern "C" fn destroy_event_channel(ch: *mut rdma_event_channel) {
    crate::errno::guard(
        || (),
        || {
            if registry::remove(ch.cast_const(), Kind::CmChannel) {
                // SAFETY: claimed from the registry: a live Channel only we hold now.
                let c = unsafe { Box::from_raw(ch.cast::<Channel>()) };
                while let Some(p) = c.lock().pop_front() {
                    // SAFETY: queued events are Boxes of ours.
                    drop(unsafe { Box::from_raw(p as *mut Event) });
                }
                // SAFETY: our eventfd.
                unsafe { libc::close(c.ch.fd) };
            }
        },
    )
}

/// `rdma_create_id`: the TCP and UDP port spaces (IPoIB and native IB: EOPNOTSUPP).
pub(crate) unsafe extern "C" fn create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        if out.is_null() || (!ch.is_null() && unsafe { Channel::from_c(ch) }.is_none()) {
            return Err(libc::EINVAL);
        }
        if ps != RDMA_PS_TCP && ps != RDMA_PS_UDP {
            return Err(libc::EOPNOTSUPP);
        }
        let p = new_id(ch, context, ps)?;
        // SAFETY: non-NULL, writable per the contract.
        unsafe { *out = p.cast() };
        Ok(())
    })
}

/// `rdma_destroy_id`: the connection is ended (DREQ or REJ, as the CM does), events still
/// queued for it are dropped.
pub(crate) unsafe extern "C" fn destroy_id(p: *mut rdma_cm_id) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let (dev, conn, sid, port) = {
            let st = id.st();
            (st.dev, st.conn, st.listen_sid, st.port)
        };
        let mut cms = Vec::new();
        {
            let mut g = global();
            if let Some(c) = conn
                && let Some(d) = dev
            {
                g.conns.remove(&(d.index, c));
                if let Some(dc) = g.devs.get(&d.index) {
                    cms.push((dc.cm, Some((d.index, c)), None));
                }
            }
            if let Some(s) = sid {
                let keys: Vec<_> = g
                    .listeners
                    .iter()
                    .filter(|&(_, &v)| v == p as usize)
                    .map(|(k, _)| *k)
                    .collect();
                for k in keys {
                    g.listeners.remove(&k);
                    if let Some(dc) = g.devs.get(&k.0) {
                        cms.push((dc.cm, None, Some(s)));
                    }
                }
            }
            if port != 0 {
                g.ports.remove(&port);
            }
        }
        for (cm, c, s) in cms {
            if let Some((d, c)) = c {
                if cm.raw().is_disconnecting(c) {
                    // Its DREQ is unanswered: the CM keeps sending it (the peer waits for it)
                    // and its events are dropped; `linger_at_exit` gives it time if the
                    // process ends first.
                    global().detached.insert((d, c));
                } else {
                    let _ = cm.raw().destroy(c);
                }
                // Nothing more is delivered for it; what came meanwhile goes.
                global().orphans.remove(&(d, c));
            }
            if let Some(s) = s {
                let _ = cm.raw().unlisten(s);
            }
        }
        registry::remove(p.cast_const(), Kind::CmId);
        // SAFETY: claimed from the registry: ours alone now.
        let id = unsafe { Box::from_raw(p.cast::<Id>()) };
        if let Some(c) = channel_of(&id) {
            let mut q = c.lock();
            q.retain(|&e| {
                // SAFETY: queued events are Boxes of ours.
                let keep = unsafe { (*(e as *const Event)).ev.id } != p;
                if !keep {
                    drop(unsafe { Box::from_raw(e as *mut Event) });
                }
                keep
            });
        }
        if id.own_channel {
            // SAFETY: the id's own channel.
            unsafe { destroy_event_channel(id.id.channel) };
        }
        Ok(())
    })
}

/// `rdma_bind_addr`: a local device's address (or any) and a port (0: one is chosen).
pub(crate) unsafe extern "C" fn bind_addr(p: *mut rdma_cm_id, sa: *mut libc::sockaddr) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        // SAFETY: a socket address per the contract.
        let a = unsafe { super::addr::from_sockaddr(sa) }.ok_or(libc::EINVAL)?;
        bind(id, a)
    })
}

fn bind(id: &mut Id, a: SocketAddr) -> Result<(), c_int> {
    if id.st().port != 0 {
        return Err(libc::EINVAL);
    }
    let dev = if a.ip().is_unspecified() {
        None
    } else if let Some(d) = device_with(a.ip()) {
        Some(d)
    } else if a.ip().is_loopback() {
        // A loopback address no device has binds like the wildcard: no device yet
        // (`id->verbs` stays NULL). libfabric's verbs provider binds "localhost" when given no
        // address and then takes the source address from the devices' own addresses.
        None
    } else {
        return Err(libc::EADDRNOTAVAIL);
    };
    let port = global().take_port(a.port())?;
    if let Some(d) = dev {
        set_device(id, d)?;
    }
    id.st().port = port;
    let src = SocketAddr::new(a.ip(), port);
    id.id.route.addr.src = to_storage(src).0;
    Ok(())
}

/// `rdma_resolve_addr`: the local device that reaches `dst` (or the one `src` names).
pub(crate) unsafe extern "C" fn resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        // SAFETY: a socket address per the contract.
        let dst = unsafe { super::addr::from_sockaddr(dst) }.ok_or(libc::EINVAL)?;
        // SAFETY: NULL or a socket address per the contract.
        if let Some(s) = unsafe { super::addr::from_sockaddr(src) }
            && id.st().port == 0
        {
            bind(id, s)?;
        }
        let dev = match id.st().dev {
            Some(d) => d,
            None => device_toward(dst.ip()).ok_or(libc::EADDRNOTAVAIL)?,
        };
        set_device(id, dev)?;
        if id.st().port == 0 {
            let port = global().take_port(0)?;
            id.st().port = port;
        }
        let port = id.st().port;
        let local = SocketAddr::new(IpAddr::V4(dev.cfg.addr), port);
        id.id.route.addr.src = to_storage(local).0;
        id.id.route.addr.dst = to_storage(dst).0;
        id.id.route.addr.ibaddr.sgid = gid_of(local.ip());
        id.id.route.addr.ibaddr.dgid = gid_of(dst.ip());
        id.id.route.addr.ibaddr.pkey = 0xffff;
        queue(id, Event::new(p, event::ADDR_RESOLVED, 0));
        if id.own_channel {
            wait_sync(id, event::ADDR_RESOLVED)?;
        }
        Ok(())
    })
}

/// `rdma_resolve_route`: one path, the device's MTU.
pub(crate) unsafe extern "C" fn resolve_route(p: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let dev = id.st().dev.ok_or(libc::EINVAL)?;
        let a = id.id.route.addr;
        id.path.sgid = a.ibaddr.sgid;
        id.path.dgid = a.ibaddr.dgid;
        id.path.pkey = 0xffff_u16.to_be();
        id.path.hop_limit = 64;
        id.path.mtu = dev.cfg.active_mtu as u8;
        id.path.numb_path = 1;
        id.path.reversible = 1;
        id.path.packet_life_time = 18;
        id.id.route.path_rec = &mut id.path;
        id.id.route.num_paths = 1;
        queue(id, Event::new(p, event::ROUTE_RESOLVED, 0));
        if id.own_channel {
            wait_sync(id, event::ROUTE_RESOLVED)?;
        }
        Ok(())
    })
}

/// Create the QP of an id (`rdma_create_qp`): CQs on completion channels when none are given,
/// the id's PD when none is, and the QP moved to INIT.
pub(crate) unsafe extern "C" fn create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        if attr.is_null() || id.id.verbs.is_null() || !id.id.qp.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let mut a = unsafe { attr.read() };
        let pd = if pd.is_null() { id.id.pd } else { pd };
        make_qp(id, pd, &mut a)?;
        // SAFETY: as above; the granted capacities go back.
        unsafe { (*attr).cap = a.cap };
        Ok(())
    })
}

fn make_qp(id: &mut Id, pd: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let ctx = id.id.verbs;
    // The id's QP type when the attributes name none (rdma_create_ep's callers leave it 0).
    if a.qp_type == 0 {
        a.qp_type = id.id.qp_type;
    }
    let mut own = false;
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // SAFETY: our context.
        unsafe {
            let depth = a.cap.max_send_wr.max(a.cap.max_recv_wr).max(1) as c_int;
            let sch = crate::channel::ibv_create_comp_channel(ctx);
            let rch = crate::channel::ibv_create_comp_channel(ctx);
            if sch.is_null() || rch.is_null() {
                return Err(libc::ENOMEM);
            }
            let scq = crate::cq::ibv_create_cq(ctx, depth, null_mut(), sch, 0);
            let rcq = crate::cq::ibv_create_cq(ctx, depth, null_mut(), rch, 0);
            if scq.is_null() || rcq.is_null() {
                return Err(libc::ENOMEM);
            }
            id.id.send_cq_channel = sch;
            id.id.recv_cq_channel = rch;
            id.id.send_cq = scq;
            id.id.recv_cq = rcq;
        }
        a.send_cq = id.id.send_cq;
        a.recv_cq = id.id.recv_cq;
        own = true;
    } else {
        id.id.send_cq = a.send_cq;
        id.id.recv_cq = a.recv_cq;
    }
    if !a.srq.is_null() {
        id.id.srq = a.srq;
    } else if !id.id.srq.is_null() {
        a.srq = id.id.srq;
    }
    // SAFETY: our PD (or the application's, checked by ibv_create_qp).
    let qp = unsafe { crate::qp::ibv_create_qp(pd, a) };
    if qp.is_null() {
        return Err(crate::errno::errno());
    }
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut m: ibv_qp_attr = unsafe { core::mem::zeroed() };
    m.qp_state = QPS_INIT;
    m.port_num = 1;
    let rc = if a.qp_type == QPT_UD {
        // As librdmacm: a UD QP goes to RTS at once, with the port space's Q_Key.
        m.qkey = RDMA_UDP_QKEY;
        modify(qp, &mut m, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY)
            .and_then(|()| {
                m.qp_state = QPS_RTR;
                modify(qp, &mut m, QP_STATE)
            })
            .and_then(|()| {
                m.qp_state = QPS_RTS;
                m.sq_psn = 0;
                modify(qp, &mut m, QP_STATE | QP_SQ_PSN)
            })
            .err()
            .unwrap_or(0)
    } else {
        modify(
            qp,
            &mut m,
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
        )
        .err()
        .unwrap_or(0)
    };
    if rc != 0 {
        // SAFETY: as above.
        unsafe { crate::qp::ibv_destroy_qp(qp) };
        return Err(rc);
    }
    id.id.qp = qp;
    id.id.pd = pd;
    id.st().own_cqs = own;
    Ok(())
}

/// `rdma_create_qp_ex`: as `rdma_create_qp`, the PD taken from the attributes.
pub(crate) unsafe extern "C" fn create_qp_ex(p: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    if attr.is_null() {
        crate::errno::set_errno(libc::EINVAL);
        return -1;
    }
    let a = attr.cast::<ibv_qp_init_attr_ex_prefix>();
    // SAFETY: an ibv_qp_init_attr_ex starts with these fields (checked in the layout test).
    let (pd, mask) = unsafe { ((*a).pd, (*a).comp_mask) };
    let pd = if mask & 1 != 0 { pd } else { null_mut() };
    // SAFETY: forwarded; the base struct is the prefix.
    unsafe { create_qp(p, pd, core::ptr::addr_of_mut!((*a).base)) }
}

/// `rdma_destroy_qp`: the QP and the CQs `rdma_create_qp` made for it.
pub(crate) unsafe extern "C" fn destroy_qp(p: *mut rdma_cm_id) {
    crate::errno::guard(
        || (),
        || {
            // SAFETY: checked against the registry.
            let Ok(id) = (unsafe { id_of(p) }) else {
                return;
            };
            if id.id.qp.is_null() {
                return;
            }
            // SAFETY: the id's QP and the CQs made for it.
            unsafe {
                crate::qp::ibv_destroy_qp(id.id.qp);
                id.id.qp = null_mut();
                if std::mem::take(&mut id.st().own_cqs) {
                    crate::cq::ibv_destroy_cq(id.id.send_cq);
                    crate::cq::ibv_destroy_cq(id.id.recv_cq);
                    crate::channel::ibv_destroy_comp_channel(id.id.send_cq_channel);
                    crate::channel::ibv_destroy_comp_channel(id.id.recv_cq_channel);
                    id.id.send_cq = null_mut();
                    id.id.recv_cq = null_mut();
                    id.id.send_cq_channel = null_mut();
                    id.id.recv_cq_channel = null_mut();
                }
            }
        },
    )
}

fn param_or_default(param: *mut rdma_conn_param) -> rdma_conn_param {
    if param.is_null() {
        rdma_conn_param {
            private_data: core::ptr::null(),
            private_data_len: 0,
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        }
    } else {
        // SAFETY: non-NULL and readable per the contract.
        unsafe { param.read() }
    }
}

fn private_of(c: &rdma_conn_param) -> Vec<u8> {
    if c.private_data.is_null() {
        return Vec::new();
    }
    // SAFETY: the application's private data, private_data_len bytes per the contract.
    unsafe {
        core::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
    }
    .to_vec()
}

/// `rdma_connect`: a REQ to the resolved destination; ESTABLISHED (or REJECTED,
/// UNREACHABLE) follows.
pub(crate) unsafe extern "C" fn connect(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let (dev, _, _, cm) = dev_of(id)?;
        let dst = of_storage(&id.id.route.addr.dst).ok_or(libc::EINVAL)?;
        let src = of_storage(&id.id.route.addr.src).ok_or(libc::EINVAL)?;
        let c = param_or_default(param);
        let qpn = if id.id.qp.is_null() {
            c.qp_num
        } else {
            // SAFETY: the id's QP.
            unsafe { (*id.id.qp).qp_num }
        };
        let mut private = vec![0u8; CMA_HDR_LEN];
        CmaHdr {
            src: src.ip(),
            src_port: src.port(),
            dst: dst.ip(),
        }
        .emit(&mut private)
        .map_err(|_| libc::EINVAL)?;
        private.extend_from_slice(&private_of(&c));
        if id.id.ps == RDMA_PS_UDP {
            // A service ID resolution; ESTABLISHED (with the peer's QP and Q_Key) or
            // UNREACHABLE follows.
            let params = SidrParams {
                peer: dst.ip(),
                service_id: PortSpace::Udp.service_id(dst.port()),
                private_data: private,
            };
            let conn = cm.raw().sidr_request(params).map_err(|_| libc::EINVAL)?;
            id.st().conn = Some(conn);
            record_conn(dev.index, conn, p.cast());
            if id.own_channel {
                wait_sync(id, event::ESTABLISHED)?;
            }
            return Ok(());
        }
        if private.len() > 92 {
            return Err(libc::EINVAL);
        }
        let rq_psn = random_psn();
        id.st().rq_psn = rq_psn;
        let params = ConnectParams {
            peer: dst.ip(),
            service_id: PortSpace::Tcp.service_id(dst.port()),
            qpn,
            starting_psn: rq_psn,
            responder_resources: c
                .responder_resources
                .min(crate::limits::MAX_QP_RD_ATOM as u8),
            initiator_depth: c.initiator_depth.min(crate::limits::MAX_QP_RD_ATOM as u8),
            path_mtu: dev.cfg.active_mtu as u8,
            retry_count: c.retry_count.min(7),
            rnr_retry_count: c.rnr_retry_count.min(7),
            srq: !id.id.srq.is_null(),
            transport: 0,
            path: cm.path_to(dst.ip()),
            private_data: private,
            // As librdmacm: the RTU goes when the application takes ESTABLISHED and the QP
            // is up (`apply`), so the peer's first packets find it ready.
            defer_rtu: true,
        };
        let conn = cm.raw().connect(params).map_err(|_| libc::EINVAL)?;
        id.st().conn = Some(conn);
        record_conn(dev.index, conn, p.cast());
        if id.own_channel {
            wait_sync(id, event::ESTABLISHED)?;
        }
        Ok(())
    })
}

/// `rdma_listen`: on the bound device, or on every device when bound to any address.
pub(crate) unsafe extern "C" fn listen(p: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        if id.st().port == 0 {
            bind(id, SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let (port, dev) = {
            let st = id.st();
            (st.port, st.dev)
        };
        let sid = port_space(id.id.ps).service_id(port);
        let devs: Vec<&'static Device> = match dev {
            Some(d) => vec![d],
            None => crate::device::devices()
                .map_err(|_| libc::ENODEV)?
                .iter()
                .collect(),
        };
        for d in devs {
            let (ctx, pd, cm) = dev_cm(&mut global(), d)?;
            if id.id.verbs.is_null() {
                id.id.verbs = ctx;
                id.id.pd = pd;
                id.id.port_num = 1;
            }
            // Registered first: a REQ held for the port comes out of the CM's listen.
            global().listeners.insert((d.index, sid), p as usize);
            if cm.raw().listen(sid).is_err() {
                global().listeners.remove(&(d.index, sid));
                return Err(libc::EADDRINUSE);
            }
        }
        id.st().listen_sid = Some(sid);
        Ok(())
    })
}

/// A connection request for a service listened on through device `dev`: a new id queued as
/// `RDMA_CM_EVENT_CONNECT_REQUEST` on the listener's channel. A request whose listener has
/// gone meanwhile is refused as Linux's CM does (invalid service ID); one whose private data
/// lacks rdma_cm's header, or that cannot get an id, is refused as the consumer's: the peer
/// hears at once rather than timing out.
pub(super) fn on_request(g: &mut Global, dev: usize, e: CmEvent) -> HookVerdict {
    let (conn, peer, service_id, private_data, params) = match e {
        CmEvent::ConnectRequest { conn, peer, params } => (
            conn,
            peer,
            params.service_id,
            params.private_data.clone(),
            Some(params),
        ),
        // The UDP port space: SIDR_REQ; the event carries its private data only.
        CmEvent::SidrRequest {
            conn,
            peer,
            service_id,
            private_data,
        } => (conn, peer, service_id, private_data, None),
        _ => return HookVerdict::Taken,
    };
    let Some(&lp) = g.listeners.get(&(dev, service_id)) else {
        return HookVerdict::Reject(rej_reason::INVALID_SERVICE_ID);
    };
    // SAFETY: listeners are removed from the map before their id is freed.
    let listener = unsafe { &mut *(lp as *mut Id) };
    let Ok(hdr) = CmaHdr::parse(&private_data) else {
        return HookVerdict::Reject(rej_reason::CONSUMER_DEFINED);
    };
    let (Some(d), Some(dc)) = (
        crate::device::devices()
            .ok()
            .and_then(|v| v.iter().find(|x| x.index == dev)),
        g.devs.get(&dev),
    ) else {
        return HookVerdict::Reject(rej_reason::CONSUMER_DEFINED);
    };
    let Ok(cp) = new_id(listener.id.channel, listener.id.context, listener.id.ps) else {
        return HookVerdict::Reject(rej_reason::NO_RESOURCES);
    };
    // SAFETY: just created.
    let child = unsafe { &mut *cp };
    child.id.verbs = dc.ctx;
    child.id.pd = if listener.id.pd.is_null() {
        dc.pd
    } else {
        listener.id.pd
    };
    child.id.port_num = 1;
    let lport = listener.st().port;
    let local = SocketAddr::new(IpAddr::V4(d.cfg.addr), lport);
    let remote = SocketAddr::new(peer, hdr.src_port);
    child.id.route.addr.src = to_storage(local).0;
    child.id.route.addr.dst = to_storage(remote).0;
    child.id.route.addr.ibaddr.sgid = gid_of(local.ip());
    child.id.route.addr.ibaddr.dgid = gid_of(peer);
    child.id.route.addr.ibaddr.pkey = 0xffff;
    {
        let mut st = child.st();
        st.dev = Some(d);
        st.conn = Some(conn);
        st.ep_attr = listener.st().ep_attr;
    }
    let mut ev = Event::new(cp.cast(), event::CONNECT_REQUEST, 0);
    ev.ev.listen_id = lp as *mut rdma_cm_id;
    let data = &private_data[CMA_HDR_LEN.min(private_data.len())..];
    match params {
        Some(params) => {
            ev.conn(data, Some(&params));
            child.st().req = Some(params);
        }
        None => ev.ud(data, None, 0, 0),
    }
    g.conns.insert((dev, conn), cp as usize);
    queue(listener, ev);
    HookVerdict::Taken
}

/// The address handle attributes toward `dgid` through port 1 (RoCE: global routing).
fn ah_attr_to(dgid: ibv_gid) -> ibv_ah_attr {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut a: ibv_ah_attr = unsafe { core::mem::zeroed() };
    a.is_global = 1;
    a.grh.dgid = dgid;
    a.grh.hop_limit = 64;
    a.port_num = 1;
    a
}

/// An event of an id's connection.
pub(super) fn on_conn_event(g: &mut Global, dev: usize, p: *mut Id, e: CmEvent) {
    // SAFETY: ids are removed from the map before they are freed.
    let id = unsafe { &mut *p };
    let cp = p.cast::<rdma_cm_id>();
    let ev = match e {
        CmEvent::Established { params, .. } => {
            let mut ev = Event::new(cp, event::ESTABLISHED, 0);
            if let Some(rep) = params {
                ev.conn(&rep.private_data, Some(&rep));
                ev.apply = Apply::Rep(rep);
            }
            ev
        }
        CmEvent::Rejected {
            conn,
            reason,
            private_data,
        } => {
            g.conns.remove(&(dev, conn));
            id.st().conn = None;
            let mut ev = Event::new(cp, event::REJECTED, c_int::from(reason));
            ev.conn(&private_data, None);
            ev
        }
        CmEvent::Unreachable { conn } => {
            g.conns.remove(&(dev, conn));
            id.st().conn = None;
            Event::new(cp, event::UNREACHABLE, -libc::ETIMEDOUT)
        }
        CmEvent::Disconnected { private_data, .. } => {
            let mut ev = Event::new(cp, event::DISCONNECTED, 0);
            ev.conn(&private_data, None);
            ev
        }
        CmEvent::TimewaitExit { conn } => {
            g.conns.remove(&(dev, conn));
            id.st().conn = None;
            return;
        }
        // The UDP port space: the resolution is over either way. Linux reports a refusal
        // as UNREACHABLE with the SIDR_REP's status.
        CmEvent::SidrReply {
            conn,
            status,
            qpn,
            qkey,
            private_data,
            ..
        } => {
            g.conns.remove(&(dev, conn));
            id.st().conn = None;
            if status != sidr_status::SUCCESS {
                Event::new(cp, event::UNREACHABLE, c_int::from(status))
            } else {
                let mut ev = Event::new(cp, event::ESTABLISHED, 0);
                let ah = ah_attr_to(id.id.route.addr.ibaddr.dgid);
                ev.ud(&private_data, Some(ah), qpn, qkey);
                ev
            }
        }
        CmEvent::ConnectRequest { .. } | CmEvent::SidrRequest { .. } => return,
    };
    queue(id, ev);
}

fn modify(qp: *mut ibv_qp, a: &mut ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: a QP of ours (checked by ibv_modify_qp).
    match unsafe { crate::qp::ibv_modify_qp(qp, a, mask) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// What the QP is brought up with: the peer's QP and PSN, the path MTU, the depths (incoming
/// READs/atomics served, outgoing ones issued) and the retry counts.
#[derive(Clone, Copy, Debug)]
struct Peer {
    qpn: u32,
    psn: u32,
    mtu: u8,
    resp: u8,
    init: u8,
    retry: u8,
    rnr: u8,
}

/// Bring the id's QP to RTR and RTS toward the peer.
fn qp_up(id: &Id, p: Peer) -> Result<(), c_int> {
    let Peer {
        qpn: peer_qpn,
        psn: peer_psn,
        mtu,
        resp,
        init,
        retry,
        rnr,
    } = p;
    let qp = id.id.qp;
    if qp.is_null() {
        return Ok(());
    }
    let (rq_psn, ack_timeout) = {
        let st = id.st();
        (st.rq_psn, st.ack_timeout)
    };
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut a: ibv_qp_attr = unsafe { core::mem::zeroed() };
    a.qp_state = QPS_RTR;
    a.path_mtu = c_int::from(mtu.clamp(1, 5));
    a.dest_qp_num = peer_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = resp;
    a.min_rnr_timer = 12;
    a.qp_access_flags = ACCESS_REMOTE_WRITE
        | if resp > 0 {
            ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
        } else {
            0
        };
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = id.id.route.addr.ibaddr.dgid;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    modify(
        qp,
        &mut a,
        QP_STATE
            | QP_AV
            | QP_PATH_MTU
            | QP_DEST_QPN
            | QP_RQ_PSN
            | QP_MAX_DEST_RD_ATOMIC
            | QP_MIN_RNR_TIMER
            | QP_ACCESS_FLAGS,
    )?;
    a.qp_state = QPS_RTS;
    a.timeout = ack_timeout;
    a.retry_cnt = retry.min(7);
    a.rnr_retry = rnr.min(7);
    a.sq_psn = peer_psn;
    a.max_rd_atomic = init;
    modify(
        qp,
        &mut a,
        QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC,
    )
}

/// What the application's taking of `ev` does first (the active side's QP comes up).
pub(super) fn apply(ev: &mut Event) {
    if let Apply::Rep(rep) = std::mem::replace(&mut ev.apply, Apply::None) {
        // SAFETY: the event's id is live until its events are acked or it is destroyed
        // (destroy drops its queued events).
        let Ok(id) = (unsafe { id_of(ev.ev.id) }) else {
            return;
        };
        let mtu = id.st().dev.map_or(3, |d| d.cfg.active_mtu as u8);
        let mtu = if rep.path_mtu != 0 {
            mtu.min(rep.path_mtu)
        } else {
            mtu
        };
        // The depths the REP grants: its initiator depth is what it will send us, its
        // responder resources what we may have outstanding.
        let max = crate::limits::MAX_QP_RD_ATOM as u8;
        let (resp, init) = (
            rep.initiator_depth.min(max),
            rep.responder_resources.min(max),
        );
        let up = qp_up(
            id,
            Peer {
                qpn: rep.qpn,
                psn: rep.starting_psn,
                mtu,
                resp,
                init,
                retry: rep.retry_count,
                rnr: rep.rnr_retry_count,
            },
        );
        let (dev, conn) = {
            let st = id.st();
            (st.dev, st.conn)
        };
        let cm = dev.and_then(|d| global().devs.get(&d.index).map(|dc| dc.cm));
        match (up, cm, conn) {
            (Ok(()), Some(cm), Some(c)) if cm.raw().establish(c).is_ok() => {}
            _ => {
                ev.ev.event = event::CONNECT_ERROR;
                ev.ev.status = -libc::EINVAL;
            }
        }
    }
}

/// `rdma_accept`: the QP to RTS toward the requester, then the REP; ESTABLISHED follows
/// the RTU.
pub(crate) unsafe extern "C" fn accept(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let (dev, _, _, cm) = dev_of(id)?;
        if id.id.ps == RDMA_PS_UDP {
            return accept_ud(id, dev, cm, &param_or_default(param));
        }
        let (req, conn) = {
            let st = id.st();
            (st.req.clone(), st.conn)
        };
        let (req, conn) = (req.ok_or(libc::EINVAL)?, conn.ok_or(libc::EINVAL)?);
        let mut c = param_or_default(param);
        if param.is_null() {
            c.responder_resources = req.initiator_depth;
            c.initiator_depth = req.responder_resources;
        }
        // The depths the device can give (an rdma_connect with NULL parameters on Linux asks
        // for its device's maximum, rxe's 128).
        let max = crate::limits::MAX_QP_RD_ATOM as u8;
        let resp = c.responder_resources.min(max);
        let init = c.initiator_depth.min(req.responder_resources).min(max);
        let rq_psn = random_psn();
        id.st().rq_psn = rq_psn;
        let mtu = (dev.cfg.active_mtu as u8).min(req.path_mtu.max(1));
        qp_up(
            id,
            Peer {
                qpn: req.qpn,
                psn: req.starting_psn,
                mtu,
                resp,
                init,
                retry: req.retry_count,
                rnr: req.rnr_retry_count,
            },
        )?;
        let qpn = if id.id.qp.is_null() {
            c.qp_num
        } else {
            // SAFETY: the id's QP.
            unsafe { (*id.id.qp).qp_num }
        };
        let a = AcceptParams {
            qpn,
            starting_psn: rq_psn,
            responder_resources: resp,
            initiator_depth: init,
            rnr_retry_count: c.rnr_retry_count.min(7),
            srq: !id.id.srq.is_null(),
            private_data: private_of(&c),
        };
        cm.raw().accept(conn, a).map_err(|_| libc::EINVAL)?;
        if id.own_channel {
            wait_sync(id, event::ESTABLISHED)?;
        }
        Ok(())
    })
}

/// `rdma_accept` of a UDP port space request: a SIDR_REP with the id's UD QP (or the
/// parameters' `qp_num`) and the port space's Q_Key. No event follows (as on Linux).
fn accept_ud(
    id: &mut Id,
    dev: &'static Device,
    cm: &ConnectionManager,
    c: &rdma_conn_param,
) -> Result<(), c_int> {
    let conn = id.st().conn.ok_or(libc::EINVAL)?;
    let qpn = if id.id.qp.is_null() {
        c.qp_num
    } else {
        // SAFETY: the id's QP.
        unsafe { (*id.id.qp).qp_num }
    };
    let answer = SidrAnswer {
        status: sidr_status::SUCCESS,
        qpn,
        qkey: RDMA_UDP_QKEY,
        private_data: private_of(c),
    };
    cm.raw()
        .sidr_answer(conn, answer)
        .map_err(|_| libc::EINVAL)?;
    id.st().conn = None;
    global().conns.remove(&(dev.index, conn));
    Ok(())
}

/// `rdma_reject`: REJ "consumer defined" with private data (a UDP port space request: a
/// SIDR_REP "rejected").
pub(crate) unsafe extern "C" fn reject(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let (dev, _, _, cm) = dev_of(id)?;
        let conn = id.st().conn.take().ok_or(libc::EINVAL)?;
        let data = if data.is_null() {
            Vec::new()
        } else {
            // SAFETY: `len` bytes readable per the contract.
            unsafe { core::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
        };
        global().conns.remove(&(dev.index, conn));
        cm.raw().reject(conn, &data).map_err(|_| libc::EINVAL)
    })
}

/// `rdma_disconnect`: the QP to the error state, and a DREQ; DISCONNECTED follows.
pub(crate) unsafe extern "C" fn disconnect(p: *mut rdma_cm_id) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let (_, _, _, cm) = dev_of(id)?;
        if !id.id.qp.is_null() {
            // SAFETY: all-zero is a valid ibv_qp_attr.
            let mut a: ibv_qp_attr = unsafe { core::mem::zeroed() };
            a.qp_state = QPS_ERR;
            let _ = modify(id.id.qp, &mut a, QP_STATE);
        }
        let conn = id.st().conn.ok_or(libc::EINVAL)?;
        cm.raw().disconnect(conn, &[]).map_err(|_| libc::EINVAL)?;
        if id.own_channel {
            let _ = wait_sync(id, event::DISCONNECTED);
        }
        Ok(())
    })
}

/// `rdma_get_cm_event`.
pub(crate) unsafe extern "C" fn get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let c = unsafe { Channel::from_c(ch) }.ok_or(libc::EINVAL)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let mut ev = c.pop()?;
        apply(&mut ev);
        // SAFETY: non-NULL, writable per the contract; the event stays ours until acked.
        unsafe { *out = Box::into_raw(ev).cast() };
        Ok(())
    })
}

/// `rdma_ack_cm_event`.
pub(crate) unsafe extern "C" fn ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    crate::errno::ffi_minus1(|| {
        if ev.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: handed out by get_cm_event (Box<Event>, C struct first), acked once.
        drop(unsafe { Box::from_raw(ev.cast::<Event>()) });
        Ok(())
    })
}

/// `rdma_set_option`: the ID options are taken (ACK timeout used), path records refused.
pub(crate) unsafe extern "C" fn set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        match (level, name) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if !val.is_null() && len >= 1 => {
                // SAFETY: at least one readable byte per the contract.
                id.st().ack_timeout = unsafe { *val.cast::<u8>() }.min(31);
                Ok(())
            }
            (
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY,
            ) => Ok(()),
            _ => Err(libc::EOPNOTSUPP),
        }
    })
}

/// `rdma_migrate_id`: the id and its queued events move to another channel.
pub(crate) unsafe extern "C" fn migrate_id(
    p: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        // SAFETY: checked against the registry.
        let to = unsafe { Channel::from_c(ch) }.ok_or(libc::EINVAL)?;
        let from = channel_of(id).ok_or(libc::EINVAL)?;
        let mut moved = Vec::new();
        from.lock().retain(|&e| {
            // SAFETY: queued events are Boxes of ours.
            let mine = unsafe { (*(e as *const Event)).ev.id } == p;
            if mine {
                moved.push(e);
            }
            !mine
        });
        for e in moved {
            let mut v: u64 = 0;
            // SAFETY: one count per moved event off the old eventfd.
            unsafe { libc::read(from.ch.fd, (&mut v as *mut u64).cast(), 8) };
            // SAFETY: a Box of ours, moved.
            to.push(unsafe { Box::from_raw(e as *mut Event) });
        }
        let old = id.id.channel;
        id.id.channel = ch;
        if id.own_channel {
            // A synchronous id (created without a channel) becomes asynchronous, as in
            // rdma-core: its events go to `ch` from now on, and the channel it made for itself
            // goes away. libfabric resolves the address synchronously and then migrates.
            id.own_channel = false;
            // SAFETY: the id's own channel, which nothing else names.
            unsafe { destroy_event_channel(old) };
        }
        Ok(())
    })
}

/// `rdma_get_request`: the next connection request of a synchronous listener, its QP
/// created from `rdma_create_ep`'s attributes.
pub(crate) unsafe extern "C" fn get_request(
    lp: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let l = unsafe { id_of(lp) }?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let ch = channel_of(l).ok_or(libc::EINVAL)?;
        let ev = loop {
            let ev = ch.pop()?;
            if ev.ev.event == event::CONNECT_REQUEST {
                break ev;
            }
        };
        let cp = ev.ev.id;
        drop(ev);
        // SAFETY: the child id the request made.
        let child = unsafe { id_of(cp) }?;
        let attr = child.st().ep_attr;
        if let Some(mut a) = attr {
            let pd = child.id.pd;
            make_qp(child, pd, &mut a)?;
        }
        // SAFETY: writable per the contract.
        unsafe { *out = cp };
        Ok(())
    })
}

/// `rdma_create_ep`: an id from `rdma_getaddrinfo`'s result: bound (passive) or resolved
/// (active), with a QP when attributes are given; synchronous.
pub(crate) unsafe extern "C" fn create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        if out.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: readable per the contract.
        let r = unsafe { &*res };
        let ps = if r.ai_port_space == 0 {
            RDMA_PS_TCP
        } else {
            r.ai_port_space
        };
        if ps != RDMA_PS_TCP {
            return Err(libc::EOPNOTSUPP);
        }
        let p = new_id(null_mut(), null_mut(), ps)?;
        // SAFETY: just created.
        let id = unsafe { &mut *p };
        let cp = p.cast::<rdma_cm_id>();
        let attr = (!qp_attr.is_null()).then(|| {
            // SAFETY: readable per the contract.
            unsafe { qp_attr.read() }
        });
        let r2 = (|| {
            if !pd.is_null() {
                id.id.pd = pd;
            }
            if r.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's source address (or NULL).
                let a = unsafe { super::addr::from_sockaddr(r.ai_src_addr) }.ok_or(libc::EINVAL)?;
                bind(id, a)?;
                id.st().ep_attr = attr;
                return Ok(());
            }
            // SAFETY: our id; the addresses from the addrinfo.
            if unsafe { resolve_addr(cp, r.ai_src_addr, r.ai_dst_addr, 2000) } != 0 {
                return Err(crate::errno::errno());
            }
            // SAFETY: as above.
            if unsafe { resolve_route(cp, 2000) } != 0 {
                return Err(crate::errno::errno());
            }
            if let Some(mut a) = attr {
                let pd = id.id.pd;
                make_qp(id, pd, &mut a)?;
            }
            Ok(())
        })();
        if let Err(e) = r2 {
            // SAFETY: our id.
            unsafe { destroy_id(cp) };
            return Err(e);
        }
        // SAFETY: writable per the contract.
        unsafe { *out = cp };
        Ok(())
    })
}

/// `rdma_destroy_ep`.
pub(crate) unsafe extern "C" fn destroy_ep(p: *mut rdma_cm_id) {
    // SAFETY: forwarded.
    unsafe {
        destroy_qp(p);
        destroy_id(p);
    }
}

/// `rdma_establish`: the RTU went out already when the REP arrived.
pub(crate) unsafe extern "C" fn establish(p: *mut rdma_cm_id) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        unsafe { id_of(p) }.map(|_| ())
    })
}

/// `rdma_init_qp_attr`: the attributes of the QP's next state (INIT before a connection,
/// RTR and RTS from the peer's parameters).
pub(crate) unsafe extern "C" fn init_qp_attr(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: writable per the contract.
        let (a, m) = unsafe { (&mut *attr, &mut *mask) };
        let want = a.qp_state;
        if id.id.ps == RDMA_PS_UDP {
            // UD: the port space's Q_Key; nothing about a peer.
            match want {
                QPS_INIT => {
                    a.port_num = 1;
                    a.pkey_index = 0;
                    a.qkey = RDMA_UDP_QKEY;
                    *m = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY;
                }
                QPS_RTR => *m = QP_STATE,
                QPS_RTS => {
                    a.sq_psn = 0;
                    *m = QP_STATE | QP_SQ_PSN;
                }
                _ => return Err(libc::EINVAL),
            }
            return Ok(());
        }
        let st = id.st();
        match (want, &st.req) {
            (QPS_INIT, _) => {
                a.port_num = 1;
                a.pkey_index = 0;
                a.qp_access_flags = 0;
                *m = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
            }
            (QPS_RTR, Some(r)) => {
                a.path_mtu = c_int::from(r.path_mtu.clamp(1, 5));
                a.dest_qp_num = r.qpn;
                a.rq_psn = st.rq_psn;
                a.max_dest_rd_atomic = r.initiator_depth;
                a.min_rnr_timer = 12;
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = id.id.route.addr.ibaddr.dgid;
                a.ah_attr.grh.hop_limit = 64;
                a.ah_attr.port_num = 1;
                a.qp_access_flags = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
                *m = QP_STATE
                    | QP_AV
                    | QP_PATH_MTU
                    | QP_DEST_QPN
                    | QP_RQ_PSN
                    | QP_MAX_DEST_RD_ATOMIC
                    | QP_MIN_RNR_TIMER
                    | QP_ACCESS_FLAGS;
            }
            (QPS_RTS, Some(r)) => {
                a.timeout = st.ack_timeout;
                a.retry_cnt = r.retry_count;
                a.rnr_retry = r.rnr_retry_count;
                a.sq_psn = r.starting_psn;
                a.max_rd_atomic = r.responder_resources;
                *m = QP_STATE
                    | QP_TIMEOUT
                    | QP_RETRY_CNT
                    | QP_RNR_RETRY
                    | QP_SQ_PSN
                    | QP_MAX_QP_RD_ATOMIC;
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    })
}

/// `rdma_create_srq`: an SRQ on the id's PD (or `pd`), used by the QP made next.
pub(crate) unsafe extern "C" fn create_srq(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: checked against the registry.
        let id = unsafe { id_of(p) }?;
        let pd = if pd.is_null() { id.id.pd } else { pd };
        // SAFETY: forwarded; ibv_create_srq checks its arguments.
        let srq = unsafe { crate::srq::ibv_create_srq(pd, attr) };
        if srq.is_null() {
            return Err(crate::errno::errno());
        }
        id.id.srq = srq;
        Ok(())
    })
}

/// `rdma_destroy_srq`.
pub(crate) unsafe extern "C" fn destroy_srq(p: *mut rdma_cm_id) {
    crate::errno::guard(
        || (),
        || {
            // SAFETY: checked against the registry.
            if let Ok(id) = unsafe { id_of(p) }
                && !id.id.srq.is_null()
            {
                // SAFETY: the id's SRQ.
                unsafe { crate::srq::ibv_destroy_srq(id.id.srq) };
                id.id.srq = null_mut();
            }
        },
    )
}

/// `rdma_get_devices`: the contexts the library uses, one per device that opens (one that
/// cannot, say because another process holds its address's port, is left out, as librdmacm
/// leaves out a device it cannot open), NULL-terminated. `*num` is always written, 0 on
/// failure: callers such as libfabric's verbs provider read it before the list.
pub(crate) unsafe extern "C" fn get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    if !num.is_null() {
        // SAFETY: writable per the contract.
        unsafe { *num = 0 };
    }
    crate::errno::ffi_ptr(|| {
        let devs = crate::device::devices().map_err(|_| libc::ENODEV)?;
        let mut v: Vec<*mut ibv_context> = Vec::with_capacity(devs.len() + 1);
        for d in devs {
            // A device that does not open said why on stderr (`engine_for`).
            if let Ok((ctx, _, _)) = dev_cm(&mut global(), d) {
                v.push(ctx);
            }
        }
        if !num.is_null() {
            // SAFETY: writable per the contract.
            unsafe { *num = v.len() as c_int };
        }
        v.push(null_mut());
        let b = v.into_boxed_slice();
        let n = b.len();
        let p = Box::into_raw(b).cast::<*mut ibv_context>();
        global_lists().insert(p as usize, n);
        Ok(p)
    })
}

fn global_lists() -> MutexGuard<'static, std::collections::HashMap<usize, usize>> {
    static LISTS: std::sync::LazyLock<Mutex<std::collections::HashMap<usize, usize>>> =
        std::sync::LazyLock::new(Default::default);
    LISTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `rdma_free_devices`.
pub(crate) unsafe extern "C" fn free_devices(list: *mut *mut ibv_context) {
    if let Some(n) = global_lists().remove(&(list as usize)) {
        // SAFETY: the boxed slice get_devices made, of n entries.
        drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(list, n)) });
    }
}
