//! Device memory: `ibv_alloc_dm`, `ibv_free_dm`, `ibv_reg_dm_mr` and the `memcpy_to_dm` /
//! `memcpy_from_dm` operations of `struct ibv_dm`, over the Rust API's device-allocated
//! regions (`Pd::alloc_mr`: a sealed memfd the device maps, which no application unmap can
//! pull away).
//!
//! verbs.h reaches the first three through `struct verbs_context` (slots `reg_dm_mr`,
//! `alloc_dm`, `free_dm`, filled by [`crate::ext_ops::install`]). A DM is one allocation held
//! by a region of a private PD (no QP can name it: it grants no right and its PD has no QP);
//! `memcpy_*_dm` copy through that region. `ibv_reg_dm_mr` maps the same memfd again as a
//! file-backed region (zero-based, as rdma-core requires), so bytes copied to the DM are the
//! bytes peers reach. A DM is busy (EBUSY on free) while regions of it live.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma::verbs;
use softrdma::verbs::{Access, MemSource};

use crate::abi::*;
use crate::context::{Shared, shared_of};
use crate::errno::{ffi_errno, ffi_ptr};
use crate::mr::{DmHold, Pd, Registration, reg_source};
use crate::registry::{self, Kind};

/// What offsets and lengths of copies to and from device memory must be multiples of.
const DM_COPY_ALIGN: u64 = 4;

/// Largest `log_align_req`: the memory starts on a page.
pub const MAX_LOG_ALIGN: u32 = 12;

/// Device memory: the C struct first, then ours.
#[repr(C)]
pub struct Dm {
    /// What C sees.
    pub dm: ibv_dm,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The region of a private PD that holds the memory.
    holder: verbs::Mr,
    /// Bytes asked for.
    len: u64,
    /// Regions of this DM alive.
    users: Arc<AtomicU32>,
}

impl core::fmt::Debug for Dm {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Dm")
            .field("handle", &self.dm.handle)
            .field("len", &self.len)
            .finish()
    }
}

impl Dm {
    /// The DM behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_free_dm(dm)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(dm: *mut ibv_dm) -> Option<&'a Dm> {
        // SAFETY: registered DM pointers point to a live Dm (C struct first).
        registry::contains(dm, Kind::Dm).then(|| unsafe { &*dm.cast::<Dm>() })
    }

    /// `[offset, offset + len)` inside the DM, as an offset.
    /// A range for `memcpy_to_dm`/`memcpy_from_dm`: inside the DM, and offset and length
    /// multiples of 4 (EINVAL otherwise), as the device memory of the one hardware provider
    /// that has it (mlx5) requires, and rdma-core's tests expect of any.
    fn copy_range(&self, offset: u64, len: usize) -> Result<u64, c_int> {
        if !(offset | len as u64).is_multiple_of(DM_COPY_ALIGN) {
            return Err(libc::EINVAL);
        }
        self.range(offset, len)
    }

    fn range(&self, offset: u64, len: usize) -> Result<u64, c_int> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(offset),
            _ => Err(libc::EINVAL),
        }
    }
}

