//! Queue pairs: create, modify, query, destroy (RC, UC and UD), over `softrdma::verbs::Qp`.
//!
//! The address vector of `ibv_modify_qp` (INIT→RTR, `IBV_QP_AV`; RC and UC) is the peer's
//! GID in `ah_attr.grh.dgid`: an IPv4-mapped GID names the peer's address, which becomes the
//! engine's path (`Qp::av_for`). Without a GRH (`is_global = 0`, as InfiniBand programs such as
//! qperf build it from an exchanged LID) the DLID names an address in the device's /16
//! (`Device::lid`); a DLID of 0 is EINVAL, as on any RoCE port. A path MTU
//! above the port's active MTU is lowered to it (as rxe does). UD QPs take `IBV_QP_QKEY` and
//! name each destination in the work request (an address handle). The first error
//! completion of a QP (other than a flush) also reports `IBV_EVENT_QP_FATAL` on the async fd.

use core::ffi::c_int;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use softrdma::verbs::Access;
use softrdma::verbs::{self, Mtu, QpAttr, QpAttrMask, QpCap, QpState};

use crate::abi::*;
use crate::context::Shared;
use crate::cq::{Cq, IBV_EVENT_QP_FATAL};
use crate::device::Device;
use crate::errno::{ffi_errno, ffi_ptr};
use crate::mr::Pd;
use crate::qp_ex::{QpExOps, WrBatch};
use crate::registry::{self, Kind};
use crate::srq::Srq;

/// `IBV_EVENT_QP_ACCESS_ERR`.
pub const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;

/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: c_int = 2;
/// `IBV_QPT_UC`.
pub const IBV_QPT_UC: c_int = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: c_int = 4;
/// `IBV_QPT_RAW_PACKET`.
pub const IBV_QPT_RAW_PACKET: c_int = 8;
/// `IBV_QPT_XRC_SEND`.
pub const IBV_QPT_XRC_SEND: c_int = 9;
/// `IBV_QPT_XRC_RECV`.
pub const IBV_QPT_XRC_RECV: c_int = 10;
/// `IBV_QPT_DRIVER`.
pub const IBV_QPT_DRIVER: c_int = 0xff;

/// Inline bytes every QP accepts at least (more when asked for, up to [`MAX_INLINE`]).
pub const MIN_INLINE: u32 = 256;
/// Largest `max_inline_data`.
pub const MAX_INLINE: u32 = 4096;

/// A queue pair: the C struct first, then ours.
#[repr(C)]
pub struct Qp {
    /// What C sees.
    pub qp: ibv_qp,
    /// The rest of `struct ibv_qp_ex`: the `ibv_wr_*` operations (`crate::wr_ex`), as the
    /// context hands them out.
    pub ex: QpExOps,
    /// The requests `ibv_wr_*` built since `ibv_wr_start`.
    pub wr_batch: Mutex<WrBatch>,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's QP.
    pub vqp: verbs::Qp,
    /// Its capacities as created.
    pub cap: ibv_qp_cap,
    /// `sq_sig_all`.
    pub sq_sig_all: c_int,
    /// `IBV_QPT_RC`, `IBV_QPT_UC` or `IBV_QPT_UD`.
    pub qp_type: c_int,
    /// The last address vector given (for `ibv_query_qp`).
    ah_attr: Mutex<Option<ibv_ah_attr>>,
    /// `IBV_EVENT_QP_FATAL` was reported.
    fatal_reported: AtomicBool,
}

impl core::fmt::Debug for Qp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp.qp_num)
            .finish()
    }
}

impl Qp {
    /// The QP behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_qp(qp)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: registered QP pointers point to a live Qp (C struct first).
        registry::contains(qp, Kind::Qp).then(|| unsafe { &*qp.cast::<Qp>() })
    }
}

/// Live QPs by (context, QP number), to name the QP of an async event.
static BY_QPN: LazyLock<Mutex<HashMap<(usize, u32), usize>>> = LazyLock::new(Default::default);

fn by_qpn() -> std::sync::MutexGuard<'static, HashMap<(usize, u32), usize>> {
    BY_QPN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A test seam (feature `race-window`, never in a release build): holds open the window
