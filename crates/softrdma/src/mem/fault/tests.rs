//! The caught copies and the fault handler, tested (the handler cases in child processes).

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

/// Run the test `name` of this binary in a child process with `var` set (the child runs the
/// test's body that faults or installs handlers, which this process must not do).
fn in_child(name: &str, var: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("mem::fault::tests::{name}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(var, "1")
        .output()
        .unwrap()
}

/// A signal handler that takes the fault's details.
type SigInfoHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Install `handler` for `sig` with `flags` (SA_SIGINFO among them), replacing whatever is
/// installed.
fn install_siginfo(sig: libc::c_int, handler: SigInfoHandler, flags: libc::c_int) {
    // SAFETY: a zeroed sigaction is valid; it is filled with a live handler and an empty mask
    // before the kernel reads it.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler as libc::sighandler_t;
        act.sa_flags = flags;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(sig, &act, std::ptr::null_mut()), 0);
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
    let out = in_child("a_foreign_fault_reaches_the_previous_handler", CHILD);
    assert_eq!(out.status.code(), Some(42), "{out:?}");
}

/// A handler a program installs after softrdma's ends up behind it at the next check:
/// caught copies go on, and a foreign fault reaches the program's handler.
#[test]
fn a_handler_installed_later_runs_behind_ours() {
    const CHILD: &str = "SOFTRDMA_FAULT_LATER_CHILD";
    if std::env::var_os(CHILD).is_some() {
        extern "C" fn later(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            // SAFETY: ends the process at once (async-signal-safe).
            unsafe { libc::_exit(43) };
        }
        assert!(arm() && still_armed());
        // An SA_SIGINFO handler for SIGSEGV, replacing softrdma's.
        install_siginfo(libc::SIGSEGV, later, libc::SA_SIGINFO);
        assert!(still_armed(), "the handler was not put back");
        assert!(armed());
        // A caught fault still comes back as an error, not to `later`...
        // SAFETY: the null page faults and is caught.
        assert!(unsafe { copy(std::ptr::null_mut(), [1u8].as_ptr(), 1) }.is_err());
        // SAFETY: as above, for an atomic.
        assert!(unsafe { fetch_add(std::ptr::null_mut(), 1) }.is_err());
        // ...and a foreign one goes to `later`.
        // SAFETY: deliberately faults outside the caught routines.
        unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1) };
        std::process::exit(1);
    }
    let out = in_child("a_handler_installed_later_runs_behind_ours", CHILD);
    assert_eq!(out.status.code(), Some(43), "{out:?}");
}

/// A one-shot (`SA_RESETHAND`) handler behind ours runs once, as the kernel would run it:
/// the disposition is the default again when it returns, and the fault, met again, ends
/// the process.
#[test]
fn a_one_shot_handler_behind_ours_runs_once() {
    const CHILD: &str = "SOFTRDMA_FAULT_ONESHOT_CHILD";
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    if std::env::var_os(CHILD).is_some() {
        extern "C" fn once(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            if CALLS.fetch_add(1, Ordering::Relaxed) > 0 {
                // SAFETY: ends the process at once (async-signal-safe): called twice.
                unsafe { libc::_exit(9) };
            }
            let msg = b"once\n";
            // SAFETY: writes a live buffer to standard error (async-signal-safe).
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        }
        assert!(arm() && still_armed());
        // A one-shot SA_SIGINFO handler for SIGSEGV, replacing ours.
        install_siginfo(libc::SIGSEGV, once, libc::SA_SIGINFO | libc::SA_RESETHAND);
        assert!(still_armed(), "the handler was not put back");
        // SAFETY: the null page faults and is caught: the one-shot handler is not used up.
        assert!(unsafe { copy(std::ptr::null_mut(), [1u8].as_ptr(), 1) }.is_err());
        // SAFETY: deliberately faults outside the caught routines, twice over: `once`
        // returns and the store runs again.
        unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1) };
        std::process::exit(1);
    }
    let out = in_child("a_one_shot_handler_behind_ours_runs_once", CHILD);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("once").count(), 1, "{out:?}");
}

/// A program that keeps replacing the handler wins: after REINSTALLS times, caught copies
/// stop for good.
#[test]
fn a_handler_replaced_too_often_disarms_caught_copies() {
    const CHILD: &str = "SOFTRDMA_FAULT_REPLACED_CHILD";
    if std::env::var_os(CHILD).is_some() {
        assert!(arm() && still_armed());
        let mut kept = 0;
        for _ in 0..REINSTALLS + 2 {
            // SAFETY: installs the default disposition for SIGBUS.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
            if !still_armed() {
                break;
            }
            kept += 1;
        }
        // The first install took one slot; each reinstall one more.
        assert_eq!(kept, REINSTALLS, "reinstalls before giving up");
        assert!(!armed());
        assert!(!still_armed());
        std::process::exit(7);
    }
    let out = in_child("a_handler_replaced_too_often_disarms_caught_copies", CHILD);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
}
