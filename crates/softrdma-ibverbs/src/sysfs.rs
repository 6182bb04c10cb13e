//! `ibv_read_sysfs_file` and `ibv_get_sysfs_path`.
//!
//! softrdma devices have no kernel device, so the files `ibv_devinfo` and friends read under
//! a device's `ibdev_path` (`/sys/class/infiniband/<name>`) are served from here: `board_id`,
//! `fw_ver`, `hca_type`, `hw_rev`, `node_desc`, `node_guid`, `node_type`, `sys_image_guid`.
//! Any other directory is read from the file system, as libibverbs does.

use core::ffi::{CStr, c_char, c_int};

use crate::device::{Device, devices};
use crate::errno::{ffi_minus1, guard, set_errno};

fn guid_str(g: u64) -> String {
    let b = g.to_ne_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// The contents of a virtual sysfs file of `dev`, or `None`.
pub fn virtual_file(dev: &Device, file: &str) -> Option<String> {
    Some(match file {
        "board_id" => "SOFTRDMA".to_string(),
        "fw_ver" => env!("CARGO_PKG_VERSION").to_string(),
        "hca_type" => "softrdma".to_string(),
        "hw_rev" => "1".to_string(),
        "node_desc" => format!("softrdma {} {}", dev.cfg.name, dev.cfg.addr),
        "node_guid" | "sys_image_guid" => guid_str(dev.guid()),
        "node_type" => "1: CA".to_string(),
        _ => return None,
    })
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: read `dir/file` into `buf` (at most `size`
/// bytes); a trailing newline becomes NUL, and the result is NUL-terminated when it fits.
/// Returns the length read, or -1 with errno (EINVAL for NULL arguments, else the error of
/// opening or reading the file; ENOENT for a missing file of one of our devices).
///
/// # Safety
/// `dir` and `file` are NULL or NUL-terminated; `buf` is NULL or has `size` writable bytes.
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(
        || -1,
        || {
            if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: non-NULL, NUL-terminated per the contract.
            let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
            let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
            let dir = dir.trim_end_matches('/');
            let ours = devices()
                .ok()
                .and_then(|ds| ds.iter().find(|d| d.ibdev_path() == dir));
            let data = match ours {
                Some(d) => match virtual_file(d, &file) {
                    Some(s) => format!("{s}\n").into_bytes(),
                    None => {
                        set_errno(libc::ENOENT);
                        return -1;
                    }
                },
                None => match std::fs::read(format!("{dir}/{file}")) {
                    Ok(b) => b,
                    Err(e) => {
                        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                        return -1;
                    }
                },
            };
            let mut n = data.len().min(size);
            // SAFETY: `buf` has `size` writable bytes and `n <= size`.
            let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
            out[..n].copy_from_slice(&data[..n]);
            if n > 0 && out[n - 1] == b'\n' {
                n -= 1;
                out[n] = 0;
            } else if n < size {
                out[n] = 0;
            }
            n as c_int
        },
    )
}

/// `ibv_get_sysfs_path`: "/sys".
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_fork_init`: 0. Registered memory is reached through the process's own mappings, so a
/// forked child cannot corrupt the parent's registrations (nothing to mark `MADV_DONTFORK`).
pub extern "C" fn ibv_fork_init() -> c_int {
    ffi_minus1(|| Ok(()))
}

/// `ibv_is_fork_initialized` (IBVERBS_1.13): `IBV_FORK_UNNEEDED` (2).
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range` / `ibv_dofork_range`: 0 (see [`ibv_fork_init`]).
pub extern "C" fn ibv_dofork_range(_base: *mut core::ffi::c_void, _size: usize) -> c_int {
    0
}
