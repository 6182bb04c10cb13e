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
//! chaining to ours: then faults in our copies would reach it instead. Communication
//! libraries do exactly that: UCX (`UCX_ERROR_SIGNALS`) and Open MPI (`opal_signal`) install
//! handlers that print a backtrace, after the device opened. Every registration of raw
//! memory therefore checks that the handler is still ours (one `sigaction` query); when it
//! is not, ours is put back in front of the new one, which becomes the handler ours calls
//! for every fault that is not its own: the program's handler sees exactly the faults it saw
//! before. A program that keeps replacing it (more than [`REINSTALLS`] times) wins: caught
//! copies stop for good and raw memory goes through the kernel's copies again. Programs
//! that own these signals can choose the kernel's copies from the start
//! ([`RawCopy::Kernel`](super::RawCopy)).
//!
//! Until the next registration puts ours back, a fault in a caught copy would reach the
//! program's handler; the window is the time between the program installing its handler
//! and its next registration of raw memory, during which raw memory is touched only if it is
//! already registered and its pages vanish.
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

/// How many times the handler is put back in front of a program's (see the module
/// documentation) before caught copies stop for good.
pub(crate) const REINSTALLS: usize = 15;

/// Check that the handler is still the one installed for `SIGSEGV` and `SIGBUS`; if a
/// program replaced it, put ours back in front of the program's (up to [`REINSTALLS`] times;
/// then disarm caught copies for good: raw memory goes through the kernel's copies). Returns
/// whether caught copies are (still) in use.
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
    use super::{ARMED, Faulted, Ordering, REINSTALLS};
    use std::cell::UnsafeCell;
    use std::mem::MaybeUninit;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Mutex, OnceLock};

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

    /// The disposition the handler passes foreign faults of one signal to: the one found when
    /// it was installed, then the one of each program that replaced it (see
    /// [`Previous::publish`]). A slot is written once, before it is published, and never
    /// again, so the handler reads it without a lock.
    struct Previous {
        slots: [UnsafeCell<MaybeUninit<libc::sigaction>>; REINSTALLS + 1],
        /// 1 + the index of the published slot (0: none yet).
        current: AtomicUsize,
    }

    // SAFETY: slots are written only under `PUBLISH` and only before `current` publishes
    // them (Release; read with Acquire), never after: a published slot is immutable.
    unsafe impl Sync for Previous {}

    impl Previous {
        const fn new() -> Previous {
            Previous {
                slots: [const { UnsafeCell::new(MaybeUninit::uninit()) }; REINSTALLS + 1],
                current: AtomicUsize::new(0),
            }
        }

        /// The disposition published last (async-signal-safe: two loads).
        fn get(&self) -> Option<&libc::sigaction> {
            let i = self.current.load(Ordering::Acquire);
            let slot = self.slots.get(i.checked_sub(1)?)?;
            // SAFETY: slot `i - 1` was written before `current` published it and is never
            // written again.
            Some(unsafe { (*slot.get()).assume_init_ref() })
        }

        /// Make `act` the disposition foreign faults go to. False when the slots are used
        /// up. Called with `PUBLISH` held.
        fn publish(&self, act: &libc::sigaction) -> bool {
            let next = self.current.load(Ordering::Relaxed);
            let Some(slot) = self.slots.get(next) else {
                return false;
            };
            // SAFETY: slot `next` is not published (only slots below `current` are), and
            // writers hold `PUBLISH`.
            unsafe { (*slot.get()).write(*act) };
            self.current.store(next + 1, Ordering::Release);
            true
        }
    }

    /// The dispositions foreign faults go to (`SIGSEGV`, `SIGBUS`).
    static PREVIOUS: [Previous; 2] = [Previous::new(), Previous::new()];
    /// Serialises installing and reinstalling the handler.
    static PUBLISH: Mutex<()> = Mutex::new(());
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
        if prev.sa_flags & libc::SA_RESETHAND != 0 && h != libc::SIG_DFL && h != libc::SIG_IGN {
            // A one-shot handler: the kernel would have reset the disposition before calling
            // it.
            restore_default(sig);
        }
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
        let _g = PUBLISH.lock().unwrap_or_else(|e| e.into_inner());
        SIGNALS
            .into_iter()
            .enumerate()
            .all(|(slot, sig)| install_one(slot, sig))
            && still_installed()
    }

    /// Put the handler in front of `sig`'s current disposition, which foreign faults then go
    /// to. False when that failed or the slots are used up. Called with `PUBLISH` held.
    fn install_one(slot: usize, sig: libc::c_int) -> bool {
        let Some(cur) = disposition(sig) else {
            return false;
        };
        if cur.sa_sigaction == handler_address() {
            return true;
        }
        // Published first, so that a foreign fault meanwhile finds its handler.
        if !PREVIOUS[slot].publish(&cur) {
            return false;
        }
        // SAFETY: installs a handler that only reads and writes the interrupted context and
        // otherwise calls the previous disposition; the structs are fully initialised (`old`
        // is written by the kernel).
        let (rc, old) = unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = handler_address();
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(sig, &new, &mut old), old)
        };
        if rc != 0 {
            return false;
        }
        // Another thread installed its handler between the read and the swap: that one is
        // the previous disposition.
        old.sa_sigaction == cur.sa_sigaction || PREVIOUS[slot].publish(&old)
    }

    /// The current disposition of `sig`.
    fn disposition(sig: libc::c_int) -> Option<libc::sigaction> {
        // SAFETY: sigaction with a null new action only reads the current one into a zeroed
        // struct.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(sig, std::ptr::null(), &mut cur) == 0).then_some(cur)
        }
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
        SIGNALS
            .into_iter()
            .all(|sig| disposition(sig).is_some_and(|cur| cur.sa_sigaction == handler_address()))
    }

    pub(super) fn still_armed() -> bool {
        if !super::armed() {
            return false;
        }
        if still_installed() {
            return true;
        }
        let _g = PUBLISH.lock().unwrap_or_else(|e| e.into_inner());
        if SIGNALS
            .into_iter()
            .enumerate()
            .all(|(slot, sig)| install_one(slot, sig))
            && still_installed()
        {
            tracing::debug!(
                "a SIGSEGV/SIGBUS handler installed after softrdma's now runs behind it"
            );
            return true;
        }
        ARMED.store(false, Ordering::Relaxed);
        tracing::warn!(
            "the SIGSEGV/SIGBUS handler of softrdma was replaced too often: raw memory is \
             copied by the kernel from now on"
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
mod tests;
