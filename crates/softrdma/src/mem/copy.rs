//! The only code that touches registered bytes. Kept in one place so that a fault-tolerant
//! copy (one that survives the application unmapping raw memory) can replace it.
//!
//! Remote peers may write the same bytes concurrently through different QPs, as on any RDMA
//! NIC; the result of such racing writes is unspecified bytes, never memory unsafety outside
//! the validated range.

use std::sync::atomic::{AtomicU64, Ordering};

use super::AtomicOp;

/// Copy `src` to `dst`.
///
/// # Safety
/// `dst` must be valid for `src.len()` byte writes (a validated range of a live region).
#[inline]
pub(crate) unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
    if src.is_empty() {
        return;
    }
    // SAFETY: the caller guarantees `dst..dst+len` is writable; `src` is a distinct Rust slice
    // (registered memory is never handed out as a Rust reference), so they do not overlap.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// Copy `dst.len()` bytes from `src` into `dst`.
///
/// # Safety
/// `src` must be valid for `dst.len()` byte reads (a validated range of a live region).
#[inline]
pub(crate) unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    if dst.is_empty() {
        return;
    }
    // SAFETY: the caller guarantees `src..src+len` is readable; `dst` is a distinct Rust slice.
    unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
}

/// Execute `op` on the 8 bytes at `addr` and return the original value.
///
/// # Safety
/// `addr` must be 8-byte aligned and valid for 8 bytes of reads and writes.
#[inline]
pub(crate) unsafe fn atomic(addr: *mut u8, op: AtomicOp) -> u64 {
    // SAFETY: the caller guarantees alignment and validity; every atomic the engine runs on
    // this address goes through `AtomicU64`, so concurrent atomics are really atomic.
    let cell = unsafe { AtomicU64::from_ptr(addr.cast::<u64>()) };
    match op {
        AtomicOp::CompareSwap { compare, swap } => {
            match cell.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            }
        }
        AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::AcqRel),
    }
}