/// between `report_async` finding a QP and touching it, so that `tests/fatal_race.rs` can run
/// `ibv_destroy_qp` inside it under AddressSanitizer.
#[cfg(feature = "race-window")]
pub mod race_window {
    use std::sync::Mutex;

    /// Called by `report_async` after it found the QP, before it touches it.
    pub static PAUSE: Mutex<Option<fn()>> = Mutex::new(None);

    pub(super) fn pause() {
        let f = *PAUSE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = f {
            f();
        }
    }
}

/// An asynchronous event of the engine of `dev`, on the async fd of the context owning the
/// QP, once per QP: `IBV_EVENT_QP_ACCESS_ERR` for a QP ended by an access violation (a region
/// it used was invalidated, or its own access met vanished memory), `IBV_EVENT_QP_FATAL` for
/// one whose work request completed in error (reported as the completion is polled);
/// whichever comes first.
///
/// One thread may poll a CQ while another destroys a QP whose completions are in it, so the
/// QP is reached only while the `BY_QPN` lock is held: `ibv_destroy_qp` takes the QP out of
/// that map (under the same lock) before it frees it.
pub fn report_async(dev: &'static crate::device::Device, ev: verbs::AsyncEvent) {
    let (qp_num, event_type) = match ev {
        verbs::AsyncEvent::QpAccessError { qp_num, .. } => (qp_num, IBV_EVENT_QP_ACCESS_ERR),
        verbs::AsyncEvent::QpFatal { qp_num } => (qp_num, IBV_EVENT_QP_FATAL),
        verbs::AsyncEvent::RegionInvalidated { .. } => return,
    };
    let map = by_qpn();
    for (&(_, qpn), &p) in map.iter() {
        if qpn != qp_num {
            continue;
        }
        let qp = p as *mut ibv_qp;
        #[cfg(feature = "race-window")]
        race_window::pause();
        // SAFETY: in the map, so not yet freed; it stays allocated while `map` is held.
        let q = unsafe { &*qp.cast::<Qp>() };
        if std::ptr::eq(q.shared.dev, dev) && !q.fatal_reported.swap(true, Ordering::AcqRel) {
            q.shared.async_event(ibv_async_event {
                element: ibv_async_event_element { qp },
                event_type,
            });
        }
    }
}

fn live_cq<'a>(cq: *mut ibv_cq, shared: &Arc<Shared>) -> Result<&'a Cq, c_int> {
    // SAFETY: the C API forbids destroying a CQ while a QP is created on it.
    match unsafe { Cq::from_ibv(cq) } {
        Some(c) if Arc::ptr_eq(&c.shared, shared) => Ok(c),
        _ => Err(libc::EINVAL),
    }
}

