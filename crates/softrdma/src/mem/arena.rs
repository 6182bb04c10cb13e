//! Memory the device allocates itself: anonymous memfd files mapped by the engine, with base
//! pages or huge pages. The application never holds the only mapping, so no application
//! `munmap` can pull this memory away while it is registered.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::MemError;

/// Page size of device-allocated memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PageSize {
    /// The base page size (4 KiB on x86-64).
    #[default]
    Base,
    /// 2 MiB huge pages (`MFD_HUGETLB`; needs huge pages reserved in `/proc/sys/vm/nr_hugepages`).
    Huge2M,
}

impl PageSize {
    fn bytes(self) -> u64 {
        match self {
            PageSize::Base => super::pin::page_size() as u64,
            PageSize::Huge2M => 2 << 20,
        }
    }
}

/// Bytes allocated from the arena, bounded by a limit.
#[derive(Debug)]
pub(crate) struct Arena {
    used: Arc<AtomicU64>,
    limit: u64,
}

/// One allocation: the memfd, the engine's mapping of it, and the charge it returns on drop.
pub(crate) struct ArenaBuf {
    map: Option<MmapRaw>,
    file: File,
    charged: u64,
    used: Arc<AtomicU64>,
}

impl core::fmt::Debug for ArenaBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArenaBuf")
            .field("charged", &self.charged)
            .finish()
    }
}

impl ArenaBuf {
    /// Start of the engine's mapping (dangling but non-null when empty).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map
            .as_ref()
            .map_or(core::ptr::NonNull::dangling().as_ptr(), |m| m.as_mut_ptr())
    }

    /// The memfd, so the application can map the same memory.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for ArenaBuf {
    fn drop(&mut self) {
        self.map = None;
        self.used.fetch_sub(self.charged, Ordering::Relaxed);
    }
}

impl Arena {
    pub(crate) fn new(limit: u64) -> Arena {
        Arena {
            used: Arc::new(AtomicU64::new(0)),
            limit,
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Allocate `len` bytes (rounded up to `page`).
    pub(crate) fn alloc(&self, len: usize, page: PageSize) -> Result<ArenaBuf, MemError> {
        let ps = page.bytes();
        let rounded = (len as u64)
            .checked_next_multiple_of(ps)
            .ok_or(MemError::InvalidRange {
                iova: 0,
                len: len as u64,
                why: "too large",
            })?;
        // Charge first, so concurrent allocations cannot overshoot the limit.
        let prev = self.used.fetch_add(rounded, Ordering::Relaxed);
        let charge = ArenaCharge {
            used: &self.used,
            n: rounded,
        };
        if prev.saturating_add(rounded) > self.limit {
            return Err(MemError::TableFull {
                what: "device memory bytes",
                limit: self.limit,
            });
        }
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if page == PageSize::Huge2M {
            flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
        }
        // SAFETY: the name is a NUL-terminated literal; memfd_create returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"softrdma-dm".as_ptr(), flags) };
        if fd < 0 {
            return Err(MemError::last_os("memfd_create"));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(rounded).map_err(|e| MemError::Os {
            op: "ftruncate",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        // The application may map the memfd (`device_memory_fd`) but never resize it: a
        // shrink would leave the engine's mapping over missing pages (SIGBUS on a peer's
        // access).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a file descriptor this function owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(MemError::last_os("fcntl(F_ADD_SEALS)"));
        }
        let map = if rounded == 0 {
            None
        } else {
            Some(
                MmapOptions::new()
                    .len(rounded as usize)
                    .map_raw(&file)
                    .map_err(|e| MemError::Os {
                        op: "mmap",
                        errno: e.raw_os_error().unwrap_or(0),
                    })?,
            )
        };
        core::mem::forget(charge);
        Ok(ArenaBuf {
            map,
            file,
            charged: rounded,
            used: Arc::clone(&self.used),
        })
    }
}

/// Undoes an arena charge unless forgotten (the allocation succeeded).
struct ArenaCharge<'a> {
    used: &'a AtomicU64,
    n: u64,
}

impl Drop for ArenaCharge<'_> {
    fn drop(&mut self) {
        self.used.fetch_sub(self.n, Ordering::Relaxed);
    }
}
