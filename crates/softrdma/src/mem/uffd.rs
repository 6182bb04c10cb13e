//! The slice of the Linux userfaultfd ABI the coherence watcher needs, called directly with
//! `libc::syscall` and `ioctl` (the constants and structures are the kernel's UAPI,
//! `include/uapi/linux/userfaultfd.h`, which is stable).
//!
//! # How the watcher uses userfaultfd
//! Only the *non-cooperative events* are wanted (UNMAP, REMAP, REMOVE), never page-fault
//! handling. A range must still be registered in some mode for its events to be delivered,
//! and `MISSING` mode would make every fault on an unpopulated page wait for a userspace
//! reader. The watcher therefore registers in **write-protect mode** (`MODE_WP`) and never
//! write-protects a page: a fault only reaches userfaultfd when its PTE carries the
//! uffd-wp bit, which only `UFFDIO_WRITEPROTECT` sets. With `UFFD_FEATURE_WP_ASYNC`
//! (Linux 6.7) the kernel would even resolve such faults itself, and it lets WP-only
//! registrations cover any kind of mapping (regular files too), not only anonymous memory,
//! shmem and hugetlbfs. Faults in watched ranges therefore behave exactly as elsewhere.
//!
//! The descriptor is opened with `UFFD_USER_MODE_ONLY` (Linux 5.11), which every user may do
//! whatever `vm.unprivileged_userfaultfd` says: the flag only limits which *faults* could be
//! handled, and events are delivered regardless.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `UFFD_API`.
const UFFD_API: u64 = 0xaa;
/// `UFFD_USER_MODE_ONLY` (flag of the `userfaultfd` system call).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

pub(crate) const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub(crate) const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub(crate) const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub(crate) const FEATURE_WP_ASYNC: u64 = 1 << 15;

/// `UFFDIO_REGISTER_MODE_WP`.
const REGISTER_MODE_WP: u64 = 1 << 1;

pub(crate) const EVENT_REMAP: u8 = 0x14;
pub(crate) const EVENT_REMOVE: u8 = 0x15;
pub(crate) const EVENT_UNMAP: u8 = 0x16;

/// Size of `struct uffd_msg`.
pub(crate) const MSG_LEN: usize = 32;

/// `_IOC(dir, 0xAA, nr, size)` in the generic encoding (x86, arm, riscv, loongarch, s390).
const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xaa << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
/// `UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3f, 24);
/// `UFFDIO_REGISTER = _IOWR(0xAA, 0x00, struct uffdio_register)`.
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
/// `UFFDIO_UNREGISTER = _IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
/// `USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00)` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u64 = ioc(0, 0x00, 0);

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// Why no userfaultfd could be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OpenError {
    pub(crate) errno: i32,
    pub(crate) what: &'static str,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A new userfaultfd (non-blocking, close-on-exec, user-mode faults only), trying the system
/// call first and `/dev/userfaultfd` (Linux 6.1) when the call is refused.
fn open_raw() -> Result<OwnedFd, OpenError> {
    if !cfg!(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "s390x"
    )) {
        return Err(OpenError {
            errno: libc::ENOSYS,
            what: "ioctl encoding of this architecture not supported",
        });
    }
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    for extra in [UFFD_USER_MODE_ONLY, 0] {
        // SAFETY: the userfaultfd system call takes one integer argument and returns a new
        // descriptor or -1; it touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | extra) };
        if fd >= 0 {
            // SAFETY: `fd` is a descriptor the kernel just created for us; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        match errno() {
            // A kernel before 5.11 does not know UFFD_USER_MODE_ONLY: retry without it.
            libc::EINVAL if extra != 0 => continue,
            libc::EPERM | libc::EACCES | libc::EINVAL => break,
            e => {
                return Err(OpenError {
                    errno: e,
                    what: "userfaultfd system call failed",
                });
            }
        }
    }
    let path = c"/dev/userfaultfd";
    // SAFETY: `path` is a NUL-terminated string; open returns a new descriptor or -1.
    let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(OpenError {
            errno: errno(),
            what: "userfaultfd refused (seccomp, LSM or vm.unprivileged_userfaultfd) and \
                   /dev/userfaultfd not accessible",
        });
    }
    // SAFETY: `dev` was just opened by us.
    let dev = unsafe { OwnedFd::from_raw_fd(dev) };
    for extra in [UFFD_USER_MODE_ONLY, 0] {
        // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a new descriptor.
        let fd = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                USERFAULTFD_IOC_NEW as _,
                (flags | extra) as libc::c_ulong,
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just created for us.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    Err(OpenError {
        errno: errno(),
        what: "USERFAULTFD_IOC_NEW on /dev/userfaultfd failed",
    })
}

