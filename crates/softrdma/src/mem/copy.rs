//! The only code that touches registered bytes.
//!
//! Remote peers may write the same bytes concurrently through different QPs, as on any RDMA
//! NIC; the result of such racing writes is unspecified bytes, never memory unsafety outside
//! the validated range.
//!
//! # Two ways to copy
//! Memory the engine holds alive (owned buffers, its own mapping of a file, device memory)
//! cannot vanish while a region's state lock is held, so it is copied with a plain `memcpy`
//! ([`CopyMode::Plain`]). Memory at a raw address belongs to the application, which may
//! `munmap` or `mremap` it at any moment: the watcher only learns of an unmap *after* the
//! pages are gone, so no lock can keep a copy from faulting. Raw regions are therefore copied
//! by the kernel, with `process_vm_writev`/`process_vm_readv` on our own process
//! ([`CopyMode::Checked`]): a missing or protected page makes the call fail with `EFAULT`,
//! which becomes [`AccessError::Fault`](super::AccessError::Fault), never a signal.
//!
//! Candidates measured and rejected (figures in docs/PERFORMANCE.md, "Registration
//! coherence"): `pread`/`pwrite` on `/proc/self/mem` (equally safe, slower at every size, and
//! it writes through read-only mappings because it uses `FOLL_FORCE`); pre-checking pages
//! with `mincore` or `/proc/self/pagemap` (racy: the page can go between check and copy); a
//! `SIGSEGV` handler that resumes a faulting copy (a library would have to own the process's
//! signal disposition and chain with whatever the application, its runtime or a sanitizer
//! installs, where the last installer silently wins; `sigsetjmp`/`longjmp` across Rust frames
//! is undefined behaviour, and a hand-written copy loop with a fix-up table is per
//! architecture).
//!
//! # Atomics on raw regions
//! No system call performs a 64-bit compare-and-swap or fetch-and-add on another address
//! with fault handling. softrdma's atomics are atomic with respect to the device
//! (`IBV_ATOMIC_HCA`: other RDMA atomics, not the application's CPU instructions), so an
//! atomic on a raw region is executed under one process-wide lock as a kernel-checked read of
//! its 8 bytes, the operation, and a kernel-checked write of the result: every softrdma
//! atomic on raw memory, of any device of the process, is serialised by that lock, and a
//! missing page (unmapped, or a file truncated under it) or a read-only one fails with
//! `Fault`, never a signal. The 8 naturally aligned bytes lie in one page, so the write is
//! all or nothing. A CPU atomic here instead would fault on memory made read-only or unmapped
//! after the registration, which a peer could trigger at will.

use std::sync::atomic::{AtomicU64, Ordering};

use super::AtomicOp;

/// How a region's bytes are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyMode {
    /// `memcpy` and CPU atomics: memory the engine keeps alive.
    Plain,
    /// Kernel-checked copies: raw memory that may vanish at any time.
    Checked,
}

/// A checked copy hit a missing or protected page (`EFAULT`) or failed otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Faulted;

/// Whether `process_vm_readv`/`process_vm_writev` work on our own process here (a seccomp
/// filter may refuse them).
pub(crate) fn checked_copy_available() -> bool {
    let src = [0x5au8; 8];
    let mut dst = [0u8; 8];
    // SAFETY: both buffers are live locals of 8 bytes.
    let ok = unsafe { vm_copy(src.as_ptr(), dst.as_mut_ptr(), 8, false) };
    ok.is_ok() && dst == src
}

