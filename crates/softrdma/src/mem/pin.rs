//! The pinning resource manager: a per-device policy that honours or refuses residency
//! against the operating system's own limits.
//!
//! In [`PinMode::Pinned`] every page under a registration is locked with `mlock` and counted
//! in a [`PageMap`]; a page covered by several (overlapping or redundant) registrations is
//! locked and counted **once** (Linux's RDMA core would charge it once per registration), and
//! unlocked only when its last registration goes — of any device of the process: the lock is
//! the process's (the kernel does not count `mlock`s), so the pages every device pins are
//! counted once more in one process-wide map, which decides what is locked and unlocked and
//! what the process has locked against `RLIMIT_MEMLOCK`. The limit is `RLIMIT_MEMLOCK` unless
//! the process has `CAP_IPC_LOCK` (as the kernel's own `mlock` check), further capped by an
//! optional per-device quota on the pages the device pins. A refused registration pins nothing
//! and changes no count.
//!
//! Caveat: `munlock` is not reference-counted by the kernel, so if the application itself
//! `mlock`s pages that the device also pinned, the device's unpin unlocks them too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::pagemap::{PageMap, PageRange};
use super::{MemError, PinLimitKind};

/// The pinning policy of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PinMode {
    /// Registered pages are locked in memory (`mlock`) and accounted.
    #[default]
    Pinned,
    /// Nothing is pinned (like on-demand paging): the engine reaches virtual memory anyway.
    OnDemand,
}

/// The limits pinning runs under, as seen now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinLimits {
    /// The device's policy.
    pub mode: PinMode,
    /// Whether the process has `CAP_IPC_LOCK` (then `RLIMIT_MEMLOCK` does not apply).
    pub cap_ipc_lock: bool,
    /// The soft `RLIMIT_MEMLOCK` in bytes (`None` = unlimited).
    pub rlimit_memlock: Option<u64>,
    /// The device quota in bytes, if any.
    pub quota: Option<u64>,
    /// Bytes this device has pinned.
    pub pinned: u64,
}

/// Pages one registration pinned: `[first, end)` page numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PinSpan {
    first: u64,
    end: u64,
}

/// The pages pinned by every device of the process, each counted once per registration of
/// any device. Taken after a device's own map, never before.
static PROCESS_PAGES: Mutex<PageMap> = Mutex::new(PageMap::new());