/// `verbs_context.alloc_dm` (verbs.h's `ibv_alloc_dm`): `attr->length` bytes of device
/// memory, zeroed. NULL with errno EINVAL (not an open context, NULL `attr`, zero length,
/// unknown `comp_mask` bits, `log_align_req` above 12) or ENOMEM (more than the device's
/// `max_dm_size` in all).
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_alloc_dm_attr`.
pub unsafe extern "C" fn alloc_dm(
    context: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        if a.length == 0 || a.comp_mask != 0 || a.log_align_req > MAX_LOG_ALIGN {
            return Err(libc::EINVAL);
        }
        let vpd = shared.verbs()?.alloc_pd().map_err(|e| e.errno())?;
        let holder = vpd
            .alloc_mr(a.length, Access::NONE)
            .map_err(|e| e.errno())?;
        let d = Box::into_raw(Box::new(Dm {
            dm: ibv_dm {
                context,
                memcpy_to_dm: Some(memcpy_to_dm),
                memcpy_from_dm: Some(memcpy_from_dm),
                comp_mask: 0,
                handle: holder.lkey(),
            },
            shared,
            holder,
            len: a.length as u64,
            users: Arc::new(AtomicU32::new(0)),
        }))
        .cast::<ibv_dm>();
        registry::insert(d, Kind::Dm);
        Ok(d)
    })
}

/// `verbs_context.free_dm` (verbs.h's `ibv_free_dm`): 0 or errno (EINVAL: not a live DM;
/// EBUSY: regions of it remain).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted (verbs.h reads `dm->context` first).
pub unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    ffi_errno(|| {
        if !registry::remove(dm, Kind::Dm) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Dm only this caller holds.
        let d = unsafe { &*dm.cast::<Dm>() };
        if d.users.load(Ordering::Acquire) > 0 {
            registry::insert(dm, Kind::Dm);
            return Err(libc::EBUSY);
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(dm.cast::<Dm>()) });
        Ok(())
    })
}

/// `verbs_context.reg_dm_mr` (verbs.h's `ibv_reg_dm_mr`): register `length` bytes at
/// `dm_offset` of `dm` in `pd`. The access flags must include `IBV_ACCESS_ZERO_BASED` (as
/// rdma-core requires): peers and SGEs address the region from 0; `mr->addr` is
/// `dm_offset` (a zero length registers an empty region, as mlx5 allows). NULL with errno
/// EINVAL (bad PD or DM, of different contexts, range outside the DM, no
/// `IBV_ACCESS_ZERO_BASED`, bad flags).
///
/// # Safety
/// None beyond the C API's: any pointers are accepted.
pub unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD or freeing the DM concurrently.
        let (p, d) = unsafe { (Pd::from_ibv(pd), Dm::from_ibv(dm)) };
        let (Some(p), Some(d)) = (p, d) else {
            return Err(libc::EINVAL);
        };
        if !Arc::ptr_eq(&p.shared, &d.shared) || access & IBV_ACCESS_ZERO_BASED == 0 {
            return Err(libc::EINVAL);
        }
        let offset = d.range(dm_offset, length)?;
        let file = d
            .shared
            .verbs()?
            .mem()
            .device_memory_fd(d.holder.lkey())
            .map_err(|e| verbs::VerbsError::from(e).errno())?;
        let hold = DmHold::new(&d.users);
        reg_source(
            p,
            Registration {
                src: MemSource::file(file, offset, length),
                addr: offset as usize as *mut c_void,
                iova: None,
                access,
                dm: Some(hold),
            },
        )
    })
}

/// `ibv_dm.memcpy_to_dm`: copy `length` bytes from `host_addr` to `dm_offset` of the DM.
/// 0 or errno (EINVAL: not a live DM, range outside it, offset or length not a multiple of
/// 4, NULL `host_addr` with a length).
///
/// # Safety
/// `host_addr` points to `length` readable bytes.
pub unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    dm_offset: u64,
    host_addr: *const c_void,
    length: usize,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids freeing the DM concurrently.
        let d = unsafe { Dm::from_ibv(dm) }.ok_or(libc::EINVAL)?;
        let offset = d.copy_range(dm_offset, length)?;
        if length == 0 {
            return Ok(());
        }
        if host_addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `length` readable bytes at `host_addr` (the caller's contract).
        let src = unsafe { core::slice::from_raw_parts(host_addr.cast::<u8>(), length) };
        d.holder.write(offset, src).map_err(|e| e.errno())
    })
}

/// `ibv_dm.memcpy_from_dm`: copy `length` bytes at `dm_offset` of the DM to `host_addr`.
/// 0 or errno (as [`memcpy_to_dm`]).
///
/// # Safety
/// `host_addr` points to `length` writable bytes.
pub unsafe extern "C" fn memcpy_from_dm(
    host_addr: *mut c_void,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
) -> c_int {
    ffi_errno(|| {
        // SAFETY: the C API forbids freeing the DM concurrently.
        let d = unsafe { Dm::from_ibv(dm) }.ok_or(libc::EINVAL)?;
        let offset = d.copy_range(dm_offset, length)?;
        if length == 0 {
            return Ok(());
        }
        if host_addr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `length` writable bytes at `host_addr` (the caller's contract), which the
        // DM's own memory (the device's mapping) cannot overlap.
        let dst = unsafe { core::slice::from_raw_parts_mut(host_addr.cast::<u8>(), length) };
        d.holder.read(offset, dst).map_err(|e| e.errno())
    })
}
