//! Running part of a test in a network namespace of its own: the test re-runs its own binary
//! (the child selected by an environment variable) after `unshare(CLONE_NEWNET)`, plus a user
//! namespace mapping the caller to root when the caller is not root. The child brings `lo` up
//! ([`lo_up`]), prints `NETNS-READY` (or `NETNS-UNAVAILABLE <why>` when what it needs is
//! refused) and does its work; nothing leaves the namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use super::ChildGuard;

/// Run the test `test` of this binary again in a network namespace, with `role` set in its
/// environment; returns its output once it succeeded. `None` when namespaces (or what the
/// child needs, `needs`) are unavailable here: said loudly, and a failure under `scripts/test`
/// (which sets `SOFTRDMA_STRICT`) or when `CI` is set.
pub fn run_in_netns(test: &str, role: &str, needs: &str) -> Option<String> {
    let ci = std::env::var_os("CI").is_some() || std::env::var_os("SOFTRDMA_STRICT").is_some();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(role, "1");
    // SAFETY: plain reads of the caller's ids.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let root = uid == 0;
    let uid_map = format!("0 {uid} 1").into_bytes();
    let gid_map = format!("0 {gid} 1").into_bytes();
    // SAFETY: the closure runs in the forked child before exec and makes only system calls
    // on buffers built before the fork (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || enter_namespaces(root, &uid_map, &gid_map));
    }
    let mut child = match ChildGuard::spawn(cmd) {
        Ok(c) => c,
        Err(e) => {
            unavailable(ci, needs, &format!("cannot enter a network namespace: {e}"));
            return None;
        }
    };
    // Once the child runs in its namespace, whatever it does counts: only a namespace or
    // what it needs there that it could not get is "unavailable".
    let Some(first) = child.find(
        &["NETNS-READY", "NETNS-UNAVAILABLE"],
        Duration::from_secs(60),
    ) else {
        let st = child.wait(Duration::from_secs(1));
        panic!(
            "the namespace child never got ready ({st:?}); its output:\n{}",
            child.log()
        );
    };
    if first.contains("NETNS-UNAVAILABLE") {
        child.wait(Duration::from_secs(5));
        unavailable(ci, needs, &first);
        return None;
    }
    let status = child.wait(Duration::from_secs(90));
    let log = child.log();
    eprintln!("{log}");
    assert!(
        status.is_some_and(|s| s.success()),
        "the namespace child failed ({status:?}):\n{log}"
    );
    Some(log)
}

fn unavailable(ci: bool, needs: &str, why: &str) {
    assert!(
        !ci,
        "the test cannot run here (CI or SOFTRDMA_STRICT is set): {needs}: {why}"
    );
    eprintln!("\n######## SKIPPED: {needs} (root, or unprivileged user namespaces): {why}\n");
}

/// In the forked child, before exec: a network namespace of its own, inside a user namespace
/// mapping the caller to root when the caller is not root.
fn enter_namespaces(root: bool, uid_map: &[u8], gid_map: &[u8]) -> io::Result<()> {
    let flags = if root {
        libc::CLONE_NEWNET
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET
    };
    // SAFETY: unshare takes no pointers.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if !root {
        // Older kernels have no setgroups file; the maps are what matter.
        let _ = write_file(c"/proc/self/setgroups", b"deny");
        write_file(c"/proc/self/uid_map", uid_map)?;
        write_file(c"/proc/self/gid_map", gid_map)?;
    }
    Ok(())
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; the fd is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `data` is valid for its length.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: our fd.
    unsafe { libc::close(fd) };
    if n != data.len() as isize {
        return Err(err);
    }
    Ok(())
}

fn check(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// Bring the namespace's loopback interface up.
pub fn lo_up() -> io::Result<()> {
    // SAFETY: a new socket, closed by OwnedFd.
    let s = check(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) },
        "socket",
    )?;
    // SAFETY: s is ours.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, c) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *c as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass.
    unsafe {
        check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req),
            "SIOCGIFFLAGS",
        )?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req),
            "SIOCSIFFLAGS",
        )?;
    }
    Ok(())
}
