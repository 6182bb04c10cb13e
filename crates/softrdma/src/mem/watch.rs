//! The coherence watcher: one thread per memory table reading userfaultfd's non-cooperative
//! events for the pages of raw regions (see [`coherence`](super::coherence) for what it
//! guarantees and [`uffd`](super::uffd) for how the pages are registered without changing
//! how they fault).
//!
//! # Ordering
//! The kernel makes the thread that unmaps, moves or discards watched memory wait until the
//! event is *read*. A `REMOVE` (discard) is sent before the pages are freed, `UNMAP` and
//! `REMAP` after the change. When the descriptor becomes readable the watcher takes the
//! registry and then the state write lock of every watched region (which waits for the
//! accesses in flight and holds new ones back), and only then reads the events and applies
//! them. Hence:
//! - no access to a watched region runs between the moment an event is read (the moment
//!   the application's thread may go on) and the moment the region is invalidated or
//!   rebased; in particular no access touches discarded pages once the kernel frees them;
//! - when the application's `munmap`/`mremap`/`madvise` returns, every later access sees
//!   the region invalidated (or at its new address);
//! - an access that ran *after* an unmap but before the event was read fails with `Fault`
//!   (checked placement), or, if the application mapped new memory at that address in
//!   between (from another thread; the unmapping thread is still waiting), lands there:
//!   that case is excluded by the safety contract of [`MemSource::raw`](super::MemSource::raw).
//!
//! Holding every watched region's lock briefly stalls accesses to all raw regions while an
//! event is handled (a few microseconds, plus the longest copy in flight); events only come
//! from changes to registered memory, which are rare.
//!
//! Lock order: registry → region states (watcher); the control path takes the registry with no
//! region lock held. The registry's page-reference map decides which pages to unregister when
//! regions overlap.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;

use super::coherence::{INVALIDATION_QUEUE, InvalidationNotify};
use super::pagemap::PageMap;
use super::pin::{Pinner, page_size};
use super::region::{Mr, MrState, MrStatus};
use super::table::{read, write};
use super::uffd::{MSG_LEN, Msg, OpenError, Uffd, decode};
use super::{Invalidation, InvalidationCause, RemapPolicy, WatchMode, WatchStatus};

/// How long a fault on watched memory waits for the event that explains it (the window
/// between a `munmap`/`mremap` changing the mapping and the kernel queueing the event).
pub(crate) const EVENT_GRACE_MS: i32 = 5;

/// Messages read per `read` call.
const BATCH: usize = 16;
/// `read` calls per wake-up (more events wait for the next wake-up, which is immediate).
const READS_PER_WAKE: usize = 64;

struct Watched {
    mr: Arc<Mr>,
    /// Page numbers `[first, end)` registered for this region.
    pages: (u64, u64),
}

#[derive(Default)]
struct Registry {
    regions: HashMap<u32, Watched>,
    /// How many watched regions cover each page (a page is unregistered when it drops to 0).
    pages: PageMap,
}

/// A device's callback for an access violation: (QP number, key used).
pub(crate) type ViolationNotify = Arc<dyn Fn(u32, u32) + Send + Sync>;

/// What the watcher and the control path share.
pub(crate) struct Shared {
    registry: Mutex<Registry>,
    queue: Mutex<VecDeque<Invalidation>>,
    pub(crate) notify: RwLock<Option<InvalidationNotify>>,
    /// The device's own callback (it tears down the QPs using the region), run before the
    /// application's.
    pub(crate) device_notify: RwLock<Option<InvalidationNotify>>,
    /// The device's callback for an access by QP `qpn` through `key` that met an invalidated
    /// key or vanished memory (called with that QP locked: it must only record).
    pub(crate) violation_notify: RwLock<Option<ViolationNotify>>,
    pinner: Arc<Pinner>,
    page_shift: u32,
    pub(crate) events: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) follows: AtomicU64,
    pub(crate) unwatched: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) faults: AtomicU64,
}

