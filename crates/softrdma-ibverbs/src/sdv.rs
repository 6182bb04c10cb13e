//! softrdma's direct verbs (`include/softrdma/sdv.h`, version node `SOFTRDMA_1.0`): what no
//! standard verb covers, the way mlx5 offers `mlx5dv`. Suspend/resume of a region (its
//! memory may move: `softrdma::verbs::Mr::suspend`/`resume`), its remap policy and coherence
//! state (`MemoryTable::set_remap_policy`/`region_coherence`), and counters
//! (`Device::counters`, `Device::mem_stats`, `Qp::counters`).
//!
//! Every call returns 0 or an errno value and sets no `errno`; a pointer the registry does not
//! know (NULL, freed, another kind) is EINVAL. Out-structs start with a `size` the caller
//! sets: the library writes `min(size, its own)` bytes and reports that in `size`.

use core::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use softrdma::verbs::VerbsError;
use softrdma::verbs::{InvalidationCause, MemSource, RegionState, RemapPolicy};

use crate::abi::*;
use crate::context::shared_of;
use crate::errno::ffi_errno;
use crate::mr::Mr;
use crate::qp::Qp;

/// Bytes of the `size` header every out-struct starts with (`size`, `reserved` or the first
/// field).
const HEADER: u32 = 8;

/// Write `val` to `out` as the out-struct convention says (see the module doc).
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes whose first field is `size: u32`.
unsafe fn put<T: Copy>(
    out: *mut T,
    mut val: T,
    set_size: impl FnOnce(&mut T, u32),
) -> Result<(), c_int> {
    if out.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL; the first four bytes are the caller's `size` (contract).
    let asked = unsafe { out.cast::<u32>().read_unaligned() };
    if asked < HEADER {
        return Err(libc::EINVAL);
    }
    let n = (asked as usize).min(core::mem::size_of::<T>());
    set_size(&mut val, n as u32);
    if n == core::mem::size_of::<T>() {
        // SAFETY: `out` has room for a whole `T` (asked >= size_of::<T>()).
        unsafe { out.write_unaligned(val) };
    } else {
        // A shorter (older) struct: the fields that fit. Every out-struct is a sequence of
        // u32/u64 fields with no padding, so its bytes are all initialized.
        // SAFETY: `val` is `size_of::<T>() >= n` initialized bytes; `out` has `asked >= n`
        // writable bytes.
        unsafe {
            core::ptr::copy_nonoverlapping((&val as *const T).cast::<u8>(), out.cast::<u8>(), n)
        };
    }
    Ok(())
}

/// The live region behind `mr`, with its engine region.
fn live_mr<'a>(mr: *mut ibv_mr) -> Result<(&'a Mr, &'a softrdma::verbs::Mr), c_int> {
    // SAFETY: sdv.h forbids deregistering the region concurrently with these calls.
    let m = unsafe { Mr::from_ibv(mr) }.ok_or(libc::EINVAL)?;
    let v = m.vmr.as_ref().ok_or(libc::EINVAL)?;
    Ok((m, v))
}

fn errno(e: impl Into<VerbsError>) -> c_int {
    e.into().errno()
}

/// `softrdma_mr_suspend`: 0 or errno (EINVAL: not a live region, or invalidated).
///
/// # Safety
/// None beyond sdv.h's: any pointer is accepted.
pub unsafe extern "C" fn softrdma_mr_suspend(mr: *mut ibv_mr) -> c_int {
    ffi_errno(|| live_mr(mr)?.1.suspend().map_err(errno))
}

