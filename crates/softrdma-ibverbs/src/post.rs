//! The posting verbs (`ctx->ops.post_send`, `post_recv`, `post_srq_recv`): each `ibv_*_wr`
//! of the list is translated and posted to the engine in order; the first one refused stops
//! the walk, is stored in `*bad_wr` and its errno returned (EINVAL: malformed request or a
//! QP state that does not accept it, e.g. RESET; ENOMEM: queue full), as libibverbs
//! specifies. Requests before it stay posted.
//!
//! Keys in SGEs are checked when the request executes, as rxe does: a bad lkey completes the
//! request with `IBV_WC_LOC_PROT_ERR` (and moves the QP to the error state); the post itself
//! succeeds. `IBV_SEND_INLINE` copies the payload at post time (the SGEs' keys are ignored).
//! `imm_data` is taken in network byte order (verbs.h's `__be32`). On a UD QP, `wr.ud` names
//! the destination (a live address handle of the same context, else EINVAL); the payload is
//! at most the port's active MTU (else EINVAL).

use core::ffi::c_int;

use softrdma::verbs::Access;
use softrdma::verbs::MAX_SGE;
use softrdma::verbs::{PostBatch, RecvWr, SendFlags, SendWr, Sge, WrOpcode};

use crate::abi::*;
use crate::ah::Ah;
use crate::errno::{PANIC_ERRNO, guard};
use crate::mr::Mr;
use crate::mw::Mw;
use crate::qp::Qp;
use crate::registry::{self, Kind};
use crate::srq::Srq;

/// `enum ibv_wr_opcode` values.
pub mod op {
    pub const RDMA_WRITE: i32 = 0;
    pub const RDMA_WRITE_WITH_IMM: i32 = 1;
    pub const SEND: i32 = 2;
    pub const SEND_WITH_IMM: i32 = 3;
    pub const RDMA_READ: i32 = 4;
    pub const ATOMIC_CMP_AND_SWP: i32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: i32 = 6;
    pub const LOCAL_INV: i32 = 7;
    pub const BIND_MW: i32 = 8;
    pub const SEND_WITH_INV: i32 = 9;
}

/// Copy a C SGE list (at most [`MAX_SGE`] entries) into `out`; the entries used.
fn sges(list: *mut ibv_sge, n: c_int, out: &mut [Sge; MAX_SGE]) -> Result<&[Sge], c_int> {
    if n < 0 || n as usize > MAX_SGE || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    for (i, slot) in out.iter_mut().take(n as usize).enumerate() {
        // SAFETY: the C contract: `sg_list` has `num_sge` readable entries.
        let s = unsafe { list.add(i).read() };
        *slot = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(&out[..n as usize])
}

/// The inline payload named by `sg` (host addresses): the caller's bytes themselves when one
/// entry names them all (the engine copies them before the post returns), else gathered into
/// `buf`. No allocation for the common case, a single buffer.
fn gather<'a>(sg: &[Sge], max: u32, buf: &'a mut Vec<u8>) -> Result<&'a [u8], c_int> {
    let total: u64 = sg.iter().map(|s| u64::from(s.length)).sum();
    if total > u64::from(max) {
        return Err(libc::EINVAL);
    }
    let bytes = |s: &Sge| -> Result<&'a [u8], c_int> {
        if s.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: with IBV_SEND_INLINE the C contract is that each SGE names `length`
        // readable bytes at the host address `addr` (no key is involved), unchanged until
        // the post returns.
        Ok(unsafe { core::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize) })
    };
    let mut named = sg.iter().filter(|s| s.length > 0);
    match (named.next(), named.next()) {
        (None, _) => return Ok(&[]),
        (Some(s), None) => return bytes(s),
        _ => {}
    }
    buf.clear();
    for s in sg.iter().filter(|s| s.length > 0) {
        buf.extend_from_slice(bytes(s)?);
    }
    Ok(buf)
}