struct Started {
    uffd: Arc<Uffd>,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// The coherence state of one memory table.
pub(crate) struct Coherence {
    mode: WatchMode,
    pub(crate) default_remap: RemapPolicy,
    max_watched: usize,
    started: OnceLock<Result<Started, OpenError>>,
    pub(crate) shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Coherence {
    pub(crate) fn new(
        mode: WatchMode,
        default_remap: RemapPolicy,
        max_watched: u32,
        pinner: Arc<Pinner>,
    ) -> Coherence {
        Coherence {
            mode,
            default_remap,
            max_watched: max_watched as usize,
            started: OnceLock::new(),
            shared: Arc::new(Shared {
                registry: Mutex::new(Registry::default()),
                queue: Mutex::new(VecDeque::new()),
                notify: RwLock::new(None),
                device_notify: RwLock::new(None),
                violation_notify: RwLock::new(None),
                pinner,
                page_shift: page_size().trailing_zeros(),
                events: AtomicU64::new(0),
                invalidations: AtomicU64::new(0),
                follows: AtomicU64::new(0),
                unwatched: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                faults: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn status(&self) -> WatchStatus {
        match (self.mode, self.started.get()) {
            (WatchMode::Off, _) => WatchStatus::Off,
            (WatchMode::On, None) => WatchStatus::Idle,
            (WatchMode::On, Some(Ok(s))) => WatchStatus::Active {
                any_mapping: s.uffd.features & super::uffd::FEATURE_WP_ASYNC != 0,
            },
            (WatchMode::On, Some(Err(e))) => WatchStatus::Unavailable {
                errno: e.errno,
                reason: e.what,
            },
        }
    }

    /// True when the watcher has an event to read: a thread of the application is inside an
    /// `munmap`/`mremap`/`madvise` of watched memory, waiting for the watcher. Called on the
    /// (rare) fault path with a region guard held, which keeps the watcher from reading the
    /// event meanwhile (it takes every watched region's write lock first).
    ///
    /// The kernel queues the event only after it changed the mapping, so a fault can come
    /// first: the check waits up to [`EVENT_GRACE_MS`] for an event before it says no.
    pub(crate) fn event_pending(&self) -> bool {
        let Some(Ok(s)) = self.started.get() else {
            return false;
        };
        let mut p = libc::pollfd {
            fd: s.uffd.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one live pollfd; the timeout is bounded.
        let n = unsafe { libc::poll(&mut p, 1, EVENT_GRACE_MS) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    pub(crate) fn watched_count(&self) -> u64 {
        lock(&self.shared.registry).regions.len() as u64
    }

    /// Watch the raw region `lkey` (`len` bytes at `addr`), starting the watcher if needed.
    /// Failure leaves the region unwatched (counted), never refuses the registration.
    pub(crate) fn watch(&self, lkey: u32, mr: &Arc<Mr>, addr: usize, len: usize) {
        if self.mode == WatchMode::Off || len == 0 {
            return;
        }
        let sh = &self.shared;
        let started = self.started.get_or_init(|| start(Arc::clone(sh)));
        let Ok(started) = started else {
            sh.unwatched.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut reg = lock(&sh.registry);
        if reg.regions.len() >= self.max_watched {
            sh.unwatched.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(lkey, "not watched: max_watched reached");
            return;
        }
        let (first, end) = sh.page_range(addr, len);
        let shift = sh.page_shift;
        match started
            .uffd
            .register((first << shift) as usize, ((end - first) << shift) as usize)
        {
            Ok(()) => {
                reg.pages.add(first, end);
                reg.regions.insert(
                    lkey,
                    Watched {
                        mr: Arc::clone(mr),
                        pages: (first, end),
                    },
                );
            }
            Err(errno) => {
                sh.unwatched.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(lkey, errno, "not watched: UFFDIO_REGISTER refused");
            }
        }
    }

    /// Stop watching the region `lkey` (idempotent). Call with no region lock held.
    pub(crate) fn unwatch(&self, lkey: u32) {
        let Some(Ok(started)) = self.started.get() else {
            return;
        };
        let mut reg = lock(&self.shared.registry);
        if let Some(w) = reg.regions.remove(&lkey) {
            let freed = reg.pages.sub(w.pages.0, w.pages.1);
            self.shared.unregister(&started.uffd, &freed);
        }
    }
}

impl Drop for Coherence {
    fn drop(&mut self) {
        if let Some(Ok(s)) = self.started.get_mut() {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live local to our own eventfd.
            let _ = unsafe { libc::write(s.stop.as_raw_fd(), one.as_ptr().cast(), 8) };
            // The last owner may let go on the watcher thread itself (a notify hook that held
            // the device the moment it was closed): it then ends on its own, unjoined.
            if let Some(t) = s.thread.take()
                && t.thread().id() != std::thread::current().id()
                && t.join().is_err()
            {
                tracing::warn!("the coherence watcher panicked");
            }
        }
    }
}

/// Open the userfaultfd and start the thread.
fn start(shared: Arc<Shared>) -> Result<Started, OpenError> {
    let uffd = Arc::new(Uffd::open()?);
    // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if efd < 0 {
        return Err(OpenError {
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            what: "eventfd failed",
        });
    }
    // SAFETY: a descriptor the kernel just created for us.
    let stop = unsafe { OwnedFd::from_raw_fd(efd) };
    let (u, s) = (Arc::clone(&uffd), stop.as_raw_fd());
    let thread =
        crate::thread::spawn("softrdma-watch", move || run(&shared, &u, s)).map_err(|e| {
            OpenError {
                errno: e.raw_os_error().unwrap_or(0),
                what: "cannot start the watcher thread",
            }
        })?;
    tracing::debug!(features = uffd.features, "coherence watcher started");
    Ok(Started {
        uffd,
        stop,
        thread: Some(thread),
    })
}

/// The watcher thread: wait for events or the stop signal.
fn run(shared: &Shared, uffd: &Uffd, stop: RawFd) {
    let mut buf = vec![0u8; MSG_LEN * BATCH];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: uffd.raw(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            tracing::error!(%e, "coherence watcher: poll failed; stopping");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            tracing::error!(
                revents = fds[0].revents,
                "coherence watcher: userfaultfd failed"
            );
            return;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            shared.handle(uffd, &mut buf);
        }
    }
}

/// What happens to a region for one event.
enum Verdict {
    Untouched,
    Invalidate(InvalidationCause),
    Follow(*mut u8),
}

impl Shared {
    /// Page numbers `[first, end)` covering `len > 0` bytes at `addr`.
    fn page_range(&self, addr: usize, len: usize) -> (u64, u64) {
        let s = self.page_shift;
        let first = (addr as u64) >> s;
        let last = (addr as u64).saturating_add(len as u64 - 1) >> s;
        (first, last + 1)
    }

    fn unregister(&self, uffd: &Uffd, ranges: &[(u64, u64)]) {
        let s = self.page_shift;
        for &(a, b) in ranges {
            // Fails harmlessly when the pages are gone already.
            if let Err(errno) = uffd.unregister((a << s) as usize, ((b - a) << s) as usize) {
                tracing::trace!(errno, "UFFDIO_UNREGISTER");
            }
        }
    }

    pub(crate) fn is_watched(&self, lkey: u32) -> bool {
        lock(&self.registry).regions.contains_key(&lkey)
    }

    pub(crate) fn take(&self) -> Vec<Invalidation> {
        lock(&self.queue).drain(..).collect()
    }

    /// Queue `inv` (bounded) and run the callback; call with no memory-table lock held.
    pub(crate) fn publish(&self, inv: &[Invalidation]) {
        self.enqueue(inv);
        self.notify(inv);
    }

    /// Queue `inv`, counting what does not fit (the queue's mutex is a leaf lock).
    fn enqueue(&self, inv: &[Invalidation]) {
        let mut q = lock(&self.queue);
        for &i in inv {
            if q.len() < INVALIDATION_QUEUE {
                q.push_back(i);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// An access by QP `qpn` through `key` met an invalidated key or vanished memory.
    pub(crate) fn note_violation(&self, qpn: u32, key: u32) {
        let notify = read(&self.violation_notify).clone();
        if let Some(f) = notify {
            f(qpn, key);
        }
    }

    /// Run the callback for `inv`; call with no memory-table lock held.
    fn notify(&self, inv: &[Invalidation]) {
        if inv.is_empty() {
            return;
        }
        for hook in [&self.device_notify, &self.notify] {
            let notify = read(hook).clone();
            if let Some(f) = notify {
                for &i in inv {
                    f(i);
                }
            }
        }
    }

    /// Handle what is pending on the descriptor (see the module documentation for the order).
    fn handle(&self, uffd: &Uffd, buf: &mut [u8]) {
        let mut reg = lock(&self.registry);
        let snapshot: Vec<(u32, Arc<Mr>)> = reg
            .regions
            .iter()
            .map(|(&k, w)| (k, Arc::clone(&w.mr)))
            .collect();
        let mut guards: Vec<_> = snapshot
            .iter()
            .map(|(k, mr)| (*k, write(&mr.state)))
            .collect();
        let mut out = Vec::new();
        let mut unregister = Vec::new();
        for _ in 0..READS_PER_WAKE {
            let n = match uffd.read(buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(errno) => {
                    tracing::warn!(errno, "coherence watcher: read failed");
                    break;
                }
            };
            for m in buf[..n].chunks_exact(MSG_LEN) {
                self.events.fetch_add(1, Ordering::Relaxed);
                let msg = decode(m);
                tracing::debug!(?msg, "userfaultfd event");
                for (lkey, st) in guards.iter_mut() {
                    self.apply(msg, *lkey, st, &mut reg, &mut out, &mut unregister);
                }
            }
        }
        // Queued before the regions are released, so whoever sees a region invalidated also
        // finds it in the queue; the callback runs with no lock held.
        self.invalidations
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.enqueue(&out);
        drop(guards);
        drop(reg);
        if !unregister.is_empty() {
            self.unregister(uffd, &unregister);
        }
        self.notify(&out);
    }

    /// Decide and apply what `msg` does to one region (its state write-locked).
    fn apply(
        &self,
        msg: Msg,
        lkey: u32,
        st: &mut MrState,
        reg: &mut Registry,
        out: &mut Vec<Invalidation>,
        unregister: &mut Vec<(u64, u64)>,
    ) {
        if !st.backing.is_raw() || st.status == MrStatus::Invalidated {
            return;
        }
        let s = self.page_shift;
        let ptr = st.backing.ptr();
        let (first, end) = self.page_range(ptr as usize, st.backing.len());
        let (lo, hi) = ((first << s) as usize, (end << s) as usize);
        let overlaps = |a: usize, b: usize| a < hi && lo < b;
        let (verdict, gone) = match msg {
            Msg::Unmap { start, end: e } if overlaps(start, e) => (
                Verdict::Invalidate(InvalidationCause::Unmapped),
                Some((start, e)),
            ),
            Msg::Remove { start, end: e } if overlaps(start, e) => {
                (Verdict::Invalidate(InvalidationCause::Discarded), None)
            }
            Msg::Remap { from, to, len } if overlaps(from, from.saturating_add(len)) => {
                let inside = from <= lo && hi <= from.saturating_add(len);
                if inside && st.remap == RemapPolicy::Follow {
                    let moved = (ptr as usize).wrapping_sub(from).wrapping_add(to);
                    (Verdict::Follow(moved as *mut u8), None)
                } else {
                    (
                        Verdict::Invalidate(InvalidationCause::Remapped),
                        Some((from, from.saturating_add(len))),
                    )
                }
            }
            _ => (Verdict::Untouched, None),
        };
        let to_pages = |(a, b): (usize, usize)| ((a as u64) >> s, (b as u64).div_ceil(1 << s));
        match verdict {
            Verdict::Untouched => {}
            Verdict::Follow(new) => {
                let len = st.backing.len();
                // The pages keep their lock across the move: drop the old addresses from the
                // accounting without unlocking, then account (and lock, a no-op) the new ones.
                let pinned = st.pin.is_some();
                self.pinner.release(st.pin.take(), (first, end));
                if pinned {
                    match self.pinner.pin(new as usize, len, false) {
                        Ok(p) => st.pin = p,
                        Err(e) => {
                            tracing::warn!(lkey, %e, "cannot pin moved memory: invalidating");
                            st.status = MrStatus::Invalidated;
                            st.cause = Some(InvalidationCause::Remapped);
                            self.forget(lkey, reg, unregister);
                            out.push(Invalidation {
                                lkey,
                                cause: InvalidationCause::Remapped,
                            });
                            return;
                        }
                    }
                }
                st.backing.rebase(new);
                self.follows.fetch_add(1, Ordering::Relaxed);
                let (nf, ne) = self.page_range(new as usize, len);
                if let Some(w) = reg.regions.get_mut(&lkey) {
                    // The userfaultfd registration moved with the mapping.
                    reg.pages.sub(w.pages.0, w.pages.1);
                    reg.pages.add(nf, ne);
                    w.pages = (nf, ne);
                }
                tracing::info!(lkey, from = ?ptr, to = ?new, "region follows its memory");
            }
            Verdict::Invalidate(cause) => {
                st.status = MrStatus::Invalidated;
                st.cause = Some(cause);
                if let Some(g) = gone {
                    // The pages left these addresses: forget them without unlocking; unlock
                    // the rest of the region (still mapped) as deregistration would.
                    self.pinner.release(st.pin.take(), to_pages(g));
                    self.forget(lkey, reg, unregister);
                }
                out.push(Invalidation { lkey, cause });
                tracing::info!(lkey, ?cause, "region invalidated");
            }
        }
    }

    /// Drop `lkey` from the registry; its pages no other region covers are unregistered.
    fn forget(&self, lkey: u32, reg: &mut Registry, unregister: &mut Vec<(u64, u64)>) {
        if let Some(w) = reg.regions.remove(&lkey) {
            unregister.extend(reg.pages.sub(w.pages.0, w.pages.1));
        }
    }
}
