//! Caught copies: touching raw memory that may vanish without a system call.
//!
//! A raw region's pages may be unmapped by the application at any moment, and the watcher
//! hears of it only afterwards, so a plain `memcpy` into or out of them could raise `SIGSEGV`
//! (or `SIGBUS` for a truncated file). The kernel's copies (`process_vm_readv`/`writev`) fail
//! with `EFAULT` instead, at the price of a system call per access, which on a virtual
//! machine costs more than the packet it serves (docs/PERFORMANCE.md, "Placement into raw
//! memory that may vanish").
//!
//! A *caught* copy is a few instructions of assembly (`rep movsb`, `lock xadd`,
//! `lock cmpxchg`) between two labels, and a `SIGSEGV`/`SIGBUS` handler that, when the
//! faulting instruction lies between those labels, moves the thread to a fix-up that returns
//! "faulted" from the routine: no stack is unwound, no Rust frame is crossed (the routines are
//! leaf functions that touch no stack), and the caller sees an error exactly as from the
//! kernel's copies. A fault anywhere else is not ours: the handler calls the handler that was
//! installed before it (with the same arguments), or, when that was the default action or
//! "ignore", puts it back and returns, so that the instruction faults again and the process
//! ends as it would have without softrdma (with its core dump).
//!
//! The handler is installed when the first memory table that copies raw memory with checks
//! is made, and checked once the probe of a real fault (a page with no access) came back as
//! an error. A program (or runtime, or sanitizer) may later install its own handler without
//! chaining to ours: then faults in our copies would reach it instead. Every registration of
//! raw memory therefore checks that the handler is still ours (one `sigaction` query); when
//! it is not, caught copies stop for good and raw memory goes through the kernel's copies
//! again. Programs that own these signals can choose the kernel's copies from the start
//! ([`RawCopy::Kernel`](super::RawCopy)).
//!
//! Only x86-64 Linux has the routines; elsewhere [`armed`] is false and the kernel copies.

use std::sync::atomic::{AtomicBool, Ordering};

use super::copy::Faulted;

/// Whether caught copies are in use.
static ARMED: AtomicBool = AtomicBool::new(false);

/// Caught copies are in use: the handler is installed, passed its probe, and was still ours
/// at the last registration of raw memory.
#[inline]
pub(crate) fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// Install the handler (once per process) and arm caught copies if its probe passes. Returns
/// whether caught copies are in use.
pub(crate) fn arm() -> bool {
    imp::arm()
}

/// Check that the handler is still the one installed for `SIGSEGV` and `SIGBUS`; if a
/// program replaced it, disarm caught copies for good (raw memory then goes through the
/// kernel's copies). Returns whether caught copies are (still) in use.
pub(crate) fn still_armed() -> bool {
    imp::still_armed()
}

/// Copy `len` bytes from `src` to `dst`; `Err` when either side faulted (some bytes may have
/// been copied).
///
/// # Safety
/// Caught copies must be [`armed`]. Each side must be memory of this process that is either
/// valid for the access or may fault (a page unmapped, protected or truncated): never memory
/// that another part of the program relies on not being written (for `dst`).
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Faulted> {
    // SAFETY: forwarded from the caller.
    unsafe { imp::copy(dst, src, len) }
}

/// Fetch-and-add on the 8 bytes at `p` (a CPU atomic); returns the original value.
///
/// # Safety
/// As [`copy`]; `p` 8-byte aligned.
#[inline]
pub(crate) unsafe fn fetch_add(p: *mut u64, add: u64) -> Result<u64, Faulted> {
    // SAFETY: forwarded from the caller.
    unsafe { imp::fetch_add(p, add) }
}