/// `ibv_create_qp`: an RC, UC or UD QP. NULL with errno EINVAL (bad PD, NULL attributes,
/// foreign CQs or SRQ, capacities out of range), EOPNOTSUPP (raw packet and XRC QPs).
/// `qp_init_attr->cap` receives the capacities granted.
///
/// # Safety
/// `qp_init_attr` is NULL or readable and writable.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if qp_init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { qp_init_attr.read() };
        let qp_type = match a.qp_type {
            IBV_QPT_RC => verbs::QpType::Rc,
            IBV_QPT_UC => verbs::QpType::Uc,
            IBV_QPT_UD => verbs::QpType::Ud,
            IBV_QPT_RAW_PACKET | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV | IBV_QPT_DRIVER => {
                return Err(libc::EOPNOTSUPP);
            }
            _ => return Err(libc::EINVAL),
        };
        let send_cq = live_cq(a.send_cq, &p.shared)?;
        let recv_cq = live_cq(a.recv_cq, &p.shared)?;
        let srq = if a.srq.is_null() {
            None
        } else {
            // SAFETY: the C API forbids destroying the SRQ concurrently.
            match unsafe { Srq::from_ibv(a.srq) } {
                Some(s) if Arc::ptr_eq(&s.shared, &p.shared) => Some(s),
                _ => return Err(libc::EINVAL),
            }
        };
        let c = a.cap;
        let max = crate::limits::MAX_QP_WR as u32;
        let sge = crate::limits::MAX_SGE as u32;
        if c.max_send_wr > max
            || (srq.is_none() && c.max_recv_wr > max)
            || c.max_send_sge > sge
            || (srq.is_none() && c.max_recv_sge > sge)
            || c.max_inline_data > MAX_INLINE
        {
            return Err(libc::EINVAL);
        }
        let cap = QpCap {
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: if srq.is_some() {
                0
            } else {
                c.max_recv_wr.max(1)
            },
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: if srq.is_some() {
                0
            } else {
                c.max_recv_sge.max(1)
            },
            max_inline_data: c.max_inline_data.max(MIN_INLINE),
        };
        let init = verbs::QpInitAttr {
            send_cq: send_cq.vcq.clone(),
            recv_cq: recv_cq.vcq.clone(),
            srq: srq.map(|s| s.vsrq.clone()),
            cap,
            sq_sig_all: a.sq_sig_all != 0,
            qp_type,
        };
        let vqp = p.vpd.create_qp(&init).map_err(|e| e.errno())?;
        let granted = ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        let qpn = vqp.qp_num();
        let q = Box::into_raw(Box::new(Qp {
            qp: ibv_qp {
                context: p.pd.context,
                qp_context: a.qp_context,
                pd,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                handle: qpn,
                qp_num: qpn,
                state: QpState::Reset as c_int,
                qp_type: a.qp_type,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            ex: p.shared.qp_ex,
            wr_batch: crate::qp_ex::new_batch(),
            shared: p.shared.clone(),
            vqp,
            cap: granted,
            sq_sig_all: a.sq_sig_all,
            qp_type: a.qp_type,
            ah_attr: Mutex::new(None),
            fatal_reported: AtomicBool::new(false),
        }))
        .cast::<ibv_qp>();
        send_cq.users.fetch_add(1, Ordering::AcqRel);
        recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(s) = srq {
            s.users.fetch_add(1, Ordering::AcqRel);
        }
        p.hold();
        // SAFETY: `qp_init_attr` is writable per the contract.
        unsafe { (*qp_init_attr).cap = granted };
        by_qpn().insert((Arc::as_ptr(&p.shared) as usize, qpn), q as usize);
        registry::insert(q, Kind::Qp);
        Ok(q)
    })
}

/// `ibv_destroy_qp`: 0 or EINVAL (not a live QP). Outstanding work requests are flushed to
/// the CQs, which the QP no longer holds.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_errno(|| {
        if !registry::remove(qp, Kind::Qp) {
            return Err(libc::EINVAL);
        }
        // Out of the event map first: a concurrent `report_async` finishes with it before the
        // lock is ours, and none reaches it afterwards.
        {
            // SAFETY: claimed from the registry: a live Qp, freed only below.
            let q = unsafe { &*qp.cast::<Qp>() };
            by_qpn().remove(&(Arc::as_ptr(&q.shared) as usize, q.qp.qp_num));
        }
        // SAFETY: claimed from the registry and out of the event map: a live Qp (from
        // Box::into_raw) that nothing else reaches any more.
        let q = unsafe { Box::from_raw(qp.cast::<Qp>()) };
        // SAFETY: CQs, SRQ and PD cannot be destroyed while this QP counts against them.
        unsafe {
            (*q.qp.send_cq.cast::<Cq>())
                .users
                .fetch_sub(1, Ordering::AcqRel);
            (*q.qp.recv_cq.cast::<Cq>())
                .users
                .fetch_sub(1, Ordering::AcqRel);
            if !q.qp.srq.is_null() {
                (*q.qp.srq.cast::<Srq>())
                    .users
                    .fetch_sub(1, Ordering::AcqRel);
            }
            (*q.qp.pd.cast::<Pd>()).release();
        }
        drop(q);
        Ok(())
    })
}

/// `IBV_QP_RATE_LIMIT`: accepted and ignored (no rate limiting).
const IBV_QP_RATE_LIMIT: c_int = 1 << 25;

