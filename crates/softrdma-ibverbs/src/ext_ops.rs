//! The extended operations of `struct verbs_context` that this library serves, and
//! `query_device_ex`.
//!
//! verbs.h consults `verbs_context` only when `context.abi_compat` is `UINTPTR_MAX`; then each
//! inline wrapper calls its slot if it is non-NULL and otherwise behaves as before (a fallback
//! to the exported function, or EOPNOTSUPP). [`install`] fills `query_device_ex`,
//! `reg_dm_mr`, `alloc_dm`, `free_dm`, `create_qp_ex`, `create_cq_ex`, `advise_mr` and
//! `alloc_parent_domain` and sets the marker, on a context just opened (`crate::open`, before
//! its pointer reaches C); every other slot stays NULL.

use core::ffi::{c_int, c_void};
use core::mem::offset_of;

use softrdma::verbs::MemConfig;

use crate::abi::*;
use crate::context::{CONTEXT_OFFSET, Context};
use crate::errno::ffi_errno;
use crate::query::device_attr;

/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` of a context whose `verbs_context` is valid.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// Fill the extended slots of the context `ctx` (from `Context::open`) and mark it extended.
///
/// # Safety
/// `ctx` was just returned by `Context::open` and has not been handed to C or any other
/// thread yet.
pub unsafe fn install(ctx: *mut ibv_context) {
    // SAFETY: `ctx` is CONTEXT_OFFSET bytes into a live, boxed Context that only this thread
    // knows; writing its C part through a raw pointer creates no aliasing reference. Each
    // function pointer is stored type-erased in the slot verbs.h declares with exactly its
    // signature, and C calls it through that declaration only.
    unsafe {
        let c = ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<Context>();
        let ops = core::ptr::addr_of_mut!((*c).vctx.ops);
        let slot = |f: *const ()| -> CompatSlot {
            Some(core::mem::transmute::<*const (), unsafe extern "C" fn()>(f))
        };
        (*ops)[vctx_slot::QUERY_DEVICE_EX] = slot(query_device_ex as *const ());
        (*ops)[vctx_slot::REG_DM_MR] = slot(crate::dm::reg_dm_mr as *const ());
        (*ops)[vctx_slot::ALLOC_DM] = slot(crate::dm::alloc_dm as *const ());
        (*ops)[vctx_slot::FREE_DM] = slot(crate::dm::free_dm as *const ());
        (*ops)[vctx_slot::CREATE_QP_EX] = slot(create_qp_ex as *const ());
        (*ops)[vctx_slot::CREATE_CQ_EX] = slot(crate::cq::create_cq_ex as *const ());
        (*ops)[vctx_slot::ADVISE_MR] = slot(advise_mr as *const ());
        (*ops)[vctx_slot::ALLOC_PARENT_DOMAIN] = slot(crate::mr::alloc_parent_domain as *const ());
        core::ptr::addr_of_mut!((*ctx).abi_compat).write(VERBS_ABI_IS_EXTENDED as *mut c_void);
    }
}

/// Device memory a device offers in all (`max_dm_size`): the memory table's bound on
/// device-allocated bytes, which `verbs::Device::open` leaves at its default.
pub fn max_dm_size() -> u64 {
    MemConfig::default().max_device_bytes
}

/// `verbs_context.query_device_ex` (verbs.h's `ibv_query_device_ex`): the attributes of
/// `ibv_query_device` plus `max_dm_size` and `phys_port_cnt_ex`; the rest is zero. Writes
/// `attr_size` bytes (a caller built against an older header passes fewer and gets the
/// fields that fit; a newer one gets zeros past ours). 0 or errno (EINVAL: not an open context, NULL `attr`,
/// `attr_size` below `struct ibv_device_attr`, `input->comp_mask` not 0). Does not open the
/// engine.
///
/// # Safety
/// `attr` is NULL or points to `attr_size` writable bytes; `input` is NULL or readable.
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids closing a context while querying it.
        let dev = unsafe { Context::from_ibv(context) }
            .map(|c| c.shared.dev)
            .ok_or(libc::EINVAL)?;
        // SAFETY: NULL or readable per the contract.
        if !input.is_null() && unsafe { input.read() }.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < core::mem::size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        let put = |off: usize, bytes: &[u8]| {
            if off + bytes.len() <= attr_size {
                // SAFETY: inside the caller's `attr_size` writable bytes (checked just above).
                unsafe {
                    let dst = attr.cast::<u8>().add(off);
                    core::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len());
                }
            }
        };
        // SAFETY: `attr` has `attr_size` writable bytes (the contract), at least an
        // `ibv_device_attr` (checked above), which is its first member; the rest is zero but
        // for the two fields written below, each only where it fits.
        unsafe {
            core::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            attr.cast::<ibv_device_attr>().write(device_attr(dev));
        }
        put(
            offset_of!(ibv_device_attr_ex, max_dm_size),
            &max_dm_size().to_ne_bytes(),
        );
        put(
            offset_of!(ibv_device_attr_ex, phys_port_cnt_ex),
            &1u32.to_ne_bytes(),
        );
        // On-demand paging: a region registered with IBV_ACCESS_ON_DEMAND is never pinned
        // (in any pin mode) and its pages are faulted in by the transfers that reach them, on
        // every transport and operation (no implicit ODP: a registration names its bytes).
        let caps = offset_of!(ibv_device_attr_ex, odp_caps);
        let per = caps + offset_of!(ibv_odp_caps, per_transport_caps);
        put(
            caps + offset_of!(ibv_odp_caps, general_caps),
            &odp::SUPPORT.to_ne_bytes(),
        );
        let rc = odp::SEND | odp::RECV | odp::WRITE | odp::READ | odp::ATOMIC | odp::SRQ_RECV;
        let uc = odp::SEND | odp::RECV | odp::WRITE | odp::SRQ_RECV;
        let ud = odp::SEND | odp::RECV | odp::SRQ_RECV;
        for (field, bits) in [
            (offset_of!(ibv_odp_per_transport_caps, rc_odp_caps), rc),
            (offset_of!(ibv_odp_per_transport_caps, uc_odp_caps), uc),
            (offset_of!(ibv_odp_per_transport_caps, ud_odp_caps), ud),
        ] {
            put(per + field, &bits.to_ne_bytes());
        }
        Ok(())
    })
}

/// `verbs_context.create_qp_ex` (verbs.h's `ibv_create_qp_ex` with more than
/// `IBV_QP_INIT_ATTR_PD` in `comp_mask`): `ibv_create_qp` on `attr->pd` with the base fields;
/// the capacities granted are written back. `IBV_QP_INIT_ATTR_CREATE_FLAGS` with no flag set
/// is accepted, and `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` with any operation but TSO and
/// ATOMIC_WRITE (every QP has the `ibv_wr_*` post API: `crate::wr_ex`). NULL with errno
/// EINVAL (no PD, not a context of ours, unknown `comp_mask` bits, a PD of another context),
/// or EOPNOTSUPP for what this device does not offer: creation flags, a TSO header
/// (`tso_caps` is 0), XRC domains, RSS (indirection tables, hashing), TSO or ATOMIC_WRITE
/// sends. Otherwise the errno of `ibv_create_qp`.
///
/// # Safety
/// `attr` is NULL or points to a readable and writable `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    crate::errno::ffi_ptr(|| {
        use qp_init_attr_mask as m;
        // SAFETY: the registry check of `Context::from_ibv`.
        let ctx = unsafe { Context::from_ibv(context) }.ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        let known = m::PD
            | m::XRCD
            | m::CREATE_FLAGS
            | m::MAX_TSO_HEADER
            | m::IND_TABLE
            | m::RX_HASH
            | m::SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 || a.comp_mask & m::PD == 0 || a.pd.is_null() {
            return Err(libc::EINVAL);
        }
        let unsupported = m::XRCD | m::IND_TABLE | m::RX_HASH;
        if a.comp_mask & unsupported != 0
            || (a.comp_mask & m::SEND_OPS_FLAGS != 0
                && a.send_ops_flags & !crate::wr_ex::SUPPORTED_SEND_OPS != 0)
            || (a.comp_mask & m::CREATE_FLAGS != 0 && a.create_flags != 0)
            || (a.comp_mask & m::MAX_TSO_HEADER != 0 && a.max_tso_header != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: the PD's registry check; the C API forbids deallocating it concurrently.
        match unsafe { crate::mr::Pd::from_ibv(a.pd) } {
            Some(p) if std::sync::Arc::ptr_eq(&p.shared, &ctx.shared) => {}
            _ => return Err(libc::EINVAL),
        }
        let mut base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: our PD and a valid attribute struct.
        let qp = unsafe { crate::qp::ibv_create_qp(a.pd, &mut base) };
        if qp.is_null() {
            return Err(crate::errno::errno());
        }
        // SAFETY: as above (writable per the contract): the granted capacities go back.
        unsafe { (*attr).cap = base.cap };
        Ok(qp)
    })
}

