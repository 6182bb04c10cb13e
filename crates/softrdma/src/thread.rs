//! The library's own threads (the engine, the watcher, the connection manager) start here:
//! named, and with the asynchronous signals blocked, so that a signal meant for the
//! application (an alarm that ends a benchmark loop, SIGINT, SIGCHLD...) is delivered to one
//! of the application's threads, where it interrupts the call that thread waits in, and never
//! to a thread of the library.

use std::cell::Cell;
use std::io;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Signals a thread receives for what it does itself (faults, aborts): never blocked.
const SYNCHRONOUS: [libc::c_int; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGSYS,
];

/// Block every asynchronous signal in the calling thread.
fn block_async_signals() {
    // SAFETY: a sigset_t filled and edited by libc's own functions, then installed for this
    // thread only; the old mask is not needed.
    unsafe {
        let mut set: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in SYNCHRONOUS {
            libc::sigdelset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, core::ptr::null_mut());
    }
}

thread_local! {
    /// Touched by every library thread as it starts (`settle`).
    static STARTED: Cell<bool> = const { Cell::new(false) };
}

/// A new thread's first steps that run libc's memory-mapping code: its first allocation
/// (glibc gives a new thread an arena of its own: an `mmap`, then `munmap` of what lies
/// outside the alignment) and this library's dynamic TLS block (allocated at the first use
/// of a thread-local in a library loaded with `dlopen`).
fn settle() {
    STARTED.with(|s| s.set(true));
    drop(std::hint::black_box(Vec::<u8>::with_capacity(64)));
    #[cfg(test)]
    tests::SETTLED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(std::thread::current().id());
}

/// How long `spawn` waits for the new thread to settle before it returns anyway.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// Start a library thread named `name` running `f`, with the asynchronous signals blocked.
/// It returns once the thread has made its first allocation and used its thread-locals
/// (`settle`), so that those steps never overlap with what the caller does next. UCX, for
/// one, opens the device (starting the engine thread) and then rewrites the code of libc's
/// `mmap` and `munmap` to hook them; a thread inside `munmap` while it is being rewritten
/// dies of SIGSEGV (Open MPI ranks over UCX did, at start).
pub(crate) fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    let (ready, settled) = mpsc::sync_channel::<()>(1);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            block_async_signals();
            settle();
            let _ = ready.send(());
            drop(ready);
            f()
        })?;
    // A thread that never signals (it cannot panic before) is waited for no longer than
    // SETTLE_WAIT: starting it succeeded either way.
    let _ = settled.recv_timeout(SETTLE_WAIT);
    Ok(handle)
}

#[cfg(test)]
mod tests {
    #[test]
    fn library_threads_block_alarms_but_not_faults() {
        let mask = super::spawn("softrdma-test", || {
            // SAFETY: reading this thread's mask into a zeroed set.
            unsafe {
                let mut cur: libc::sigset_t = core::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut cur);
                (
                    libc::sigismember(&cur, libc::SIGALRM),
                    libc::sigismember(&cur, libc::SIGINT),
                    libc::sigismember(&cur, libc::SIGSEGV),
                )
            }
        })
        .unwrap()
        .join()
        .unwrap();
        assert_eq!(mask, (1, 1, 0));
    }

    /// The threads that ran `settle`.
    pub(super) static SETTLED: std::sync::Mutex<Vec<std::thread::ThreadId>> =
        std::sync::Mutex::new(Vec::new());

    #[test]
    fn spawn_returns_once_the_thread_has_settled() {
        for _ in 0..20 {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let h = super::spawn("softrdma-test", move || {
                let _ = rx.recv();
                super::STARTED.with(|s| s.get())
            })
            .unwrap();
            let id = h.thread().id();
            assert!(SETTLED.lock().unwrap().contains(&id));
            drop(tx);
            assert!(h.join().unwrap());
        }
    }
}
