//! Completion queues: `ibv_create_cq`/`ibv_destroy_cq` and the data-path `poll_cq` and
//! `req_notify_cq`, over `softrdma::verbs::Cq`.
//!
//! `poll_cq` translates the engine's completions to `struct ibv_wc`: `imm_data` is handed out
//! in network byte order (verbs.h declares it `__be32`: the bytes the sender put in its
//! `ibv_send_wr`), `wc_flags` carries `IBV_WC_WITH_IMM` / `IBV_WC_WITH_INV`, and
//! `invalidated_rkey` shares the `imm_data` slot as in verbs.h's union. A CQ that overflowed
//! reports `IBV_EVENT_CQ_ERR` once on the context's async fd.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use softrdma::verbs::{self, EMPTY_WC, NetworkHdr, WorkCompletion};

use crate::abi::*;
use crate::channel::CompChannel;
use crate::context::{Context, Shared};
use crate::errno::{ffi_errno, ffi_ptr, guard};
use crate::limits;
use crate::registry::{self, Kind};

/// `IBV_WC_GRH`: the receive buffer starts with the 40-byte GRH area (UD).
pub const IBV_WC_GRH: u32 = 1;
/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;
/// `IBV_WC_WITH_INV`.
pub const IBV_WC_WITH_INV: u32 = 1 << 3;
/// `IBV_EVENT_CQ_ERR`.
pub const IBV_EVENT_CQ_ERR: c_int = 0;
/// `IBV_EVENT_QP_FATAL`.
pub const IBV_EVENT_QP_FATAL: c_int = 1;

/// A completion queue: the C struct first, then ours.
#[repr(C)]
pub struct Cq {
    /// What C sees: an `ibv_cq` (its first fields), and for a CQ made by `ibv_create_cq_ex`
    /// the extended poll interface.
    pub cq: ibv_cq_ex,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's CQ.
    pub vcq: verbs::Cq,
    /// The channel it reports to (NULL: none).
    pub channel: *mut ibv_comp_channel,
    /// QPs using it (a CQ in use cannot be destroyed: EBUSY).
    pub users: AtomicU32,
    /// The overrun was reported as `IBV_EVENT_CQ_ERR`.
    overrun_reported: AtomicBool,
    /// The completion an extended poll (`start_poll`, `next_poll`) holds for `read_*`; the C
    /// API lets one thread at a time poll a CQ this way.
    current: core::cell::UnsafeCell<ibv_wc>,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq")
            .field("id", &self.vcq.id())
            .field("cqe", &self.cq.cqe)
            .finish()
    }
}

impl Cq {
    /// The CQ behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_cq(cq)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: registered CQ pointers point to a live Cq (C struct first).
        registry::contains(cq, Kind::Cq).then(|| unsafe { &*cq.cast::<Cq>() })
    }

    fn report_overrun(&self) {
        if self.vcq.overrun() && !self.overrun_reported.swap(true, Ordering::AcqRel) {
            self.shared.async_event(ibv_async_event {
                element: ibv_async_event_element {
                    cq: (&self.cq as *const ibv_cq_ex).cast::<ibv_cq>().cast_mut(),
                },
                event_type: IBV_EVENT_CQ_ERR,
            });
        }
    }
}

/// `ibv_create_cq`: NULL with errno EINVAL (bad context or channel, `cqe` not in
/// 1..=max_cqe, a completion vector other than 0), or the errno of opening the engine.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded.
    ffi_ptr(|| unsafe { create(context, cqe, cq_context, channel, comp_vector, None) })
}