fn state_of(v: c_int) -> Result<QpState, c_int> {
    Ok(match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

/// The peer's address from an address vector: the IPv4-mapped (or IPv6) destination GID, or,
/// without a GRH, the address the destination LID names in `dev`'s /16 ([`Device::lid`]; a
/// LID of 0 is EINVAL, as on any RoCE port).
pub fn peer_of(dev: &Device, ah: &ibv_ah_attr) -> Result<IpAddr, c_int> {
    if ah.port_num != 0 && ah.port_num != 1 {
        return Err(libc::EINVAL);
    }
    if ah.is_global == 0 {
        return dev.addr_of_lid(ah.dlid).map(IpAddr::V4).ok_or(libc::EINVAL);
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    let raw = unsafe { ah.grh.dgid.raw };
    let v6 = Ipv6Addr::from(raw);
    if v6.is_unspecified() {
        return Err(libc::EINVAL);
    }
    Ok(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// `ibv_modify_qp`: 0 or errno (EINVAL: not a live QP, NULL attributes, a transition or
/// attribute the state machine of the QP's type refuses, an unusable address vector).
///
/// # Safety
/// `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids destroying the QP concurrently.
        let q = unsafe { Qp::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        let m = QpAttrMask((attr_mask & !IBV_QP_RATE_LIMIT) as u32);
        let (_, cur) = q.vqp.query();
        let mut v = QpAttr { av: None, ..cur };
        if m.contains(QpAttrMask::STATE) {
            v.qp_state = state_of(a.qp_state)?;
        }
        if m.contains(QpAttrMask::CUR_STATE) {
            v.cur_qp_state = state_of(a.cur_qp_state)?;
        }
        if m.contains(QpAttrMask::ACCESS_FLAGS) {
            v.qp_access_flags = Access(a.qp_access_flags);
        }
        if m.contains(QpAttrMask::PKEY_INDEX) {
            v.pkey_index = a.pkey_index;
        }
        if m.contains(QpAttrMask::PORT) {
            v.port_num = a.port_num;
        }
        if m.contains(QpAttrMask::PATH_MTU) {
            let want = Mtu::ALL
                .into_iter()
                .find(|x| *x as c_int == a.path_mtu)
                .ok_or(libc::EINVAL)?;
            // `verbs::Qp::modify` clamps it to the port's active MTU.
            v.path_mtu = want;
        }
        if m.contains(QpAttrMask::TIMEOUT) {
            v.timeout = a.timeout;
        }
        if m.contains(QpAttrMask::RETRY_CNT) {
            v.retry_cnt = a.retry_cnt;
        }
        if m.contains(QpAttrMask::RNR_RETRY) {
            v.rnr_retry = a.rnr_retry;
        }
        if m.contains(QpAttrMask::RQ_PSN) {
            v.rq_psn = a.rq_psn;
        }
        if m.contains(QpAttrMask::SQ_PSN) {
            v.sq_psn = a.sq_psn;
        }
        if m.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            v.max_rd_atomic = a.max_rd_atomic;
        }
        if m.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            v.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if m.contains(QpAttrMask::MIN_RNR_TIMER) {
            v.min_rnr_timer = a.min_rnr_timer;
        }
        if m.contains(QpAttrMask::DEST_QPN) {
            v.dest_qp_num = a.dest_qp_num;
        }
        if m.contains(QpAttrMask::QKEY) {
            v.qkey = a.qkey;
        }
        if m.contains(QpAttrMask::AV) {
            let peer = peer_of(q.shared.dev, &a.ah_attr)?;
            v.av = Some(q.vqp.av_for(peer));
        }
        q.vqp.modify(&v, m).map_err(|e| e.errno())?;
        if m.contains(QpAttrMask::AV) {
            *q.ah_attr.lock().unwrap_or_else(PoisonError::into_inner) = Some(a.ah_attr);
        }
        let (state, _) = q.vqp.query();
        // SAFETY: `state` is written only here, under the C API's rule that one thread
        // modifies a QP at a time.
        unsafe { (*qp).state = state as c_int };
        Ok(())
    })
}

/// `ibv_query_qp`: 0 or EINVAL (not a live QP, NULL output). Fills every field an RC QP has,
/// whatever the mask (the mask is a hint).
///
/// # Safety
/// `attr` and `init_attr` are NULL or writable.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids destroying the QP concurrently.
        let q = unsafe { Qp::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let (state, a) = q.vqp.query();
        let ah = q
            .ah_attr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or(empty_ah_attr());
        let out = ibv_qp_attr {
            qp_state: state as c_int,
            cur_qp_state: state as c_int,
            path_mtu: a.path_mtu as c_int,
            path_mig_state: 0, // IBV_MIG_MIGRATED: no alternate path
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags.0,
            cap: q.cap,
            ah_attr: ah,
            alt_ah_attr: empty_ah_attr(),
            pkey_index: a.pkey_index,
            alt_pkey_index: 0,
            en_sqd_async_notify: 0,
            sq_draining: 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        };
        let init = ibv_qp_init_attr {
            qp_context: q.qp.qp_context,
            send_cq: q.qp.send_cq,
            recv_cq: q.qp.recv_cq,
            srq: q.qp.srq,
            cap: q.cap,
            qp_type: q.qp_type,
            sq_sig_all: q.sq_sig_all,
        };
        // SAFETY: both non-NULL and writable per the contract.
        unsafe {
            attr.write(out);
            init_attr.write(init);
        }
        Ok(())
    })
}

