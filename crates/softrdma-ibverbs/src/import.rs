//! Importing objects shared through a kernel uverbs file (`ibv_import_device`, `ibv_import_pd`,
//! `ibv_import_mr`, `ibv_import_dm`) and their `ibv_unimport_*` counterparts.
//!
//! An import names a kernel object: the command fd of another process's context and the
//! kernel handle of a PD, MR or DM on it. softrdma has no kernel objects (a context's `cmd_fd`
//! is an empty file of its own, no uverbs fd), so there is nothing to import: each import returns NULL with
//! errno EOPNOTSUPP, or EINVAL for an argument that is wrong anyway (a negative fd, a context
//! or PD this library did not hand out). No object is ever imported, so each unimport has
//! nothing to undo: it returns without touching its argument (NULL and foreign pointers
//! included; an object of ours stays valid and is released with its destroy verb).

use core::ffi::c_int;

use crate::abi::{ibv_context, ibv_dm, ibv_mr, ibv_pd};
use crate::errno::ffi_ptr;
use crate::registry::{self, Kind};

/// `ibv_import_device` (IBVERBS_1.10): NULL with errno EINVAL (negative fd) or EOPNOTSUPP.
pub extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    ffi_ptr(|| {
        Err(if cmd_fd < 0 {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        })
    })
}

/// `ibv_import_pd` (IBVERBS_1.10): NULL with errno EINVAL (not a context of ours) or
/// EOPNOTSUPP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    ffi_ptr(|| Err(unsupported_on(registry::contains(context, Kind::Context))))
}

/// `ibv_import_mr` (IBVERBS_1.10): NULL with errno EINVAL (not a PD of ours) or EOPNOTSUPP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    ffi_ptr(|| Err(unsupported_on(registry::contains(pd, Kind::Pd))))
}

/// `ibv_import_dm` (IBVERBS_1.13): NULL with errno EINVAL (not a context of ours) or
/// EOPNOTSUPP.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_import_dm(context: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    ffi_ptr(|| Err(unsupported_on(registry::contains(context, Kind::Context))))
}

/// `ibv_unimport_pd` (IBVERBS_1.10): nothing was imported, nothing to do.
pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

/// `ibv_unimport_mr` (IBVERBS_1.10): nothing was imported, nothing to do.
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

/// `ibv_unimport_dm` (IBVERBS_1.13): nothing was imported, nothing to do.
pub extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

/// The errno of an import on a live (`EOPNOTSUPP`) or foreign (`EINVAL`) object.
fn unsupported_on(live: bool) -> c_int {
    if live { libc::EOPNOTSUPP } else { libc::EINVAL }
}