/// Create a CQ; `ex` fills the extended poll interface (`ibv_create_cq_ex`).
///
/// # Safety
/// As [`ibv_create_cq`].
unsafe fn create(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    ex: Option<u64>,
) -> Result<*mut ibv_cq, c_int> {
    // SAFETY: the C API forbids closing the context concurrently.
    let ctx = unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
    // One completion vector (`num_comp_vectors` is 1).
    if comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: the C API forbids destroying the channel concurrently.
        let ch = unsafe { CompChannel::from_ibv(channel) }.ok_or(libc::EINVAL)?;
        if !Arc::ptr_eq(&ch.shared, &ctx.shared) {
            return Err(libc::EINVAL);
        }
        Some(ch)
    };
    if !(1..=limits::MAX_CQE).contains(&cqe) {
        return Err(libc::EINVAL);
    }
    let vcq = ctx
        .shared
        .verbs()?
        .create_cq(cqe as u32, ch.map(|c| &c.vch))
        .map_err(|e| e.errno())?;
    let id = vcq.id();
    let p = Box::into_raw(Box::new(Cq {
        cq: ibv_cq_ex {
            context,
            channel,
            cq_context,
            handle: id as u32,
            cqe,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: ex.and(Some(start_poll)),
            next_poll: ex.and(Some(next_poll)),
            end_poll: ex.and(Some(end_poll)),
            read_opcode: ex.and(Some(read_opcode)),
            read_vendor_err: ex.and(Some(read_vendor_err)),
            read_byte_len: ex.and(Some(read_byte_len)),
            read_imm_data: ex.and(Some(read_imm_data)),
            read_qp_num: ex.and(Some(read_qp_num)),
            read_src_qp: ex.and(Some(read_src_qp)),
            read_wc_flags: ex.and(Some(read_wc_flags)),
            read_slid: ex.and(Some(read_slid)),
            read_sl: ex.and(Some(read_sl)),
            read_dlid_path_bits: ex.and(Some(read_dlid_path_bits)),
            read_completion_ts: None,
            read_cvlan: None,
            read_flow_tag: None,
            read_tm_info: None,
            read_completion_wallclock_ns: None,
        },
        shared: ctx.shared.clone(),
        vcq,
        channel,
        users: AtomicU32::new(0),
        overrun_reported: AtomicBool::new(false),
        current: core::cell::UnsafeCell::new(ibv_wc::default()),
    }))
    .cast::<ibv_cq>();
    if let Some(ch) = ch {
        ch.attach(id, p);
    }
    registry::insert(p, Kind::Cq);
    Ok(p)
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex`): a CQ polled with `ibv_start_poll`,
/// `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` calls of
/// `IBV_WC_STANDARD_FLAGS` (byte length, immediate data or invalidated key, QP number,
/// source QP, SLID, SL, DLID path bits); it is an ordinary CQ too (`ibv_cq_ex_to_cq`).
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` is accepted (a hint). NULL with errno EINVAL (as
/// `ibv_create_cq`; NULL `attr`; unknown `comp_mask` bits) or EOPNOTSUPP: completion
/// timestamps (softrdma has no clock of the wire's to report; a host clock read at poll
/// time would claim what it does not know), CVLAN, flow tags, tag matching,
/// `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`. A `parent_domain` must be a PD or parent domain of the
/// context (EINVAL otherwise).
///
/// # Safety
/// `attr` is NULL or points to a readable `ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ffi_ptr(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        const MASK_FLAGS: u32 = 1 << 0;
        const MASK_PD: u32 = 1 << 1;
        const SINGLE_THREADED: u32 = 1 << 0;
        const IGNORE_OVERRUN: u32 = 1 << 1;
        if a.comp_mask & !(MASK_FLAGS | MASK_PD) != 0 {
            return Err(libc::EINVAL);
        }
        let flags = if a.comp_mask & MASK_FLAGS != 0 {
            a.flags
        } else {
            0
        };
        if flags & !(SINGLE_THREADED | IGNORE_OVERRUN) != 0 {
            return Err(libc::EINVAL);
        }
        if flags & IGNORE_OVERRUN != 0 || a.wc_flags & !cq_wc_flags::STANDARD != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & MASK_PD != 0 {
            // A parent domain (or PD) of the context: its allocators are never called (the
            // ring lives in the engine).
            // SAFETY: the registry check; the C API keeps it alive meanwhile.
            let ok = unsafe { crate::mr::Pd::from_ibv(a.parent_domain) }
                .zip(unsafe { Context::from_ibv(context) })
                .is_some_and(|(p, c)| Arc::ptr_eq(&p.shared, &c.shared));
            if !ok {
                return Err(libc::EINVAL);
            }
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let vector = c_int::try_from(a.comp_vector).map_err(|_| libc::EINVAL)?;
        // SAFETY: forwarded.
        let p = unsafe {
            create(
                context,
                cqe,
                a.cq_context,
                a.channel,
                vector,
                Some(a.wc_flags),
            )
        }?;
        Ok(p.cast::<ibv_cq_ex>())
    })
}

/// The CQ of an extended poll call (`start_poll` and the rest are only ever installed on
/// CQs of ours).
///
/// # Safety
/// `cq` is a live CQ of this library (the C API's contract for these calls).
unsafe fn ex_cq<'a>(cq: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: the contract above; the Cq starts with its ibv_cq_ex.
    unsafe { &*cq.cast::<Cq>() }
}