fn process_pages() -> MutexGuard<'static, PageMap> {
    PROCESS_PAGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes pinned by all devices of the process together (a page pinned by several devices, or
/// several registrations, counts once): what the process holds locked against
/// `RLIMIT_MEMLOCK`, as `VmLck` shows it when nothing else locks memory.
pub fn process_pinned_bytes() -> u64 {
    process_pages().pages() << page_size().trailing_zeros()
}

pub(crate) struct Pinner {
    mode: PinMode,
    page_shift: u32,
    quota: Option<u64>,
    cap_ipc_lock: bool,
    pages: Mutex<PageMap>,
    pinned_bytes: AtomicU64,
    refusals: AtomicU64,
}

impl Pinner {
    pub(crate) fn new(mode: PinMode, quota: Option<u64>) -> Pinner {
        Pinner {
            mode,
            page_shift: page_size().trailing_zeros(),
            quota,
            cap_ipc_lock: has_cap_ipc_lock(),
            pages: Mutex::new(PageMap::default()),
            pinned_bytes: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        }
    }

    pub(crate) fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    pub(crate) fn limits(&self) -> PinLimits {
        PinLimits {
            mode: self.mode,
            cap_ipc_lock: self.cap_ipc_lock,
            rlimit_memlock: rlimit_memlock(),
            quota: self.quota,
            pinned: self.pinned_bytes(),
        }
    }

    /// Pin `[addr, addr+len)` (rounded out to pages) unless the policy says not to
    /// (`on_demand`: the region asked for `ON_DEMAND`). Returns what must later be unpinned.
    pub(crate) fn pin(
        &self,
        addr: usize,
        len: usize,
        on_demand: bool,
    ) -> Result<Option<PinSpan>, MemError> {
        if self.mode == PinMode::OnDemand || on_demand || len == 0 {
            return Ok(None);
        }
        let shift = self.page_shift;
        let first = (addr as u64) >> shift;
        let last = (addr as u64)
            .checked_add(len as u64 - 1)
            .ok_or(MemError::InvalidRange {
                iova: addr as u64,
                len: len as u64,
                why: "wraps past the top of the address space",
            })?
            >> shift;
        let span = PinSpan {
            first,
            end: last + 1,
        };
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        let mut process = process_pages();
        // New to this device (its quota), and new to the process (to lock, and its limit).
        let dev_new: u64 = pages
            .gaps(span.first, span.end)
            .iter()
            .map(|(a, b)| (b - a) << shift)
            .sum();
        let gaps = process.gaps(span.first, span.end);
        let needed: u64 = gaps.iter().map(|(a, b)| (b - a) << shift).sum();
        let dev_pinned = pages.pages() << shift;
        let pinned = process.pages() << shift;
        if let Some(q) = self.quota
            && dev_new > 0
            && dev_pinned + dev_new > q
        {
            let free = q.saturating_sub(dev_pinned);
            return Err(self.refuse(len, dev_new, free, q, PinLimitKind::Quota));
        }
        if needed > 0 {
            let rlimit = rlimit_memlock();
            if let (false, Some(r)) = (self.cap_ipc_lock, rlimit)
                && pinned + needed > r
            {
                let free = r.saturating_sub(pinned);
                return Err(self.refuse(len, needed, free, r, PinLimitKind::Rlimit));
            }
            for (i, &(a, b)) in gaps.iter().enumerate() {
                if let Err(errno) = lock_pages(a << shift, (b - a) << shift, true) {
                    for &(a, b) in &gaps[..i] {
                        // Best effort: these pages were locked by us a moment ago.
                        let _ = lock_pages(a << shift, (b - a) << shift, false);
                    }
                    // Over the limit because of memory locked outside softrdma?
                    if let (false, Some(r), true) = (
                        self.cap_ipc_lock,
                        rlimit,
                        errno == libc::ENOMEM || errno == libc::EAGAIN,
                    ) {
                        let used = vm_locked_bytes().unwrap_or(pinned);
                        if used + needed > r {
                            return Err(self.refuse(
                                len,
                                needed,
                                r.saturating_sub(used),
                                r,
                                PinLimitKind::Rlimit,
                            ));
                        }
                    }
                    return Err(MemError::Os { op: "mlock", errno });
                }
            }
        }
        process.add(span.first, span.end);
        drop(process);
        pages.add(span.first, span.end);
        self.pinned_bytes
            .store(pages.pages() << shift, Ordering::Relaxed);
        drop(pages);
        tracing::debug!(addr, len, needed, "pinned");
        Ok(Some(span))
    }

    /// Release what [`pin`](Self::pin) pinned: exactly the pages whose count drops to zero.
    pub(crate) fn unpin(&self, span: Option<PinSpan>) {
        let Some(span) = span else { return };
        let shift = self.page_shift;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.sub(span.first, span.end);
        // Unlocked only when no registration of any device of the process holds them.
        let freed: Vec<PageRange> = process_pages().sub(span.first, span.end);
        for (a, b) in freed {
            if let Err(errno) = lock_pages(a << shift, (b - a) << shift, false) {
                tracing::warn!(errno, start = a << shift, "munlock failed");
            }
        }
        self.pinned_bytes
            .store(pages.pages() << shift, Ordering::Relaxed);
    }

    /// Release `span` after its pages `[gone.0, gone.1)` (page numbers) left their addresses
    /// (unmapped, or moved by `mremap`, which carries their lock along): those are dropped
    /// from the accounting without `munlock`; the others whose count drops to zero are
    /// unlocked as [`unpin`](Self::unpin) does.
    pub(crate) fn release(&self, span: Option<PinSpan>, gone: (u64, u64)) {
        let Some(span) = span else { return };
        let shift = self.page_shift;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.sub(span.first, span.end);
        let freed = process_pages().sub(span.first, span.end);
        for (a, b) in freed {
            for (x, y) in [(a, b.min(gone.0)), (a.max(gone.1), b)] {
                if x < y
                    && let Err(errno) = lock_pages(x << shift, (y - x) << shift, false)
                {
                    tracing::warn!(errno, start = x << shift, "munlock failed");
                }
            }
        }
        self.pinned_bytes
            .store(pages.pages() << shift, Ordering::Relaxed);
    }

    fn refuse(
        &self,
        asked: usize,
        needed: u64,
        free: u64,
        limit: u64,
        kind: PinLimitKind,
    ) -> MemError {
        self.refusals.fetch_add(1, Ordering::Relaxed);
        let e = MemError::PinLimit {
            asked: asked as u64,
            needed,
            free,
            limit,
            kind,
        };
        tracing::info!(%e, "registration refused");
        e
    }
}

/// `mlock` (or `munlock`) of a page-aligned range; returns `errno` on failure.
fn lock_pages(addr: u64, len: u64, lock: bool) -> Result<(), i32> {
    let (p, n) = (addr as usize as *const libc::c_void, len as usize);
    // SAFETY: mlock/munlock only change residency attributes of the calling process's
    // mappings; they never read or write the memory, and fail cleanly on unmapped ranges.
    let rc = unsafe {
        if lock {
            libc::mlock(p, n)
        } else {
            libc::munlock(p, n)
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// The soft `RLIMIT_MEMLOCK` in bytes, `None` when unlimited.
pub fn rlimit_memlock() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        None
    } else {
        Some(r.rlim_cur)
    }
}

/// Whether the calling thread's effective capability set holds `CAP_IPC_LOCK` (capabilities
/// are per thread; read from `/proc/thread-self/status`; absent information counts as "no",
/// the conservative answer).
pub fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status_field_of("/proc/thread-self/status", "CapEff:")
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The process's locked memory (`VmLck` of `/proc/self/status`) in bytes.
pub fn vm_locked_bytes() -> Option<u64> {
    let v = status_field("VmLck:")?;
    let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

fn status_field(name: &str) -> Option<String> {
    status_field_of("/proc/self/status", name)
}

fn status_field_of(path: &str, name: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::to_owned)
}
