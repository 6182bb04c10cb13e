//! The extended post-send API: `struct ibv_qp_ex` and the `ibv_wr_*` calls (`ibv_wr_start`,
//! one builder per operation, the `ibv_wr_set_*` setters, `ibv_wr_complete`/`ibv_wr_abort`).
//!
//! Every QP of this library carries the operations right after its `ibv_qp` (the layout of
//! `struct ibv_qp_ex`), so `ibv_qp_to_qp_ex` is a cast: the table [`qp_ex_ops`], which the
//! QP's context hands it at creation, and the requests being built (`crate::qp_ex`). A builder starts a work request with
//! the QP's current `wr_id` and `wr_flags`; the setters fill the last one started (SGEs are
//! copied, inline data too: the caller's buffers are free again when the call returns);
//! `ibv_wr_complete` posts them all in order, under one lock of the QP and one engine drive,
//! as `ibv_post_send` posts a list. A builder misused (a setter with no request started,
//! too many SGEs, inline data past `max_inline_data`, an operation the device lacks: TSO,
//! XRC, ATOMIC_WRITE) poisons the batch: `ibv_wr_complete` then posts nothing and returns
//! the error (EINVAL, or EOPNOTSUPP), as rdma-core's providers do. A request the engine
//! refuses at posting (a full send queue: ENOMEM) stops the batch there; the requests
//! before it stay posted, as with `ibv_post_send`'s `bad_wr`.

use core::ffi::{c_int, c_void};

use softrdma::verbs::Access;
use softrdma::verbs::{SendFlags, SendWr, Sge, WrOpcode};

use crate::abi::*;
use crate::ah::Ah;
use crate::errno::guard;
use crate::mw::Mw;
use crate::qp::Qp;
use crate::qp_ex::{Building, QpExOps, WrBatch};
use softrdma::verbs::MAX_SGE;

/// The operations of every QP of this library, in the order of `struct ibv_qp_ex` (a context
/// hands them to each QP created on it).
pub fn qp_ex_ops() -> QpExOps {
    let slot = |f: *const ()| -> CompatSlot {
        // SAFETY: each function is stored in the slot verbs.h declares with exactly its
        // signature, and C calls it through that declaration only.
        Some(unsafe { core::mem::transmute::<*const (), unsafe extern "C" fn()>(f) })
    };
    QpExOps {
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        // In the order of `struct ibv_qp_ex`.
        ops: [
            slot(wr_atomic_cmp_swp as *const ()),
            slot(wr_atomic_fetch_add as *const ()),
            slot(wr_bind_mw as *const ()),
            slot(wr_local_inv as *const ()),
            slot(wr_rdma_read as *const ()),
            slot(wr_rdma_write as *const ()),
            slot(wr_rdma_write_imm as *const ()),
            slot(wr_send as *const ()),
            slot(wr_send_imm as *const ()),
            slot(wr_send_inv as *const ()),
            slot(wr_send_tso as *const ()),
            slot(wr_set_ud_addr as *const ()),
            slot(wr_set_xrc_srqn as *const ()),
            slot(wr_set_inline_data as *const ()),
            slot(wr_set_inline_data_list as *const ()),
            slot(wr_set_sge as *const ()),
            slot(wr_set_sge_list as *const ()),
            slot(wr_start as *const ()),
            slot(wr_complete as *const ()),
            slot(wr_abort as *const ()),
            slot(wr_atomic_write as *const ()),
        ],
    }
}

/// The operations `ibv_create_qp_ex` can be asked for (`IBV_QP_EX_WITH_*`): all but TSO and
/// ATOMIC_WRITE.
pub const SUPPORTED_SEND_OPS: u64 = (1 << 10) - 1;

/// The QP of an `ibv_qp_ex` (the C API calls these only on a QP it got from this library).
///
/// # Safety
/// `qp` is a live QP of this library.
unsafe fn qp_of<'a>(qp: *mut ibv_qp_ex) -> &'a Qp {
    // SAFETY: the contract above; a Qp starts with its ibv_qp, which starts the ibv_qp_ex.
    unsafe { &*qp.cast::<Qp>() }
}

fn batch(q: &Qp) -> std::sync::MutexGuard<'_, WrBatch> {
    q.wr_batch.lock().unwrap_or_else(|e| e.into_inner())
}