/// `softrdma_mr_resume`: 0 or errno (EINVAL: not a live region, not suspended, new memory
/// for device memory; ENOMEM/EFAULT: the new memory cannot be pinned).
///
/// # Safety
/// `new_addr` is NULL or the first of `mr->length` bytes that stay mapped, readable and
/// writable until the region is deregistered or resumed elsewhere, and that the device may
/// access from any thread meanwhile (as for `ibv_reg_mr`). No other thread uses `mr` (the
/// struct: work requests naming its keys are fine) during the call.
pub unsafe extern "C" fn softrdma_mr_resume(mr: *mut ibv_mr, new_addr: *mut c_void) -> c_int {
    ffi_errno(|| {
        let (m, v) = live_mr(mr)?;
        if new_addr.is_null() {
            return v.resume(None).map(drop).map_err(errno);
        }
        if m.dm.is_some() {
            return Err(libc::EINVAL);
        }
        let len = usize::try_from(v.len()).map_err(|_| libc::EINVAL)?;
        // SAFETY: the caller's contract (above) is `MemSource::raw`'s.
        let src = unsafe { MemSource::raw(new_addr.cast(), len) };
        // The old memory (a dma-buf's mapping and descriptor) is released here; raw memory
        // is the caller's again.
        drop(v.resume(Some(src)).map_err(errno)?);
        // SAFETY: a live region (checked above) whose C struct no other thread uses during
        // this call (contract); the references above are not used past this point.
        unsafe { core::ptr::addr_of_mut!((*mr).addr).write(new_addr) };
        Ok(())
    })
}

/// `softrdma_mr_set_remap_policy`: 0 or errno (EINVAL: not a live region, unknown policy).
///
/// # Safety
/// None beyond sdv.h's: any pointer is accepted.
pub unsafe extern "C" fn softrdma_mr_set_remap_policy(mr: *mut ibv_mr, policy: u32) -> c_int {
    ffi_errno(|| {
        let (m, v) = live_mr(mr)?;
        let p = match policy {
            SOFTRDMA_REMAP_INVALIDATE => RemapPolicy::Invalidate,
            SOFTRDMA_REMAP_FOLLOW => RemapPolicy::Follow,
            _ => return Err(libc::EINVAL),
        };
        let dev = m.shared.verbs()?;
        dev.mem().set_remap_policy(v.lkey(), p).map_err(errno)
    })
}

/// `softrdma_mr_get_remap_policy`: 0 or errno (EINVAL: not a live region, NULL `policy`).
///
/// # Safety
/// `policy` is NULL or points to a writable `enum softrdma_remap_policy`.
pub unsafe extern "C" fn softrdma_mr_get_remap_policy(mr: *mut ibv_mr, policy: *mut u32) -> c_int {
    ffi_errno(|| {
        if policy.is_null() {
            return Err(libc::EINVAL);
        }
        let c = coherence(mr)?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { policy.write_unaligned(c.remap_policy) };
        Ok(())
    })
}

fn coherence(mr: *mut ibv_mr) -> Result<softrdma_mr_coherence, c_int> {
    let (m, v) = live_mr(mr)?;
    let mem = m.shared.verbs()?.mem();
    let rc = mem.region_coherence(v.lkey()).map_err(errno)?;
    let info = mem.query_mr(v.lkey()).map_err(errno)?;
    Ok(softrdma_mr_coherence {
        size: 0,
        state: match rc.state {
            RegionState::Active => SOFTRDMA_MR_ACTIVE,
            RegionState::Suspended => SOFTRDMA_MR_SUSPENDED,
            RegionState::Invalidated => SOFTRDMA_MR_INVALIDATED,
        },
        cause: match (rc.state, rc.cause) {
            (_, Some(InvalidationCause::Unmapped)) => SOFTRDMA_CAUSE_UNMAPPED,
            (_, Some(InvalidationCause::Discarded)) => SOFTRDMA_CAUSE_DISCARDED,
            (_, Some(InvalidationCause::Remapped)) => SOFTRDMA_CAUSE_REMAPPED,
            (_, Some(InvalidationCause::Faulted)) => SOFTRDMA_CAUSE_FAULTED,
            (RegionState::Invalidated, None) => SOFTRDMA_CAUSE_VERB,
            (_, None) => SOFTRDMA_CAUSE_NONE,
        },
        remap_policy: match rc.remap {
            RemapPolicy::Invalidate => SOFTRDMA_REMAP_INVALIDATE,
            RemapPolicy::Follow => SOFTRDMA_REMAP_FOLLOW,
        },
        watched: rc.watched.into(),
        checked_copy: rc.checked_copy.into(),
        iova: info.iova,
        addr: info.addr as u64,
        length: info.length,
    })
}

