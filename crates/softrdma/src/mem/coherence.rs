//! Registration coherence: what the application may do to registered raw memory behind the
//! engine's back (`munmap`, `mremap`, `madvise`), and how the device reacts.
//!
//! Two mechanisms, each useful without the other:
//! - **Checked placement** ([`RawCopy::Checked`], see `copy.rs`): every copy into or out of a
//!   raw region goes through the kernel, so a vanished page fails the access with
//!   [`AccessError::Fault`](super::AccessError::Fault) instead of crashing the process.
//! - **The watcher** ([`WatchMode::On`], see `watch.rs`): a thread reading userfaultfd's
//!   non-cooperative events for the page ranges of raw regions. On an unmap (`UNMAP`) or a
//!   discard (`REMOVE`: `MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`) of registered pages the
//!   region is invalidated: every later access through its key, or through a window bound to
//!   it, fails with [`AccessError::Invalidated`](super::AccessError::Invalidated). On a move
//!   (`REMAP`: `mremap`) the region's [`RemapPolicy`] decides: follow the memory to its new
//!   address (same IOVA, same keys) or invalidate.
//!
//! The engine learns of invalidations in two ways: the next access through the key fails
//! (the responder NAKs, the requester completes in error), and [`MemoryTable::take_invalidations`]
//! (or the callback of [`MemoryTable::set_invalidation_notify`]) lists the regions, so the
//! engine can tear down the QPs that used them without waiting for traffic.
//!
//! # Privileges
//! The watcher opens its userfaultfd with `UFFD_USER_MODE_ONLY`, which Linux (5.11 and later)
//! grants to every user regardless of `vm.unprivileged_userfaultfd`; it falls back to a
//! descriptor without the flag (root or `CAP_SYS_PTRACE`, or the sysctl at 1) and to
//! `/dev/userfaultfd` (Linux 6.1; access to the device node). A seccomp filter (container
//! runtimes often refuse `userfaultfd` without `CAP_SYS_PTRACE`), an LSM, or a kernel built
//! without `CONFIG_USERFAULTFD` can still refuse it. Then registration works as before,
//! [`MemoryTable::watch_status`] says [`WatchStatus::Unavailable`] and the
//! `unwatched_regions` counter grows: accesses to vanished memory fail with `Fault` (checked
//! placement needs no privilege), moves are not followed, and memory mapped anew at a
//! registered address is not noticed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::region::MrStatus;
use super::table::{Entry, read, write};
use super::{MemError, MemoryTable};

/// Whether raw registrations are watched for unmap/remap/discard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchMode {
    /// No watcher: a vanished page makes accesses fail with `Fault` (with checked placement).
    Off,
    /// A watcher thread, started on the first raw registration, invalidates or follows.
    #[default]
    On,
}

/// What a raw region does when the application moves its memory with `mremap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RemapPolicy {
    /// The region now refers to the new address; IOVA and keys unchanged. A move of only a
    /// part of the region cannot be followed and invalidates it.
    Follow,
    /// The region is invalidated, as if its memory had been unmapped.
    #[default]
    Invalidate,
}

/// How raw memory is copied (owned, file-backed and device memory always use `memcpy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RawCopy {
    /// Checked copies: a vanished page fails the access with `Fault`, never a signal. On
    /// x86-64 Linux they are *caught* copies (plain instructions whose faults a `SIGSEGV`/
    /// `SIGBUS` handler turns into errors; see `mem/fault.rs`), elsewhere, or once a program
    /// replaced that handler, the kernel's (`process_vm_writev`/`readv`). Falls back to
    /// `Plain` where neither works (see [`MemoryTable::checked_copy`]).
    #[default]
    Checked,
    /// Always the kernel's checked copies (`process_vm_writev`/`readv`), one system call per
    /// access: for programs that own `SIGSEGV` and `SIGBUS` without chaining to handlers
    /// installed before theirs.
    Kernel,
    /// `memcpy`, as for owned memory: faster, but a vanished page crashes the process. For
    /// applications that never unmap registered memory.
    Plain,
}

/// State of a device's watcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStatus {
    /// Configured off.
    Off,
    /// On, not started yet (no raw region registered so far).
    Idle,
    /// Watching.
    Active {
        /// Whether the kernel has `UFFD_FEATURE_WP_ASYNC` (Linux 6.7), which lets any kind of
        /// mapping be watched; without it only anonymous memory, shmem and hugetlbfs can be.
        any_mapping: bool,
    },
    /// No userfaultfd could be opened.
    Unavailable {
        /// `errno` of the refusal.
        errno: i32,
        /// What was refused.
        reason: &'static str,
    },
}

/// Why a region was invalidated behind the application's verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidationCause {
    /// Pages of the region were unmapped (`munmap`, a shrinking `mremap`, `MAP_FIXED` over it).
    Unmapped,
    /// Pages of the region were discarded (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`);
    /// the region was invalidated before the kernel freed them.
    Discarded,
    /// The region's memory moved (`mremap`) and its policy is `Invalidate`, or only part of
    /// it moved.
    Remapped,
    /// An access faulted (the memory vanished and the watcher is off or has not caught up).
    /// The region is not marked invalidated by this; every access to the missing pages fails
    /// with `Fault`. Reported once per backing.
    Faulted,
}