/// An open userfaultfd with the event features enabled.
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: OwnedFd,
    /// Features the kernel enabled.
    pub(crate) features: u64,
}

impl Uffd {
    /// Open a userfaultfd and enable UNMAP, REMAP and REMOVE events (and WP_ASYNC when the
    /// kernel has it).
    pub(crate) fn open() -> Result<Uffd, OpenError> {
        let events = FEATURE_EVENT_UNMAP | FEATURE_EVENT_REMAP | FEATURE_EVENT_REMOVE;
        let mut last = OpenError {
            errno: 0,
            what: "UFFDIO_API refused",
        };
        // UFFDIO_API succeeds at most once per descriptor, so each attempt opens a new one.
        for features in [events | FEATURE_WP_ASYNC, events] {
            let fd = open_raw()?;
            let mut api = UffdioApi {
                api: UFFD_API,
                features,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`, which `api` is
            // (same layout: three u64).
            let rc = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) };
            if rc == 0 {
                return Ok(Uffd {
                    fd,
                    features: api.features,
                });
            }
            last = OpenError {
                errno: errno(),
                what: "UFFDIO_API refused the event features",
            };
        }
        Err(last)
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Register the page-aligned `[start, start+len)` in write-protect mode (no page is ever
    /// write-protected, so faults are unaffected). Returns `errno` on failure; nothing is
    /// registered then.
    pub(crate) fn register(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`; it changes
        // only the userfaultfd flags of our own mappings, never their contents.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut r) };
        if rc == 0 { Ok(()) } else { Err(errno()) }
    }

    /// Unregister the page-aligned `[start, start+len)`. Returns `errno` on failure (for
    /// example when the range is no longer mapped, which is harmless).
    pub(crate) fn unregister(&self, start: usize, len: usize) -> Result<(), i32> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`; it only clears
        // userfaultfd flags of our own mappings.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER as _, &mut r) };
        if rc == 0 { Ok(()) } else { Err(errno()) }
    }

    /// Read pending messages into `buf` without blocking; returns how many bytes were read
    /// (a multiple of [`MSG_LEN`]), 0 when none is pending.
    pub(crate) fn read(&self, buf: &mut [u8]) -> Result<usize, i32> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        match errno() {
            libc::EAGAIN | libc::EINTR => Ok(0),
            e => Err(e),
        }
    }
}

/// One decoded `struct uffd_msg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// `[start, end)` was unmapped (munmap, mremap shrink, MAP_FIXED over it).
    Unmap { start: usize, end: usize },
    /// `[start, end)` is about to lose its pages (MADV_DONTNEED/FREE/REMOVE).
    Remove { start: usize, end: usize },
    /// `len` bytes moved from `from` to `to` (mremap).
    Remap { from: usize, to: usize, len: usize },
    /// Anything else (page faults, which WP mode without write-protected pages never sends).
    Other(u8),
}

/// Decode one message (`b` is [`MSG_LEN`] bytes: event u8, 7 reserved bytes, 24 bytes of
/// arguments in host order).
pub(crate) fn decode(b: &[u8]) -> Msg {
    let word = |i: usize| -> usize {
        let mut w = [0u8; 8];
        if let Some(s) = b.get(8 + 8 * i..16 + 8 * i) {
            w.copy_from_slice(s);
        }
        u64::from_ne_bytes(w) as usize
    };
    match b.first().copied().unwrap_or(0) {
        EVENT_UNMAP => Msg::Unmap {
            start: word(0),
            end: word(1),
        },
        EVENT_REMOVE => Msg::Remove {
            start: word(0),
            end: word(1),
        },
        EVENT_REMAP => Msg::Remap {
            from: word(0),
            to: word(1),
            len: word(2),
        },
        e => Msg::Other(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi_header() {
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_aa01);
        assert_eq!(USERFAULTFD_IOC_NEW, 0xaa00);
        assert_eq!(core::mem::size_of::<UffdioApi>(), 24);
        assert_eq!(core::mem::size_of::<UffdioRegister>(), 32);
    }

    #[test]
    fn decodes_messages() {
        let mut b = [0u8; MSG_LEN];
        b[0] = EVENT_REMAP;
        b[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        b[16..24].copy_from_slice(&0x9000u64.to_ne_bytes());
        b[24..32].copy_from_slice(&0x2000u64.to_ne_bytes());
        assert_eq!(
            decode(&b),
            Msg::Remap {
                from: 0x1000,
                to: 0x9000,
                len: 0x2000
            }
        );
        b[0] = EVENT_UNMAP;
        assert_eq!(
            decode(&b),
            Msg::Unmap {
                start: 0x1000,
                end: 0x9000
            }
        );
        assert_eq!(decode(&[0x12; 3]), Msg::Other(0x12));
    }
}