/// `softrdma_mr_query_coherence`: 0 or errno (EINVAL: not a live region, `out` NULL or
/// `out->size` below 8).
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes.
pub unsafe extern "C" fn softrdma_mr_query_coherence(
    mr: *mut ibv_mr,
    out: *mut softrdma_mr_coherence,
) -> c_int {
    ffi_errno(|| {
        let c = coherence(mr)?;
        // SAFETY: forwarded contract.
        unsafe { put(out, c, |c, n| c.size = n) }
    })
}

/// `softrdma_query_counters`: 0 or errno (EINVAL: not an open context, `out` NULL or
/// `out->size` below 8; the errno of opening the engine, e.g. EADDRINUSE).
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes.
pub unsafe extern "C" fn softrdma_query_counters(
    context: *mut ibv_context,
    out: *mut softrdma_counters,
) -> c_int {
    ffi_errno(|| {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        let dev = shared.verbs()?;
        let e = dev.counters();
        let m = dev.mem_stats();
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let c = softrdma_counters {
            size: 0,
            reserved: 0,
            rx_datagrams: l(&e.rx_datagrams),
            rx_packets: l(&e.rx_packets),
            rx_bad: l(&e.rx_bad),
            rx_icrc_solved: l(&e.rx_icrc_solved),
            rx_unknown_qp: l(&e.rx_unknown_qp),
            rx_wrong_peer: l(&e.rx_wrong_peer),
            tx_datagrams: l(&e.tx_datagrams),
            tx_packets: l(&e.tx_packets),
            tx_errors: l(&e.tx_errors),
            tx_zero_copy: l(&e.tx_zero_copy),
            thread_wakeups: l(&e.thread_wakeups),
            thread_receives: l(&e.thread_receives),
            timer_scans: l(&e.timer_scans),
            regions: m.regions,
            windows: m.windows,
            pds: m.pds,
            pinned_bytes: m.pinned_bytes,
            pin_refusals: m.pin_refusals,
            device_bytes: m.device_bytes,
            watched_regions: m.watched_regions,
            unwatched_regions: m.unwatched_regions,
            coherence_events: m.coherence_events,
            watch_invalidations: m.watch_invalidations,
            remaps_followed: m.remaps_followed,
            access_faults: m.access_faults,
            invalidations_dropped: m.invalidations_dropped,
            access_violations: l(&e.access_violations),
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, c, |c, n| c.size = n) }
    })
}

/// `softrdma_query_qp_counters`: 0 or errno (EINVAL: not a live QP, `out` NULL or
/// `out->size` below 8).
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes.
pub unsafe extern "C" fn softrdma_query_qp_counters(
    qp: *mut ibv_qp,
    out: *mut softrdma_qp_counters,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids destroying the QP concurrently.
        let q = unsafe { Qp::from_ibv(qp) }.ok_or(libc::EINVAL)?;
        let k = q.vqp.counters();
        let c = softrdma_qp_counters {
            size: 0,
            reserved: 0,
            packets_sent: k.packets_sent,
            packets_received: k.packets_received,
            packets_dropped: k.packets_dropped,
            retransmits: k.comp.retransmits,
            timeouts: k.comp.timeouts,
            rnr_naks_received: k.comp.rnr_naks_received,
            seq_naks_received: k.comp.seq_naks_received,
            rerequests: k.comp.rerequests,
            duplicates: k.resp.duplicates,
            rnr_naks_sent: k.resp.rnr_naks_sent,
            seq_naks_sent: k.resp.seq_naks_sent,
            naks_sent: k.resp.naks_sent,
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, c, |c, n| c.size = n) }
    })
}
