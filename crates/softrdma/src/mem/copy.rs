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
//! with checked copies ([`CopyMode::Checked`]), where a missing or protected page becomes
//! [`AccessError::Fault`](super::AccessError::Fault), never a signal: *caught* copies on
//! x86-64 Linux (`rep movsb` and locked atomics whose `SIGSEGV`/`SIGBUS` a handler turns into
//! a return of "faulted", `fault.rs`, which explains the price: owning a signal disposition,
//! chained to the previous one), else the kernel's, `process_vm_writev`/`process_vm_readv` on
//! our own process, which fail with `EFAULT` ([`CopyMode::Kernel`], also the fallback once a
//! program replaced the handler).
//!
//! Candidates measured and rejected (figures in docs/PERFORMANCE.md, "Registration
//! coherence"): `pread`/`pwrite` on `/proc/self/mem` (equally safe, no faster than the
//! kernel's copies, and it writes through read-only mappings because it uses `FOLL_FORCE`);
//! pre-checking pages with `mincore` or `/proc/self/pagemap` (racy: the page can go between
//! check and copy); `sigsetjmp`/`longjmp` out of a fault handler (undefined behaviour across
//! Rust frames: the caught routines resume at a fix-up of their own instead).
//!
//! # Bytes read while they may change
//! A zero-copy send checksums its payload where it lies in the region (`lend.rs`), while the
//! application, or a placement of a peer's WRITE, may be writing it. [`read_shared`] reads
//! such bytes without forming a reference to them: a byte-wise atomic copy into a stack
//! buffer, 4 KiB at a time, which the checksum then reads.
//!
//! # Atomics on raw regions
//! Caught atomics are CPU atomics (`lock xadd`, `lock cmpxchg`), whose fault on memory made
//! read-only or unmapped after the registration is caught like a copy's. Through the kernel:
//! no system call performs a 64-bit compare-and-swap or fetch-and-add on another address
//! with fault handling. softrdma's atomics are atomic with respect to the device
//! (`IBV_ATOMIC_HCA`: other RDMA atomics, not the application's CPU instructions), so an
//! atomic on a raw region is executed under one process-wide lock as a kernel-checked read of
//! its 8 bytes, the operation, and a kernel-checked write of the result: every softrdma
//! atomic on raw memory, of any device of the process, is serialised by that lock, and a
//! missing page (unmapped, or a file truncated under it) or a read-only one fails with
//! `Fault`, never a signal. The 8 naturally aligned bytes lie in one page, so the write is
//! all or nothing. An uncaught CPU atomic here instead would fault on memory made read-only or
//! unmapped after the registration, which a peer could trigger at will.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use super::{AtomicOp, fault};

/// How a region's bytes are reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyMode {
    /// `memcpy` and CPU atomics: memory the engine keeps alive.
    Plain,
    /// Raw memory that may vanish at any time: caught copies and atomics
    /// ([`super::fault`]) while they are armed, else the kernel's checked copies.
    Checked,
    /// Raw memory, always through the kernel's checked copies.
    Kernel,
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