/// Start a request of `opcode` with the QP's `wr_id` and `wr_flags`.
///
/// # Safety
/// As [`qp_of`].
unsafe fn start(qp: *mut ibv_qp_ex, opcode: WrOpcode) {
    guard(
        || (),
        || {
            // SAFETY: forwarded.
            let q = unsafe { qp_of(qp) };
            let (wr_id, flags) = (q.ex.wr_id, q.ex.wr_flags);
            batch(q).wrs.push(Building {
                wr_id,
                opcode,
                flags: SendFlags(flags),
                sges: Vec::new(),
                inline: None,
                ud: None,
                bind: None,
            });
        },
    )
}

/// Apply `f` to the request being built, or poison the batch with EINVAL if none is.
///
/// # Safety
/// As [`qp_of`].
unsafe fn with_last(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Building) -> Result<(), c_int>) {
    guard(
        || (),
        || {
            // SAFETY: forwarded.
            let q = unsafe { qp_of(qp) };
            let mut b = batch(q);
            let r = match b.wrs.last_mut() {
                Some(w) => f(q, w),
                None => Err(libc::EINVAL),
            };
            if let Err(e) = r {
                b.err.get_or_insert(e);
            }
        },
    )
}

/// Poison the batch with `e` (an operation this device does not offer).
///
/// # Safety
/// As [`qp_of`].
unsafe fn refuse(qp: *mut ibv_qp_ex, e: c_int) {
    guard(
        || (),
        || {
            // SAFETY: forwarded.
            batch(unsafe { qp_of(qp) }).err.get_or_insert(e);
        },
    )
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = WrOpcode::AtomicCmpAndSwp {
        remote_addr,
        rkey,
        compare,
        swap,
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = WrOpcode::AtomicFetchAndAdd {
        remote_addr,
        rkey,
        add,
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

/// `ibv_wr_bind_mw`: a type 2 window bound to `bind_info`'s range with the new key `rkey`
/// (`ibv_inc_rkey` of the window's), as an `IBV_WR_BIND_MW` request.
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    // SAFETY: the C contract of the builders.
    unsafe {
        if bind_info.is_null() {
            return refuse(qp, libc::EINVAL);
        }
        let info = bind_info.read();
        // SAFETY: registry-checked.
        let (Some(w), Some(m)) = (Mw::from_ibv(mw), crate::mr::Mr::from_ibv(info.mr)) else {
            return refuse(qp, libc::EINVAL);
        };
        let op = WrOpcode::BindMw {
            mw_rkey: w.vmw.rkey(),
            new_rkey: rkey,
            mr_lkey: m.mr.lkey,
            addr: info.addr,
            length: info.length,
            access: Access(info.mw_access_flags),
        };
        start(qp, op);
        with_last(qp, |_, b| {
            b.bind = Some((mw, info.mr));
            Ok(())
        });
    }
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = WrOpcode::LocalInv {
        rkey: invalidate_rkey,
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, WrOpcode::RdmaRead { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, WrOpcode::RdmaWrite { remote_addr, rkey }) }
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    let op = WrOpcode::RdmaWriteWithImm {
        remote_addr,
        rkey,
        // verbs.h passes the immediate in network byte order.
        imm: u32::from_be(imm),
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, WrOpcode::Send) }
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    let op = WrOpcode::SendWithImm {
        imm: u32::from_be(imm),
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    let op = WrOpcode::SendWithInv {
        rkey: invalidate_rkey,
    };
    // SAFETY: the C contract of the builders.
    unsafe { start(qp, op) }
}

/// `ibv_wr_send_tso`: no TSO (`tso_caps` is 0).
unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    // SAFETY: the C contract of the builders.
    unsafe { refuse(qp, libc::EOPNOTSUPP) }
}

/// `ibv_wr_atomic_write`: not offered.
unsafe extern "C" fn wr_atomic_write(
    qp: *mut ibv_qp_ex,
    _rkey: u32,
    _remote_addr: u64,
    _atomic_wr: *const c_void,
) {
    // SAFETY: the C contract of the builders.
    unsafe { refuse(qp, libc::EOPNOTSUPP) }
}

/// `ibv_wr_set_xrc_srqn`: no XRC.
unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
    // SAFETY: the C contract of the builders.
    unsafe { refuse(qp, libc::EOPNOTSUPP) }
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: the C contract of the builders.
    unsafe {
        with_last(qp, |q, b| {
            // SAFETY: registry-checked; the C API forbids destroying an AH a request names.
            let a = Ah::from_ibv(ah).ok_or(libc::EINVAL)?;
            if !std::sync::Arc::ptr_eq(&a.shared, &q.shared) {
                return Err(libc::EINVAL);
            }
            b.ud = Some(a.vah.dest(qpn, qkey));
            Ok(())
        })
    }
}

