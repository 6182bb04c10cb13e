//! errno, return conventions, and the panic guard every entry point runs under.
//!
//! libibverbs has three conventions (see docs/IBVERBS.md): constructors return NULL and set
//! `errno`; most verbs return 0 or the errno value itself; a few old ones (`ibv_close_device`,
//! `ibv_query_gid`, `ibv_query_pkey`, `ibv_get_cq_event`, `ibv_get_async_event`) return 0 or -1
//! and set `errno`.

use core::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// What an entry point reports if Rust code below it panicked (a bug): "I/O error".
pub const PANIC_ERRNO: c_int = libc::EIO;

/// Set the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

/// Run `f`; a panic becomes `on_panic()` instead of unwinding into C (which would abort).
pub fn guard<R>(on_panic: impl FnOnce() -> R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| on_panic())
}

/// Convention "0 or the errno value".
pub fn ffi_errno(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    guard(
        || PANIC_ERRNO,
        || match f() {
            Ok(()) => 0,
            Err(e) => e,
        },
    )
}

/// Convention "0, or -1 and errno".
pub fn ffi_minus1(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    guard(
        || {
            set_errno(PANIC_ERRNO);
            -1
        },
        || match f() {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e);
                -1
            }
        },
    )
}

/// Convention "a pointer, or NULL and errno".
pub fn ffi_ptr<T>(f: impl FnOnce() -> Result<*mut T, c_int>) -> *mut T {
    guard(
        || {
            set_errno(PANIC_ERRNO);
            core::ptr::null_mut()
        },
        || match f() {
            Ok(p) => p,
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        },
    )
}