/// An all-zero address vector.
pub fn empty_ah_attr() -> ibv_ah_attr {
    // SAFETY: `ibv_ah_attr` is plain C data for which all-zero bytes are valid.
    unsafe { core::mem::zeroed() }
}

/// `ibv_qp_to_qp_ex` (IBVERBS_1.6): the QP as a `struct ibv_qp_ex` (every QP of this library
/// is one: `crate::wr_ex`); NULL with errno EINVAL for a foreign QP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ffi_ptr(|| {
        if !registry::contains(qp, Kind::Qp) {
            return Err(libc::EINVAL);
        }
        Ok(qp.cast::<ibv_qp_ex>())
    })
}

/// `ibv_attach_mcast`: multicast is not supported (EOPNOTSUPP; EINVAL for a foreign QP).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    ffi_errno(|| {
        if !registry::contains(qp, Kind::Qp) {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}

/// `ibv_detach_mcast`: as [`ibv_attach_mcast`].
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    ffi_errno(|| {
        if !registry::contains(qp, Kind::Qp) {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    })
}

/// `ibv_set_ece` (IBVERBS_1.10): softrdma has no Enhanced Connection Establishment options, so
/// EOPNOTSUPP (also in errno, as rdma-core sets it); EINVAL (also in errno) for a foreign QP
/// or a NULL `ece`.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted, `ece` is never read.
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    ece_unsupported(qp, ece)
}

/// `ibv_query_ece` (IBVERBS_1.10): as [`ibv_set_ece`]; `ece` is never written.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    ece_unsupported(qp, ece)
}

fn ece_unsupported(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    let e = ffi_errno(|| {
        if !registry::contains(qp, Kind::Qp) || ece.is_null() {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    });
    crate::errno::set_errno(e);
    e
}

/// `ibv_query_qp_data_in_order` (IBVERBS_1.14): 0, for every QP, operation and `flags`.
///
/// A 1 would promise that the data of one work request is written in order, so that a reader
/// may poll its last byte instead of the completion. softrdma's responder does handle a QP's
/// packets in PSN order, so the packets of a message land one after the other; but the bytes
/// of one packet are placed by `process_vm_writev` (the kernel's copy, for raw registered
/// memory) or by `memcpy`, and neither stores in ascending address order (both copy the tail
/// of a block before its middle, or use `rep movsb`, whose stores are unordered). A reader
/// polling the last byte could see it before the bytes ahead of it: no guarantee, so 0, which
/// is also what rdma-core answers for a provider without the verb. With rdma-core 45's
/// `IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS` flag, 0 is the empty capability set. A foreign QP
/// gets 0 too (the function has no error return).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted and never dereferenced.
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    0
}