/// A region that became unusable: the engine should move the QPs that used `lkey` (or
/// windows bound to it) to the error state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidation {
    /// The region's key (L_Key = R_Key).
    pub lkey: u32,
    /// What happened.
    pub cause: InvalidationCause,
}

/// Whether a region can be accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionState {
    /// Accesses proceed.
    Active,
    /// Suspended by the application (`suspend`): remote requests are RNR NAKed until `resume`.
    Suspended,
    /// Invalidated (by the watcher, or by a verb: local invalidation, SEND with Invalidate);
    /// final until re-registration.
    Invalidated,
}

/// How a region is protected against changes of its memory, and where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionCoherence {
    /// Active, suspended or invalidated.
    pub state: RegionState,
    /// What invalidated it behind the application's verbs (`None` when it is not invalidated
    /// or a verb did it), or [`InvalidationCause::Faulted`] when an access to its current
    /// memory faulted.
    pub cause: Option<InvalidationCause>,
    /// The watcher is watching this region's pages.
    pub watched: bool,
    /// What a move of its memory does.
    pub remap: RemapPolicy,
    /// Accesses use kernel-checked copies.
    pub checked_copy: bool,
}

/// A callback for invalidations (called from the watcher thread, or from the thread whose
/// access faulted, with no lock of the memory table held). It must not block for long: while
/// it runs, a thread of the application that unmaps watched memory may be waiting. It must not
/// itself unmap, move or discard registered raw memory (the watcher would wait for itself).
pub type InvalidationNotify = Arc<dyn Fn(Invalidation) + Send + Sync>;

impl MemoryTable {
    /// The watcher's state.
    pub fn watch_status(&self) -> WatchStatus {
        self.coherence.status()
    }

    /// Whether raw regions are copied with checked copies, caught or the kernel's (false
    /// when configured [`RawCopy::Plain`], or when neither works here).
    pub fn checked_copy(&self) -> bool {
        self.raw_copy != super::copy::CopyMode::Plain
    }

    /// Drain the invalidations noticed since the last call, oldest first. The queue is
    /// bounded ([`INVALIDATION_QUEUE`] entries); what did not fit is counted in
    /// `MemStats::invalidations_dropped` (the accesses still fail).
    pub fn take_invalidations(&self) -> Vec<Invalidation> {
        self.coherence.shared.take()
    }

    /// Install (or remove) a callback run for every invalidation as it is noticed, besides
    /// the queue of [`take_invalidations`](Self::take_invalidations).
    pub fn set_invalidation_notify(&self, notify: Option<InvalidationNotify>) {
        *write(&self.coherence.shared.notify) = notify;
    }

    /// Install the device's own callbacks: for invalidations (run before the
    /// application's), and for accesses by a QP that met an invalidated key or vanished memory.
    pub(crate) fn set_device_notify(
        &self,
        invalidation: Option<InvalidationNotify>,
        violation: Option<super::watch::ViolationNotify>,
    ) {
        *write(&self.coherence.shared.device_notify) = invalidation;
        *write(&self.coherence.shared.violation_notify) = violation;
    }

    /// True when `key` reaches the region `lkey`: it is the region's key, or the R_Key of a
    /// window bound to it.
    pub fn key_reaches_region(&self, key: u32, lkey: u32) -> bool {
        key == lkey
            || self
                .query_mw(key)
                .is_ok_and(|w| w.bound.is_some_and(|b| b.mr_lkey == lkey))
    }

    /// Change the remap policy of the region `lkey`.
    pub fn set_remap_policy(&self, lkey: u32, policy: RemapPolicy) -> Result<(), MemError> {
        let g = read(self.slot(lkey)?);
        match &*g {
            Entry::Mr { key, mr } if *key == lkey => {
                write(&mr.state).remap = policy;
                Ok(())
            }
            _ => Err(MemError::InvalidKey(lkey)),
        }
    }

    /// How the region `lkey` is protected.
    pub fn region_coherence(&self, lkey: u32) -> Result<RegionCoherence, MemError> {
        let g = read(self.slot(lkey)?);
        match &*g {
            Entry::Mr { key, mr } if *key == lkey => {
                let st = read(&mr.state);
                let faulted = mr.faulted.load(Ordering::Acquire);
                Ok(RegionCoherence {
                    state: match st.status {
                        MrStatus::Valid => RegionState::Active,
                        MrStatus::Suspended => RegionState::Suspended,
                        MrStatus::Invalidated => RegionState::Invalidated,
                    },
                    cause: st.cause.or(faulted.then_some(InvalidationCause::Faulted)),
                    watched: self.coherence.shared.is_watched(lkey),
                    remap: st.remap,
                    checked_copy: st.backing.is_raw() && self.checked_copy(),
                })
            }
            _ => Err(MemError::InvalidKey(lkey)),
        }
    }

    /// Record that an access to region `lkey` faulted (once per backing).
    pub(crate) fn note_fault(&self, lkey: u32, mr: &super::region::Mr) {
        self.coherence.shared.faults.fetch_add(1, Ordering::Relaxed);
        if !mr.faulted.swap(true, Ordering::AcqRel) {
            tracing::info!(lkey, "access to a raw region faulted: its memory vanished");
            self.coherence.shared.publish(&[super::Invalidation {
                lkey,
                cause: InvalidationCause::Faulted,
            }]);
        }
    }
}

/// Bound of the invalidation queue.
pub const INVALIDATION_QUEUE: usize = 4096;