/// The engine's opcode for one C work request.
fn opcode(w: &ibv_send_wr) -> Result<WrOpcode, c_int> {
    // SAFETY: every variant of the unions is plain integers and pointers; which one is
    // meaningful follows from the opcode, as in C.
    let (rdma, atomic, bind) = unsafe { (w.wr.rdma, w.wr.atomic, w.ext.bind_mw) };
    Ok(match w.opcode {
        op::RDMA_WRITE => WrOpcode::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        op::RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(w.imm_data),
        },
        op::SEND => WrOpcode::Send,
        op::SEND_WITH_IMM => WrOpcode::SendWithImm {
            imm: u32::from_be(w.imm_data),
        },
        op::SEND_WITH_INV => WrOpcode::SendWithInv { rkey: w.imm_data },
        op::RDMA_READ => WrOpcode::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        op::ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        op::ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        op::LOCAL_INV => WrOpcode::LocalInv { rkey: w.imm_data },
        op::BIND_MW => {
            // SAFETY: registry-checked pointers (the bind names objects of this process).
            let mw = unsafe { Mw::from_ibv(bind.mw) }.ok_or(libc::EINVAL)?;
            // SAFETY: as above.
            let mr = unsafe { Mr::from_ibv(bind.bind_info.mr) }.ok_or(libc::EINVAL)?;
            WrOpcode::BindMw {
                mw_rkey: mw.vmw.rkey(),
                new_rkey: bind.rkey,
                mr_lkey: mr.mr.lkey,
                addr: bind.bind_info.addr,
                length: bind.bind_info.length,
                access: Access(bind.bind_info.mw_access_flags),
            }
        }
        _ => return Err(libc::EINVAL),
    })
}

fn post_one(
    q: &Qp,
    batch: &mut PostBatch<'_>,
    w: &ibv_send_wr,
    inline: &mut Vec<u8>,
) -> Result<(), c_int> {
    let mut arr = [Sge::default(); MAX_SGE];
    let sg = sges(w.sg_list, w.num_sge, &mut arr)?;
    let opcode = opcode(w)?;
    let flags = SendFlags(w.send_flags);
    let mut wr = SendWr {
        wr_id: w.wr_id,
        opcode,
        send_flags: flags,
        sg_list: sg,
        inline_data: None,
        ud: None,
    };
    if q.qp_type == crate::qp::IBV_QPT_UD {
        // SAFETY: on a UD QP `wr.ud` is the meaningful variant (plain data).
        let ud = unsafe { w.wr.ud };
        // SAFETY: registry-checked; the C API forbids destroying an AH a posted WR names.
        let ah = unsafe { Ah::from_ibv(ud.ah) }.ok_or(libc::EINVAL)?;
        if !std::sync::Arc::ptr_eq(&ah.shared, &q.shared) {
            return Err(libc::EINVAL);
        }
        wr.ud = Some(ah.vah.dest(ud.remote_qpn, ud.remote_qkey));
    }
    if flags.contains(SendFlags::INLINE) && opcode.carries_payload() {
        wr.inline_data = Some(gather(sg, q.cap.max_inline_data, inline)?);
        wr.sg_list = &[];
    }
    if let WrOpcode::BindMw { .. } = opcode {
        // SAFETY: for IBV_WR_BIND_MW `ext.bind_mw` is the meaningful variant (plain data).
        let bind = unsafe { w.ext.bind_mw };
        return post_bind(batch, w.wr_id, flags, opcode, bind.mw, bind.bind_info.mr);
    }
    batch.post(&wr).map_err(|e| e.errno())
}

