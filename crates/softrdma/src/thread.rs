//! The library's own threads (the engine, the watcher, the connection manager) start here:
//! named, and with the asynchronous signals blocked, so that a signal meant for the
//! application (an alarm that ends a benchmark loop, SIGINT, SIGCHLD...) is delivered to one
//! of the application's threads, where it interrupts the call that thread waits in, and never
//! to a thread of the library.

use std::io;
use std::thread::JoinHandle;

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

/// Start a library thread named `name` running `f`, with the asynchronous signals blocked.
pub(crate) fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            block_async_signals();
            f()
        })
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
}