/// `enum ibv_odp_general_caps` and `enum ibv_odp_transport_cap_bits`.
mod odp {
    pub const SUPPORT: u64 = 1 << 0;
    pub const SEND: u32 = 1 << 0;
    pub const RECV: u32 = 1 << 1;
    pub const WRITE: u32 = 1 << 2;
    pub const READ: u32 = 1 << 3;
    pub const ATOMIC: u32 = 1 << 4;
    pub const SRQ_RECV: u32 = 1 << 5;
}

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetch the ranges named by `sg_list` (local
/// keys of `pd`'s regions) so that transfers do not fault their pages in. Advice
/// `IBV_ADVISE_MR_ADVICE_PREFETCH` and `PREFETCH_NO_FAULT` populate for reading,
/// `PREFETCH_WRITE` for writing (the region must allow `LOCAL_WRITE`); the work is done before
/// the call returns, with `IBV_ADVISE_MR_FLAG_FLUSH` or without. 0 or errno: EINVAL (not a PD
/// of ours, no SGE, unknown advice or flags, a key not of a region of `pd`, a range outside it,
/// a write prefetch of a region without LOCAL_WRITE), EFAULT (memory gone).
///
/// # Safety
/// `sg_list` is NULL or points to `num_sge` readable SGEs.
pub unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    ffi_errno(|| {
        const PREFETCH: u32 = 0;
        const PREFETCH_WRITE: u32 = 1;
        const PREFETCH_NO_FAULT: u32 = 2;
        const FLAG_FLUSH: u32 = 1;
        // SAFETY: the C API forbids deallocating the PD concurrently.
        let p = unsafe { crate::mr::Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if sg_list.is_null() || num_sge == 0 || flags & !FLAG_FLUSH != 0 {
            return Err(libc::EINVAL);
        }
        let write = match advice {
            PREFETCH | PREFETCH_NO_FAULT => false,
            PREFETCH_WRITE => true,
            _ => return Err(libc::EINVAL),
        };
        let mem = p.shared.verbs()?.mem().clone();
        let ctx = softrdma::verbs::AccessCtx {
            pd: p.vpd.handle(),
            qpn: 0,
        };
        for i in 0..num_sge as usize {
            // SAFETY: `num_sge` readable entries per the contract.
            let s = unsafe { sg_list.add(i).read() };
            mem.prefetch(ctx, s.lkey, s.addr, u64::from(s.length), write)
                .map_err(|e| match e {
                    softrdma::verbs::AccessError::Fault(_) => libc::EFAULT,
                    _ => libc::EINVAL,
                })?;
        }
        Ok(())
    })
}