/// Post the bind `opcode` (a `BindMw`) of window `mw` to region `mr` in `batch`, recorded in
/// the window (`verbs::PostBatch::bind_mw`): EINVAL for another opcode or a pointer that names
/// no live window or region.
pub(crate) fn post_bind(
    batch: &mut PostBatch<'_>,
    wr_id: u64,
    flags: SendFlags,
    opcode: WrOpcode,
    mw: *mut ibv_mw,
    mr: *mut ibv_mr,
) -> Result<(), c_int> {
    let WrOpcode::BindMw {
        new_rkey,
        addr,
        length,
        access,
        ..
    } = opcode
    else {
        return Err(libc::EINVAL);
    };
    // SAFETY: registry-checked pointers; the C API forbids destroying them concurrently.
    let (mw, mr) = unsafe { (Mw::from_ibv(mw), Mr::from_ibv(mr)) };
    let (mw, mr) = (mw.ok_or(libc::EINVAL)?, mr.ok_or(libc::EINVAL)?);
    let bind = softrdma::verbs::MwBind {
        mw: &mw.vmw,
        new_rkey,
        mr: Some(mr.vmr.as_ref().ok_or(libc::EINVAL)?),
        addr,
        length,
        access,
    };
    batch.bind_mw(wr_id, flags, &bind).map_err(|e| e.errno())
}

fn store_bad<W>(bad: *mut *mut W, w: *mut W) {
    if !bad.is_null() {
        // SAFETY: non-NULL; the C API requires `bad_wr` to be writable.
        unsafe { *bad = w };
    }
}

/// `ops.post_send`: 0, or the errno of the first refused request (stored in `*bad_wr`).
/// EINVAL for a NULL or foreign QP.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard(
        || {
            store_bad(bad_wr, wr);
            PANIC_ERRNO
        },
        || {
            // The registry check costs one hash lookup; it keeps a stray pointer from
            // crashing the library.
            // SAFETY: registry-checked.
            let Some(q) = (unsafe { Qp::from_ibv(qp) }) else {
                store_bad(bad_wr, wr);
                return libc::EINVAL;
            };
            let mut inline = Vec::new();
            // The whole list is posted under one lock of the QP and transmitted together
            // when `batch` goes (also after a refused request: the earlier ones stay posted).
            let mut batch = q.vqp.post_batch();
            let mut cur = wr;
            while !cur.is_null() {
                // SAFETY: the C contract: a NULL-terminated list of readable requests.
                let w = unsafe { &*cur };
                if let Err(e) = post_one(q, &mut batch, w, &mut inline) {
                    store_bad(bad_wr, cur);
                    return e;
                }
                cur = w.next;
            }
            0
        },
    )
}

fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(&RecvWr<'_>) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the C contract: a NULL-terminated list of readable requests.
        let w = unsafe { &*cur };
        let mut arr = [Sge::default(); MAX_SGE];
        let r = sges(w.sg_list, w.num_sge, &mut arr).and_then(|sg| {
            post(&RecvWr {
                wr_id: w.wr_id,
                sg_list: sg,
            })
        });
        if let Err(e) = r {
            store_bad(bad_wr, cur);
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ops.post_recv`: as [`post_send`]; EINVAL also for a QP attached to an SRQ.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(
        || {
            store_bad(bad_wr, wr);
            PANIC_ERRNO
        },
        || {
            // SAFETY: registry-checked.
            let Some(q) = (unsafe { Qp::from_ibv(qp) }) else {
                store_bad(bad_wr, wr);
                return libc::EINVAL;
            };
            // The whole list is posted under one lock of the QP.
            let mut batch = match q.vqp.post_recv_batch() {
                Ok(b) => b,
                Err(e) => {
                    store_bad(bad_wr, wr);
                    return e.errno();
                }
            };
            post_recv_list(wr, bad_wr, |r| batch.post(r).map_err(|e| e.errno()))
        },
    )
}

/// `ops.post_srq_recv`: as [`post_recv`].
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(
        || {
            store_bad(bad_wr, wr);
            PANIC_ERRNO
        },
        || {
            if !registry::contains(srq, Kind::Srq) {
                store_bad(bad_wr, wr);
                return libc::EINVAL;
            }
            // SAFETY: registry-checked.
            let s = unsafe { &*srq.cast::<Srq>() };
            post_recv_list(wr, bad_wr, |r| s.vsrq.post_recv(r).map_err(|e| e.errno()))
        },
    )
}