/// Take the next completion into `current`: 0, ENOENT when there is none.
///
/// # Safety
/// As [`ex_cq`]; one thread polls a CQ at a time.
unsafe fn poll_one(cq: *mut ibv_cq_ex) -> c_int {
    let mut wc = ibv_wc::default();
    // SAFETY: our CQ; room for one completion.
    match unsafe { poll_cq(cq.cast::<ibv_cq>(), 1, &mut wc) } {
        1 => {
            // SAFETY: as above; `current` is this poller's (one at a time, per the API).
            unsafe {
                let c = ex_cq(cq);
                *c.current.get() = wc;
                (*cq).status = wc.status;
                (*cq).wr_id = wc.wr_id;
            }
            0
        }
        0 => libc::ENOENT,
        _ => libc::EINVAL,
    }
}

/// `ibv_start_poll`: the first completion (0), ENOENT when none is waiting, EINVAL for
/// `attr->comp_mask` bits.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(
        || crate::errno::PANIC_ERRNO,
        || {
            // SAFETY: NULL or readable per the C contract.
            if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
                return libc::EINVAL;
            }
            // SAFETY: the C contract of the extended poll calls.
            unsafe { poll_one(cq) }
        },
    )
}

/// `ibv_next_poll`: the next completion (0) or ENOENT.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the C contract of the extended poll calls.
    guard(|| crate::errno::PANIC_ERRNO, || unsafe { poll_one(cq) })
}

/// `ibv_end_poll`: nothing to release (completions leave the ring as they are polled).
unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

macro_rules! readers {
    ($($(#[$doc:meta])* $name:ident -> $t:ty = |$w:ident| $e:expr;)*) => {
        $(
            $(#[$doc])*
            unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
                // SAFETY: the C contract: called between a successful start/next_poll and
                // end_poll by the thread polling, so `current` holds its completion.
                let $w = unsafe { *ex_cq(cq).current.get() };
                $e
            }
        )*
    };
}

readers! {
    /// `ibv_wc_read_opcode`.
    read_opcode -> c_int = |w| w.opcode;
    /// `ibv_wc_read_vendor_err`.
    read_vendor_err -> u32 = |w| w.vendor_err;
    /// `ibv_wc_read_byte_len`.
    read_byte_len -> u32 = |w| w.byte_len;
    /// `ibv_wc_read_imm_data` (and `ibv_wc_read_invalidated_rkey`): network byte order, as
    /// `ibv_wc.imm_data`.
    read_imm_data -> u32 = |w| w.imm_data;
    /// `ibv_wc_read_qp_num`.
    read_qp_num -> u32 = |w| w.qp_num;
    /// `ibv_wc_read_src_qp`.
    read_src_qp -> u32 = |w| w.src_qp;
    /// `ibv_wc_read_wc_flags`.
    read_wc_flags -> c_uint = |w| w.wc_flags;
    /// `ibv_wc_read_slid`.
    read_slid -> u32 = |w| u32::from(w.slid);
    /// `ibv_wc_read_sl`.
    read_sl -> u8 = |w| w.sl;
    /// `ibv_wc_read_dlid_path_bits`.
    read_dlid_path_bits -> u8 = |w| w.dlid_path_bits;
}

/// `ibv_resize_cq`: the CQ holds `cqe` entries from now on (`cq->cqe` says so). 0 or EINVAL:
/// not a live CQ, `cqe` out of 1..=max_cqe, or fewer entries than completions waiting.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted; the C API forbids polling or
/// destroying the CQ during the call.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_errno(|| {
        if !registry::contains(cq, Kind::Cq) || !(1..=limits::MAX_CQE).contains(&cqe) {
            return Err(libc::EINVAL);
        }
        // SAFETY: registry-checked: a live Cq.
        let c = unsafe { &*cq.cast::<Cq>() };
        c.vcq.resize(cqe as u32).map_err(|_| libc::EINVAL)?;
        // SAFETY: the C part of a live CQ, which nothing else touches during the call (the
        // C contract above); written through the pointer, no reference held.
        unsafe { (*cq).cqe = cqe };
        Ok(())
    })
}