/// Add inline bytes to the request being built (at most `max_inline_data` in all).
fn add_inline(q: &Qp, b: &mut Building, bytes: &[u8]) -> Result<(), c_int> {
    let buf = b.inline.get_or_insert_with(Vec::new);
    if buf.len() + bytes.len() > q.cap.max_inline_data as usize {
        return Err(libc::EINVAL);
    }
    buf.extend_from_slice(bytes);
    Ok(())
}

/// `length` bytes at `addr` (none for a zero length).
///
/// # Safety
/// `addr` names `length` readable bytes when `length` is not 0.
unsafe fn bytes<'a>(addr: *const c_void, length: usize) -> Result<&'a [u8], c_int> {
    if length == 0 {
        return Ok(&[]);
    }
    if addr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the contract above.
    Ok(unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), length) })
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: the C contract of the builders; the bytes are copied before returning.
    unsafe {
        with_last(qp, |q, b| {
            b.inline = Some(Vec::new());
            add_inline(q, b, bytes(addr, length)?)
        })
    }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    // SAFETY: the C contract of the builders; the bytes are copied before returning.
    unsafe {
        with_last(qp, |q, b| {
            b.inline = Some(Vec::new());
            if num_buf > 0 && buf_list.is_null() {
                return Err(libc::EINVAL);
            }
            for i in 0..num_buf {
                let d = buf_list.add(i).read();
                add_inline(q, b, bytes(d.addr, d.length)?)?;
            }
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the C contract of the builders.
    unsafe {
        with_last(qp, |_, b| {
            b.sges = vec![Sge { addr, length, lkey }];
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    // SAFETY: the C contract of the builders.
    unsafe {
        with_last(qp, |q, b| {
            if num_sge > MAX_SGE || num_sge > q.cap.max_send_sge as usize {
                return Err(libc::EINVAL);
            }
            if num_sge > 0 && sg_list.is_null() {
                return Err(libc::EINVAL);
            }
            b.sges = (0..num_sge)
                .map(|i| {
                    // SAFETY: `num_sge` readable entries per the contract.
                    let s = sg_list.add(i).read();
                    Sge {
                        addr: s.addr,
                        length: s.length,
                        lkey: s.lkey,
                    }
                })
                .collect();
            Ok(())
        })
    }
}

/// `ibv_wr_start`: a new batch (one left unfinished is dropped).
unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    guard(
        || (),
        || {
            // SAFETY: the C contract of the builders.
            *batch(unsafe { qp_of(qp) }) = WrBatch::default();
        },
    )
}

/// `ibv_wr_abort`: drop the batch.
unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the C contract of the builders.
    unsafe { wr_start(qp) }
}

/// `ibv_wr_complete`: post the batch; 0 or errno (see the module documentation).
unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard(
        || crate::errno::PANIC_ERRNO,
        || {
            // SAFETY: the C contract of the builders.
            let q = unsafe { qp_of(qp) };
            let WrBatch { wrs, err } = std::mem::take(&mut *batch(q));
            if let Some(e) = err {
                return e;
            }
            if q.qp_type == crate::qp::IBV_QPT_UD && wrs.iter().any(|w| w.ud.is_none()) {
                return libc::EINVAL;
            }
            let mut post = q.vqp.post_batch();
            for w in &wrs {
                let mut flags = w.flags;
                if w.inline.is_some() {
                    flags = SendFlags(flags.0 | SendFlags::INLINE.0);
                }
                let wr = SendWr {
                    wr_id: w.wr_id,
                    opcode: w.opcode,
                    send_flags: flags,
                    sg_list: if w.inline.is_some() { &[] } else { &w.sges },
                    inline_data: w.inline.as_deref(),
                    ud: w.ud,
                };
                let posted = match (w.bind, w.opcode) {
                    (Some((mw, mr)), WrOpcode::BindMw { .. }) => {
                        crate::post::post_bind(&mut post, w.wr_id, flags, w.opcode, mw, mr)
                    }
                    _ => post.post(&wr).map_err(|e| e.errno()),
                };
                if let Err(e) = posted {
                    return e;
                }
            }
            0
        },
    )
}