/// Compare-and-swap on the 8 bytes at `p` (a CPU atomic, which writes even when the compare
/// fails, so a read-only page refuses it either way); returns the original value.
///
/// # Safety
/// As [`fetch_add`].
#[inline]
pub(crate) unsafe fn compare_swap(p: *mut u64, compare: u64, swap: u64) -> Result<u64, Faulted> {
    // SAFETY: forwarded from the caller.
    unsafe { imp::compare_swap(p, compare, swap) }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use super::{ARMED, Faulted, Ordering};
    use std::sync::OnceLock;

    // The routines (System V ABI: arguments in rdi, rsi, rdx, rcx; result in eax). Every
    // instruction that touches caller-given memory lies in [begin, end); they are leaf
    // functions that never move the stack pointer, so the fix-up (after `end`) can return
    // for any of them.
    core::arch::global_asm!(
        ".pushsection .text.softrdma_caught,\"ax\",@progbits",
        ".p2align 4",
        ".globl softrdma_caught_begin",
        ".hidden softrdma_caught_begin",
        "softrdma_caught_begin:",
        // copy(dst, src, len) -> 0
        ".globl softrdma_caught_copy",
        ".hidden softrdma_caught_copy",
        "softrdma_caught_copy:",
        "mov rcx, rdx",
        "rep movsb",
        "xor eax, eax",
        "ret",
        // fetch_add(p, add, out) -> 0; *out = original
        ".globl softrdma_caught_fetch_add",
        ".hidden softrdma_caught_fetch_add",
        "softrdma_caught_fetch_add:",
        "lock xadd qword ptr [rdi], rsi",
        "mov qword ptr [rdx], rsi",
        "xor eax, eax",
        "ret",
        // compare_swap(p, compare, swap, out) -> 0; *out = original
        ".globl softrdma_caught_compare_swap",
        ".hidden softrdma_caught_compare_swap",
        "softrdma_caught_compare_swap:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "mov qword ptr [rcx], rax",
        "xor eax, eax",
        "ret",
        ".globl softrdma_caught_end",
        ".hidden softrdma_caught_end",
        "softrdma_caught_end:",
        // Where a fault between the labels resumes: the routine returns 1.
        ".globl softrdma_caught_fixup",
        ".hidden softrdma_caught_fixup",
        "softrdma_caught_fixup:",
        "mov eax, 1",
        "ret",
        ".popsection",
    );

    unsafe extern "C" {
        fn softrdma_caught_copy(dst: *mut u8, src: *const u8, len: usize) -> u32;
        fn softrdma_caught_fetch_add(p: *mut u64, add: u64, out: *mut u64) -> u32;
        fn softrdma_caught_compare_swap(p: *mut u64, compare: u64, swap: u64, out: *mut u64)
        -> u32;
        static softrdma_caught_begin: u8;
        static softrdma_caught_end: u8;
        static softrdma_caught_fixup: u8;
    }

    /// The dispositions found when the handler was installed (`SIGSEGV`, `SIGBUS`).
    static PREVIOUS: [OnceLock<libc::sigaction>; 2] = [OnceLock::new(), OnceLock::new()];
    /// Whether the handler is installed and passed its probe (decided once).
    static INSTALLED: OnceLock<bool> = OnceLock::new();

    const SIGNALS: [libc::c_int; 2] = [libc::SIGSEGV, libc::SIGBUS];

    fn handler_address() -> libc::sighandler_t {
        on_fault as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as libc::sighandler_t
    }

    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let begin = (&raw const softrdma_caught_begin) as usize;
        let end = (&raw const softrdma_caught_end) as usize;
        let fixup = (&raw const softrdma_caught_fixup) as usize;
        let uc = ctx.cast::<libc::ucontext_t>();
        if !uc.is_null() {
            // SAFETY: the kernel passes the interrupted thread's context to an SA_SIGINFO
            // handler; its general registers are read and the instruction pointer changed,
            // which the kernel restores when the handler returns.
            let rip = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] };
            let pc = *rip as usize;
            if (begin..end).contains(&pc) {
                *rip = fixup as libc::greg_t;
                return;
            }
        }
        // Not one of ours.
        let slot = usize::from(sig == libc::SIGBUS);
        let Some(prev) = PREVIOUS[slot].get() else {
            restore_default(sig);
            return;
        };
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Put the old disposition back and let the instruction fault again: the process
            // ends as it would have without softrdma.
            ARMED.store(false, Ordering::Relaxed);
            // SAFETY: sigaction is async-signal-safe; `prev` is a disposition the kernel gave.
            unsafe { libc::sigaction(sig, prev, std::ptr::null_mut()) };
            return;
        }
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: an SA_SIGINFO handler installed before ours, called as the kernel would
            // have called it.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        } else {
            // SAFETY: a plain handler installed before ours, called as the kernel would have.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }

    fn restore_default(sig: libc::c_int) {
        ARMED.store(false, Ordering::Relaxed);
        // SAFETY: resets the disposition to the default (async-signal-safe).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }

    pub(super) fn arm() -> bool {
        let ok = *INSTALLED.get_or_init(|| install() && probe());
        if ok && still_installed() {
            ARMED.store(true, Ordering::Relaxed);
        }
        super::armed()
    }

    fn install() -> bool {
        for (slot, sig) in SIGNALS.into_iter().enumerate() {
            // SAFETY: sigaction with a null new action only reads the current one into a
            // zeroed struct.
            let cur = unsafe {
                let mut cur: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 {
                    return false;
                }
                cur
            };
            let _ = PREVIOUS[slot].set(cur);
            // SAFETY: installs a handler that only reads and writes the interrupted context
            // and otherwise calls the previous disposition; the struct is fully initialised.
            let rc = unsafe {
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler_address();
                new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut new.sa_mask);
                libc::sigaction(sig, &new, std::ptr::null_mut())
            };
            if rc != 0 {
                return false;
            }
        }
        still_installed()
    }

    /// A real fault, caught: a page with no access, read, written and added to.
    fn probe() -> bool {
        // SAFETY: maps one fresh page with no access (ours alone), unmapped below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            return false;
        }
        let mut buf = [0u8; 8];
        let mut out = 0u64;
        // SAFETY: the page is ours and inaccessible: each access faults and is caught (the
        // handler was checked to be installed); `buf` and `out` are live locals.
        let faulted = unsafe {
            softrdma_caught_copy(buf.as_mut_ptr(), page.cast(), 8) == 1
                && softrdma_caught_copy(page.cast(), buf.as_ptr(), 8) == 1
                && softrdma_caught_fetch_add(page.cast(), 1, &mut out) == 1
                && softrdma_caught_compare_swap(page.cast(), 0, 1, &mut out) == 1
        };
        // SAFETY: unmaps the page mapped above.
        unsafe { libc::munmap(page, 4096) };
        faulted
    }

    /// Whether our handler is the disposition of both signals.
    fn still_installed() -> bool {
        SIGNALS.into_iter().all(|sig| {
            // SAFETY: as in `install`: only reads the current disposition.
            unsafe {
                let mut cur: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut cur) == 0
                    && cur.sa_sigaction == handler_address()
            }
        })
    }

    pub(super) fn still_armed() -> bool {
        if !super::armed() {
            return false;
        }
        if still_installed() {
            return true;
        }
        ARMED.store(false, Ordering::Relaxed);
        tracing::warn!(
            "the SIGSEGV/SIGBUS handler of softrdma was replaced: raw memory is copied by \
             the kernel from now on"
        );
        false
    }

    #[inline]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Faulted> {
        // SAFETY: per the caller, each side is valid or faults, and faults are caught.
        match unsafe { softrdma_caught_copy(dst, src, len) } {
            0 => Ok(()),
            _ => Err(Faulted),
        }
    }

    #[inline]
    pub(super) unsafe fn fetch_add(p: *mut u64, add: u64) -> Result<u64, Faulted> {
        let mut out = 0u64;
        // SAFETY: as in `copy`; `out` is a live local.
        match unsafe { softrdma_caught_fetch_add(p, add, &mut out) } {
            0 => Ok(out),
            _ => Err(Faulted),
        }
    }

    #[inline]
    pub(super) unsafe fn compare_swap(
        p: *mut u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, Faulted> {
        let mut out = 0u64;
        // SAFETY: as in `copy`; `out` is a live local.
        match unsafe { softrdma_caught_compare_swap(p, compare, swap, &mut out) } {
            0 => Ok(out),
            _ => Err(Faulted),
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use super::Faulted;

    pub(super) fn arm() -> bool {
        false
    }

    pub(super) fn still_armed() -> bool {
        false
    }

    pub(super) unsafe fn copy(_: *mut u8, _: *const u8, _: usize) -> Result<(), Faulted> {
        Err(Faulted)
    }

    pub(super) unsafe fn fetch_add(_: *mut u64, _: u64) -> Result<u64, Faulted> {
        Err(Faulted)
    }

    pub(super) unsafe fn compare_swap(_: *mut u64, _: u64, _: u64) -> Result<u64, Faulted> {
        Err(Faulted)
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// A mapping of `pages` pages, the first `readable` of them read-write, then read-only
    /// ones, then inaccessible ones (`ro` and `none` pages each).
    struct Map {
        base: *mut u8,
        len: usize,
    }

    impl Map {
        fn new(rw: usize, ro: usize, none: usize) -> Map {
            let len = (rw + ro + none) * 4096;
            // SAFETY: a fresh private mapping of ours.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED);
            let base = base.cast::<u8>();
            // SAFETY: protects pages of the mapping above.
            unsafe {
                if ro > 0 {
                    libc::mprotect(base.add(rw * 4096).cast(), ro * 4096, libc::PROT_READ);
                }
                if none > 0 {
                    libc::mprotect(
                        base.add((rw + ro) * 4096).cast(),
                        none * 4096,
                        libc::PROT_NONE,
                    );
                }
            }
            Map { base, len }
        }
    }

    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: unmaps the mapping made in `new`.
            unsafe { libc::munmap(self.base.cast(), self.len) };
        }
    }

    #[test]
    fn caught_copies_move_bytes_and_fail_on_vanished_pages() {
        assert!(arm(), "caught copies are not available");
        let m = Map::new(1, 1, 1);
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        for (off, len) in [(0, 0), (0, 1), (3, 17), (0, 4096), (100, 3000)] {
            let mut back = vec![0u8; len];
            // SAFETY: `off + len` bytes of the read-write page; `src` and `back` are live.
            unsafe {
                copy(m.base.add(off), src.as_ptr(), len).unwrap();
                copy(back.as_mut_ptr(), m.base.add(off), len).unwrap();
            }
            assert_eq!(back, src[..len]);
        }
        let mut buf = vec![0u8; 8192];
        // SAFETY: each access covers pages of `m` that fault (read-only for writes, no
        // access for everything) or are valid; the buffers are live.
        unsafe {
            // Reads from the read-only page work; writes to it fault.
            copy(buf.as_mut_ptr(), m.base.add(4096), 4096).unwrap();
            assert!(copy(m.base.add(4096), src.as_ptr(), 1).is_err());
            // Crossing from a valid page into an inaccessible one faults.
            assert!(copy(buf.as_mut_ptr(), m.base.add(4096 + 4000), 200).is_err());
            assert!(copy(m.base.add(8192), src.as_ptr(), 8).is_err());
        }
    }

    #[test]
    fn caught_atomics_work_and_fail_on_protected_pages() {
        assert!(arm());
        let m = Map::new(1, 1, 1);
        let p = m.base.cast::<u64>();
        // SAFETY: aligned words of `m`'s pages: the first read-write, the others faulting for
        // a locked write.
        unsafe {
            assert_eq!(fetch_add(p, 5), Ok(0));
            assert_eq!(fetch_add(p, 2), Ok(5));
            assert_eq!(compare_swap(p, 7, 40), Ok(7));
            assert_eq!(compare_swap(p, 7, 50), Ok(40));
            assert_eq!(*p, 40);
            let ro = m.base.add(4096).cast::<u64>();
            let none = m.base.add(8192).cast::<u64>();
            assert!(fetch_add(ro, 1).is_err());
            // A failed compare still writes: a read-only word refuses it.
            assert!(compare_swap(ro, 1, 2).is_err());
            assert!(fetch_add(none, 1).is_err());
            assert!(compare_swap(none, 0, 1).is_err());
        }
    }

    /// A fault that is not one of ours reaches the handler installed before softrdma's. Run
    /// in a child process of the test binary, which installs its handler first.
    #[test]
    fn a_foreign_fault_reaches_the_previous_handler() {
        const CHILD: &str = "SOFTRDMA_FAULT_CHAIN_CHILD";
        if std::env::var_os(CHILD).is_some() {
            extern "C" fn mine(_: libc::c_int) {
                // SAFETY: ends the process at once (async-signal-safe).
                unsafe { libc::_exit(42) };
            }
            // SAFETY: installs a plain handler for SIGSEGV.
            unsafe { libc::signal(libc::SIGSEGV, mine as extern "C" fn(libc::c_int) as usize) };
            assert!(arm());
            // A caught fault still comes back as an error...
            // SAFETY: the null page faults and is caught.
            assert!(unsafe { copy(std::ptr::null_mut(), [1u8].as_ptr(), 1) }.is_err());
            // ...and a foreign one goes to `mine`.
            // SAFETY: deliberately faults outside the caught routines.
            unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1) };
            std::process::exit(1);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "mem::fault::tests::a_foreign_fault_reaches_the_previous_handler",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(42), "{out:?}");
    }

    /// A program that replaces the handler turns caught copies off at the next check.
    #[test]
    fn a_replaced_handler_disarms_caught_copies() {
        const CHILD: &str = "SOFTRDMA_FAULT_REPLACED_CHILD";
        if std::env::var_os(CHILD).is_some() {
            assert!(arm() && still_armed());
            // SAFETY: installs the default disposition for SIGBUS.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
            assert!(!still_armed());
            assert!(!armed());
            std::process::exit(7);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "mem::fault::tests::a_replaced_handler_disarms_caught_copies",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(7), "{out:?}");
    }
}