/// This process's id, cached (a system call per copy otherwise: glibc no longer caches it).
/// A child made by `fork` forgets the parent's (the `pthread_atfork` handler registered
/// before the first value is cached), so it copies within itself.
fn own_pid() -> libc::pid_t {
    static PID: AtomicI32 = AtomicI32::new(0);
    static FORGET_IN_CHILD: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget() {
        PID.store(0, Ordering::Relaxed);
    }
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    FORGET_IN_CHILD.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic (async-signal-safe, as a
        // handler run in a forked child must be); nothing is unregistered later.
        unsafe { libc::pthread_atfork(None, None, Some(forget)) };
    });
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    PID.store(pid, Ordering::Relaxed);
    pid
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
        let pid = own_pid();
        // SAFETY: the kernel copies between our local buffer (valid, per the caller) and the
        // remote range of our own address space, checking every page of the remote range
        // and failing with EFAULT instead of faulting; nothing else is touched.
        let n = unsafe {
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
        _ if src.is_empty() => {}
        // SAFETY: `src` is a live slice; `dst` is raw memory that is valid or faults, and
        // faults are caught (armed).
        CopyMode::Checked if fault::armed() => {
            return unsafe { fault::copy(dst, src.as_ptr(), src.len()) };
        }
        // SAFETY: `src` is a live slice; the remote side is checked by the kernel.
        _ => return unsafe { vm_copy(src.as_ptr(), dst, src.len(), true) },
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
        _ if dst.is_empty() => {}
        // SAFETY: `dst` is a live slice; `src` is raw memory that is valid or faults, and
        // faults are caught (armed).
        CopyMode::Checked if fault::armed() => {
            return unsafe { fault::copy(dst.as_mut_ptr(), src, dst.len()) };
        }
        // SAFETY: `dst` is a live slice; the remote side is checked by the kernel.
        _ => return unsafe { vm_copy(src, dst.as_mut_ptr(), dst.len(), false) },
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
    if mode == CopyMode::Checked && fault::armed() {
        let p = addr.cast::<u64>();
        // SAFETY: an aligned word of raw memory that is valid or faults, and faults are
        // caught (armed): a CPU atomic, as for plain memory.
        return unsafe {
            match op {
                AtomicOp::CompareSwap { compare, swap } => fault::compare_swap(p, compare, swap),
                AtomicOp::FetchAdd { add } => fault::fetch_add(p, add),
            }
        };
    }
    // Through the kernel: see the module documentation.
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

/// How many bytes at most [`MemoryAccess::warm`](super::MemoryAccess::warm) brings in: the
/// start of a receive buffer, where a small message (and every message's header) lands.
pub(crate) const WARM_MAX: u64 = 256;

/// Ask the CPU to bring the cache lines of `[p, p+len)` in. Any address is fine: a prefetch
/// is a hint, never faults (an unmapped page is simply not fetched) and changes no memory, so
/// raw memory that may vanish needs no care.
#[inline]
pub(crate) fn prefetch_lines(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut off = 0;
        while off < len {
            let line = p.wrapping_add(off).cast::<i8>();
            // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault, whatever
            // the address; SSE (which has it) is part of the x86-64 baseline.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(line)
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
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

/// Bytes [`read_shared`] copies at a time: its stack buffer, which stays in the L1 cache. A
/// packet's payload (at most a 4 KiB MTU) so goes to `f` in one piece.
pub(crate) const SHARED_CHUNK: usize = 4096;

/// Hand the `len` bytes at `src` to `f`, in order, in pieces of at most [`SHARED_CHUNK`]
/// bytes copied into a buffer of ours: for bytes that another thread (the application, or a
/// placement of the engine) may write while they are read, such as a lent payload being
/// checksummed.
///
/// No reference to the bytes is formed (a `&[u8]` over them would claim they do not change
/// while it lives), and they are read as a byte-wise atomic copy ([`load_shared`]): a byte
/// written meanwhile comes out old or new.
///
/// # Safety
/// `src..src+len` must stay valid for reads during the call (a validated range of a live
/// region whose memory the engine keeps mapped, `Plain`).
#[inline]
pub(crate) unsafe fn read_shared(src: *const u8, len: usize, mut f: impl FnMut(&[u8])) {
    let mut buf = [0u8; SHARED_CHUNK];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(SHARED_CHUNK);
        // SAFETY: bytes `done..done+n` of the caller's range.
        unsafe { load_shared(src.wrapping_add(done), &mut buf[..n]) };
        f(&buf[..n]);
        done += n;
    }
}

/// Fill `out` from the bytes at `src`, which other threads may be writing: a copy whose every
/// byte is read by an atomic load (the byte-wise atomic `memcpy` of the C++ proposal P1478,
/// which Rust does not have yet).
///
/// On x86-64 the copy is one `rep movsb` in inline assembly: the architecture defines it as a
/// sequence of single-byte moves, each load of a byte atomic, and the compiler cannot see into
/// assembly, so it is exactly such a copy, at the speed of `memcpy`. Elsewhere it is
/// `load_atomic`, relaxed 8-byte loads, which cost twice as much on 64 KiB WRITE bandwidth
/// (0.88–0.90 of the bandwidth of checksumming in place, against 0.93–0.95; docs/SECURITY.md).
///
/// # Safety
/// `src..src+out.len()` must be valid for reads.
#[inline]
unsafe fn load_shared(src: *const u8, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rep movsb` copies `rcx` bytes from `rsi` to `rdi`, upwards (the direction flag
    // is clear on entry to an asm block): from the caller's readable range to `out`, a buffer
    // of ours of that length that nothing else reaches. It touches no other memory and no
    // stack, and leaves the flags alone.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") out.len() => _,
            inout("rsi") src => _,
            inout("rdi") out.as_mut_ptr() => _,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        load_atomic(src, out)
    };
}

/// [`load_shared`] with Rust's atomics: relaxed 8-byte loads from the first 8-byte boundary,
/// single bytes before it and after the last whole word.
///
/// # Safety
/// `src..src+out.len()` must be valid for reads.
#[cfg(any(test, not(target_arch = "x86_64")))]
unsafe fn load_atomic(src: *const u8, out: &mut [u8]) {
    const WORD: usize = core::mem::size_of::<u64>();
    // `AtomicU64` may need more alignment than `u64`; it needs no more than its size.
    const _: () = assert!(core::mem::align_of::<AtomicU64>() <= WORD);
    let len = out.len();
    let head = ((WORD - src.addr() % WORD) % WORD).min(len);
    let (first, rest) = out.split_at_mut(head);
    // SAFETY: the first `head` bytes of the caller's range.
    unsafe { load_bytes(src, first) };
    let at = src.wrapping_add(head).cast::<u64>();
    let mut words = rest.chunks_exact_mut(WORD);
    for (i, o) in (&mut words).enumerate() {
        // SAFETY: `at + i` is 8-byte aligned (`head` reached the boundary) and its 8 bytes lie
        // in the caller's readable range; only loads are made through it (relaxed loads of 8
        // bytes are allowed even on read-only memory).
        let v =
            unsafe { AtomicU64::from_ptr(at.wrapping_add(i).cast_mut()) }.load(Ordering::Relaxed);
        o.copy_from_slice(&v.to_ne_bytes());
    }
    let last = words.into_remainder();
    // SAFETY: the last `last.len()` bytes of the caller's range.
    unsafe { load_bytes(src.wrapping_add(len - last.len()), last) };
}

/// Fill `out` from the bytes at `src` with relaxed single-byte atomic loads.
///
/// # Safety
/// `src..src+out.len()` must be valid for reads.
#[cfg(any(test, not(target_arch = "x86_64")))]
unsafe fn load_bytes(src: *const u8, out: &mut [u8]) {
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: `src + i` is readable per the contract; `AtomicU8` needs no alignment; only
        // loads are made through it.
        let b = unsafe { core::sync::atomic::AtomicU8::from_ptr(src.wrapping_add(i).cast_mut()) };
        *o = b.load(Ordering::Relaxed);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_copies_within_itself() {
        // The parent caches its pid.
        assert_eq!(own_pid(), std::process::id() as libc::pid_t);
        let src = [7u8; 16];
        // SAFETY: the child only calls async-signal-safe functions (getpid,
        // process_vm_readv, _exit) and atomics before `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let mut dst = [0u8; 16];
            // SAFETY: both buffers are live locals of 16 bytes.
            let copied = unsafe { vm_copy(src.as_ptr(), dst.as_mut_ptr(), 16, false) };
            // SAFETY: getpid has no preconditions.
            let ok = own_pid() == unsafe { libc::getpid() } && copied.is_ok() && dst == src;
            // SAFETY: ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(r, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status:#x}"
        );
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// Lengths around the word and the chunk.
    fn lengths() -> impl Iterator<Item = usize> + Clone {
        let c = SHARED_CHUNK;
        let small = [0, 1, 7, 8, 9, 15, 16, 17, 1000];
        small
            .into_iter()
            .chain([c - 1, c, c + 1, c + 9, 2 * c, 3 * c + 5])
    }

    #[test]
    fn read_shared_hands_over_every_byte_in_order_at_any_alignment() {
        let src = pattern(3 * SHARED_CHUNK + 64);
        for off in 0..16 {
            for len in lengths() {
                let (mut out, mut pieces) = (Vec::new(), Vec::new());
                // SAFETY: a range of a live slice.
                unsafe {
                    read_shared(src.as_ptr().wrapping_add(off), len, |b| {
                        out.extend_from_slice(b);
                        pieces.push(b.len());
                    })
                };
                assert_eq!(out, &src[off..off + len], "off {off} len {len}");
                assert_eq!(pieces.len(), len.div_ceil(SHARED_CHUNK), "{pieces:?}");
                assert!(pieces.iter().all(|&n| n > 0 && n <= SHARED_CHUNK));
            }
        }
    }

    #[test]
    fn both_forms_of_the_atomic_copy_copy_every_byte() {
        let src = pattern(SHARED_CHUNK + 64);
        for off in 0..16 {
            for len in lengths().filter(|&l| l <= SHARED_CHUNK) {
                let mut a = vec![0u8; len];
                let mut b = vec![0u8; len];
                let from = src.as_ptr().wrapping_add(off);
                // SAFETY: ranges of a live slice.
                unsafe {
                    load_shared(from, &mut a);
                    load_atomic(from, &mut b);
                }
                assert_eq!(a, &src[off..off + len], "off {off} len {len}");
                assert_eq!(b, &src[off..off + len], "off {off} len {len}");
            }
        }
    }

    #[test]
    fn bytes_written_meanwhile_come_out_old_or_new() {
        // A writer flips whole words between two patterns while they are read: each byte read
        // is one pattern's or the other's, and the portable form keeps each word whole.
        use std::time::{Duration, Instant};
        let words: Vec<AtomicU64> = (0..4096).map(|_| AtomicU64::new(0)).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let flips = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(5) {
                    v = !v;
                    for w in &words {
                        w.store(v, Ordering::Relaxed);
                    }
                    flips.fetch_add(1, Ordering::Relaxed);
                }
            });
            let start = Instant::now();
            while flips.load(Ordering::Relaxed) == 0 && start.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            let from = words.as_ptr().cast::<u8>();
            let mut out = vec![0u8; words.len() * 8];
            for _ in 0..100 {
                // SAFETY: the words live for the scope.
                unsafe { load_shared(from, &mut out) };
                assert!(out.iter().all(|&b| b == 0 || b == 0xff));
                // SAFETY: as above.
                unsafe { load_atomic(from, &mut out) };
                for w in out.chunks_exact(8) {
                    let v = u64::from_ne_bytes(w.try_into().unwrap());
                    assert!(v == 0 || v == u64::MAX, "{v:#x}");
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