/// Move `len` bytes from `src` to `dst` through the kernel; the side named `remote` (the
/// registered memory: `dst` when `to_remote`, else `src`) may be unmapped.
///
/// # Safety
/// The non-remote side must be valid for `len` bytes (of reads for `src`, writes for `dst`).
unsafe fn vm_copy(
    src: *const u8,
    dst: *mut u8,
    len: usize,
    to_remote: bool,
) -> Result<(), Faulted> {
    let mut done = 0usize;
    // Each call copies as much as it can; a short count means the next byte faulted, which the
    // next call reports as an error. The bound is generous: one extra call per fault.
    for _ in 0..4 {
        if done == len {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: if to_remote {
                src.wrapping_add(done) as *mut libc::c_void
            } else {
                dst.wrapping_add(done).cast()
            },
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: if to_remote {
                dst.wrapping_add(done).cast()
            } else {
                src.wrapping_add(done) as *mut libc::c_void
            },
            iov_len: len - done,
        };
        // SAFETY: the kernel copies between our local buffer (valid, per the caller) and the
        // remote range of our own address space, checking every page of the remote range
        // and failing with EFAULT instead of faulting; nothing else is touched. The pid is
        // read per call, so a forked child copies within itself.
        let n = unsafe {
            let pid = libc::getpid();
            if to_remote {
                libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
            } else {
                libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
            }
        };
        if n <= 0 {
            return Err(Faulted);
        }
        done += n as usize;
    }
    if done == len { Ok(()) } else { Err(Faulted) }
}

/// Copy `src` to `dst` in `mode`.
///
/// # Safety
/// `Plain`: `dst` must be valid for `src.len()` byte writes (a validated range of a live
/// region). `Checked`: `dst` must be a validated range of a raw region (it may be unmapped).
#[inline]
pub(crate) unsafe fn place(mode: CopyMode, dst: *mut u8, src: &[u8]) -> Result<(), Faulted> {
    match mode {
        // SAFETY: forwarded from the caller.
        CopyMode::Plain => unsafe { copy_in(dst, src) },
        CopyMode::Checked if src.is_empty() => {}
        // SAFETY: `src` is a live slice; the remote side is checked by the kernel.
        CopyMode::Checked => return unsafe { vm_copy(src.as_ptr(), dst, src.len(), true) },
    }
    Ok(())
}

/// Copy `dst.len()` bytes from `src` into `dst` in `mode`.
///
/// # Safety
/// As [`place`], for reads of `src`.
#[inline]
pub(crate) unsafe fn fetch(mode: CopyMode, src: *const u8, dst: &mut [u8]) -> Result<(), Faulted> {
    match mode {
        // SAFETY: forwarded from the caller.
        CopyMode::Plain => unsafe { copy_out(src, dst) },
        CopyMode::Checked if dst.is_empty() => {}
        // SAFETY: `dst` is a live slice; the remote side is checked by the kernel.
        CopyMode::Checked => {
            return unsafe { vm_copy(src, dst.as_mut_ptr(), dst.len(), false) };
        }
    }
    Ok(())
}

/// Execute `op` on the 8 bytes at `addr` in `mode` (see the module documentation for what
/// `Checked` does and does not guarantee).
///
/// # Safety
/// `addr` must be 8-byte aligned; `Plain`: valid for 8 bytes of reads and writes; `Checked`:
/// a validated range of a raw region that the application does not unmap concurrently with
/// this call.
#[inline]
pub(crate) unsafe fn atomic_in(
    mode: CopyMode,
    addr: *mut u8,
    op: AtomicOp,
) -> Result<u64, Faulted> {
    if mode == CopyMode::Plain {
        // SAFETY: forwarded from the caller.
        return Ok(unsafe { atomic(addr, op) });
    }
    // Checked: see the module documentation.
    static RAW_ATOMICS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = RAW_ATOMICS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cur = [0u8; 8];
    // SAFETY: `cur` is a live local; the kernel checks `addr`.
    unsafe { vm_copy(addr, cur.as_mut_ptr(), 8, false)? };
    let orig = u64::from_ne_bytes(cur);
    // Written back even when unchanged (a failed compare): memory the peer may not write must
    // refuse the atomic either way, and under the lock no softrdma atomic changed it since.
    let out = apply(orig, op).to_ne_bytes();
    // SAFETY: `out` is a live local; the kernel checks `addr` (present and writable).
    unsafe { vm_copy(out.as_ptr(), addr, 8, true)? };
    Ok(orig)
}

/// The value `op` leaves in place of `orig`.
fn apply(orig: u64, op: AtomicOp) -> u64 {
    match op {
        AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
        AtomicOp::CompareSwap { .. } => orig,
        AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
    }
}

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