/// `ibv_destroy_cq`: 0, EINVAL (not a live CQ), EBUSY (a QP still uses it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_errno(|| {
        if !registry::remove(cq, Kind::Cq) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Cq only this caller holds.
        let c = unsafe { &*cq.cast::<Cq>() };
        if c.users.load(Ordering::Acquire) > 0 {
            registry::insert(cq, Kind::Cq);
            return Err(libc::EBUSY);
        }
        if !c.channel.is_null() {
            // SAFETY: a channel with CQs cannot be destroyed, so it is live.
            unsafe { &*c.channel.cast::<CompChannel>() }.detach(c.vcq.id());
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        Ok(())
    })
}

/// One engine completion as `struct ibv_wc`.
pub fn to_ibv_wc(w: &WorkCompletion) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: w.opcode as c_int,
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        ..ibv_wc::default()
    };
    if let Some(imm) = w.imm_data {
        // The engine holds the value as read from the wire (big-endian); C wants the wire
        // bytes in memory.
        wc.imm_data = imm.to_be();
        wc.wc_flags |= IBV_WC_WITH_IMM;
    } else if let Some(rkey) = w.invalidated_rkey {
        wc.imm_data = rkey;
        wc.wc_flags |= IBV_WC_WITH_INV;
    }
    if let Some(net) = w.grh {
        wc.wc_flags |= IBV_WC_GRH;
        wc.sl = roce_packet_type(net);
    }
    wc
}

/// `sl` of a UD receive completion: the RoCE packet type, as ConnectX adapters report it
/// there (bit 3: the frame had a UDP header, i.e. RoCEv2; bits 2..0: 1 = IPv6, 2 = IPv4).
/// RoCE has no service level on the wire, and clients read this to find where the GRH area
/// holds the destination address: UCX 1.13's UD transport drops every datagram whose GRH it
/// cannot match against its own GIDs otherwise.
pub fn roce_packet_type(net: NetworkHdr) -> u8 {
    const UDP: u8 = 0x8;
    match net {
        NetworkHdr::Ipv6 => UDP | 0x1,
        NetworkHdr::Ipv4 => UDP | 0x2,
    }
}

/// Poll `c` for up to `want` completions into `wc`, through a staging array of `N`. The first
/// poll is a spinning one (`verbs::Cq::poll_spinning`): a C program polls in a loop, and an
/// empty `ibv_poll_cq` now and then gives the CPU away.
///
/// # Safety
/// `wc` has room for `want` entries.
unsafe fn poll_into<const N: usize>(c: &Cq, wc: *mut ibv_wc, want: usize) -> usize {
    let mut buf = [EMPTY_WC; N];
    let mut done = 0usize;
    while done < want {
        let chunk = &mut buf[..(want - done).min(N)];
        let k = if done == 0 {
            c.vcq.poll_spinning(chunk)
        } else {
            c.vcq.poll(chunk)
        };
        for w in &buf[..k] {
            // SAFETY: `done < want` and `wc` has room for `want` entries (the caller's).
            // (A completion in error reports IBV_EVENT_QP_FATAL from `verbs::Cq::poll`.)
            unsafe { wc.add(done).write(to_ibv_wc(w)) };
            done += 1;
        }
        if k < N {
            break;
        }
    }
    done
}

/// `ops.poll_cq`: up to `num` completions into `wc`; their number, or -1 for a NULL CQ or
/// array or a negative count.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    guard(
        || -1,
        || {
            if cq.is_null() || num < 0 || (wc.is_null() && num > 0) {
                return -1;
            }
            // SAFETY: the data path trusts a non-NULL CQ to be one the application created
            // and has not destroyed (the C API's contract).
            let c = unsafe { &*cq.cast::<Cq>() };
            let want = num as usize;
            // The staging array is filled before every poll, empty ones included: sized to
            // the request (a latency test polls for one).
            // SAFETY (both): `wc` has room for `num` entries per the C contract.
            let done = if want <= 2 {
                unsafe { poll_into::<2>(c, wc, want) }
            } else {
                unsafe { poll_into::<32>(c, wc, want) }
            };
            c.report_overrun();
            done as c_int
        },
    )
}

/// `ops.req_notify_cq`: arm the CQ; 0, or EINVAL for NULL. With `solicited_only` the CQ fires
/// on the next receive whose message carried the solicited-event bit, or completion in error.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(
        || crate::errno::PANIC_ERRNO,
        || {
            if cq.is_null() {
                return libc::EINVAL;
            }
            // SAFETY: as in `poll_cq`.
            let c = unsafe { &*cq.cast::<Cq>() };
            c.vcq.req_notify(solicited_only != 0);
            0
        },
    )
}
