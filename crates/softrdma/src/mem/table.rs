//! The key table: one fixed array of slots, indexed by the index bits of a key.
//!
//! # Why this shape
//! The data path (several threads: the posting threads and the progress thread) resolves a
//! key on every packet. A lookup is `slots[key >> 8]`: no hashing, no global lock. Each slot
//! is its own `RwLock`, so threads that use different keys never touch the same lock, and
//! threads that share a key only share that slot's reader count. The read guard of the slot
//! (and of the region's state, see [`Mr`]) is held during the copy, which makes the lock the
//! in-flight counter that `suspend`, `invalidate`, `rereg` and `dereg` wait on. A zero-copy
//! send outlives its lookup and is counted apart, by its [`Lent`](super::Lent) guard
//! ([`lend`](super::lend)). The control path allocates keys under one mutex (the key
//! allocator), which the data path never takes.
//!
//! A seqlock or an `ArcSwap`-style pointer would make uncontended reads cheaper still, but would
//! need a separate in-flight counter to let `suspend` wait, and epoch reclamation for freed
//! regions; the measured cost of this scheme (docs/PERFORMANCE.md) did not call for that.
//!
//! Lock order (never taken in the other direction): window slot → region slot → region
//! state → key allocator / PD table / pinning manager.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::arena::Arena;
use super::copy::{CopyMode, checked_copy_available};
use super::key::{KeyAllocator, MAX_KEY_INDEX, key_index, slot_bits};
use super::pd::PdTable;
use super::pin::{PinLimits, PinMode, Pinner};
use super::region::Mr;
use super::watch::Coherence;
use super::window::Mw;
use super::{Access, AccessError, MemError, RawCopy, RemapPolicy, WatchMode};

/// Configuration of a device's memory subsystem. Every table is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemConfig {
    /// Pinning policy.
    pub pin_mode: PinMode,
    /// Most bytes this device may pin (on top of `RLIMIT_MEMLOCK`), `None` for no quota.
    pub pin_quota: Option<u64>,
    /// Most regions plus windows (key-table slots), at most 2^24 - 1. The key index bits the
    /// table does not need for its slots are random salt (`mem::key`): 2^16 - 1 slots
    /// leave 8 bits of salt and give keys 32 bits of entropy.
    pub max_keys: u32,
    /// Most protection domains.
    pub max_pds: u32,
    /// Most bytes of device-allocated memory.
    pub max_device_bytes: u64,
    /// Whether raw regions are watched for unmap, remap and discard (userfaultfd events).
    pub watch: WatchMode,
    /// What `mremap` does to a raw region that did not choose
    /// ([`MemSource::remap_policy`](super::MemSource::remap_policy)).
    pub remap_policy: RemapPolicy,
    /// How raw regions are copied.
    pub raw_copy: RawCopy,
    /// Most regions watched at once (each watched range may split a mapping of the process
    /// in up to three, and `vm.max_map_count` bounds mappings); further raw regions are
    /// registered unwatched.
    pub max_watched: u32,
}

impl Default for MemConfig {
    fn default() -> MemConfig {
        MemConfig {
            pin_mode: PinMode::Pinned,
            pin_quota: None,
            max_keys: (1 << 16) - 1,
            max_pds: 1 << 12,
            max_device_bytes: 4 << 30,
            watch: WatchMode::On,
            remap_policy: RemapPolicy::Invalidate,
            raw_copy: RawCopy::Checked,
            max_watched: 4096,
        }
    }
}

/// Run-time counters, like a NIC's hardware counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Registered regions.
    pub regions: u64,
    /// Allocated memory windows.
    pub windows: u64,
    /// Allocated protection domains.
    pub pds: u64,
    /// Bytes pinned by this device (each page counted once).
    pub pinned_bytes: u64,
    /// Registrations refused by a pinning limit.
    pub pin_refusals: u64,
    /// Bytes of device-allocated memory.
    pub device_bytes: u64,
    /// Raw regions the watcher is watching.
    pub watched_regions: u64,
    /// Raw regions registered while the watcher was on that it could not watch (watcher
    /// unavailable, mapping refused by `UFFDIO_REGISTER`, or `max_watched` reached).
    pub unwatched_regions: u64,
    /// userfaultfd events read (UNMAP, REMAP, REMOVE).
    pub coherence_events: u64,
    /// Regions invalidated by the watcher.
    pub watch_invalidations: u64,
    /// Regions that followed their memory to a new address.
    pub remaps_followed: u64,
    /// Accesses that failed with `Fault`.
    pub access_faults: u64,
    /// Invalidations that did not fit in the queue of `take_invalidations`.
    pub invalidations_dropped: u64,
}

/// What a slot holds.
pub(crate) enum Entry {
    Free,
    /// A region; its L_Key and R_Key are both `key`.
    Mr {
        key: u32,
        mr: Arc<Mr>,
    },
    Mw(Mw),
}

/// The registered memory of one device: protection domains, regions, windows and keys.
/// Implements [`MemoryAccess`](super::MemoryAccess) for the transport.
pub struct MemoryTable {
    /// Slot 0 is never used.
    pub(crate) slots: Box<[RwLock<Entry>]>,
    /// The key-index bits that name a slot (the rest is salt).
    slot_mask: u32,
    pub(crate) keys: Mutex<KeyAllocator>,
    pub(crate) pds: PdTable,
    pub(crate) pinner: Arc<Pinner>,
    pub(crate) arena: Arena,
    pub(crate) regions: AtomicU64,
    pub(crate) windows: AtomicU64,
    /// How raw regions are copied (config, downgraded to `Plain` if checked copies are refused).
    pub(crate) raw_copy: CopyMode,
    pub(crate) coherence: Coherence,
    config: MemConfig,
}

impl core::fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MemoryTable")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Read-lock, ignoring poisoning (no code panics while holding these locks, and a poisoned
/// lock must not turn into a panic on the data path).
#[inline]
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-lock, ignoring poisoning.
#[inline]
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryTable {
    /// A memory table with `config`.
    pub fn new(config: MemConfig) -> Result<MemoryTable, MemError> {
        if config.max_keys == 0 || config.max_keys > MAX_KEY_INDEX {
            return Err(MemError::InvalidConfig("max_keys must be in 1..2^24"));
        }
        if config.max_pds == 0 {
            return Err(MemError::InvalidConfig("max_pds must be positive"));
        }
        let slots = (0..=config.max_keys)
            .map(|_| RwLock::new(Entry::Free))
            .collect();
        let raw_copy = match config.raw_copy {
            RawCopy::Plain => CopyMode::Plain,
            RawCopy::Checked if super::fault::arm() || checked_copy_available() => {
                CopyMode::Checked
            }
            RawCopy::Kernel if checked_copy_available() => CopyMode::Kernel,
            RawCopy::Checked | RawCopy::Kernel => {
                tracing::warn!(
                    "process_vm_readv/writev refused: raw regions use plain copies, and an \
                     unmap of registered memory can crash the process"
                );
                CopyMode::Plain
            }
        };
        let pinner = Arc::new(Pinner::new(config.pin_mode, config.pin_quota));
        Ok(MemoryTable {
            slots,
            slot_mask: (1 << slot_bits(config.max_keys)) - 1,
            keys: Mutex::new(KeyAllocator::new(config.max_keys)),
            pds: PdTable::new(config.max_pds),
            coherence: Coherence::new(
                config.watch,
                config.remap_policy,
                config.max_watched,
                Arc::clone(&pinner),
            ),
            raw_copy,
            pinner,
            arena: Arena::new(config.max_device_bytes),
            regions: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MemConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> MemStats {
        let sh = &self.coherence.shared;
        MemStats {
            regions: self.regions.load(Ordering::Relaxed),
            windows: self.windows.load(Ordering::Relaxed),
            pds: self.pds.count(),
            pinned_bytes: self.pinner.pinned_bytes(),
            pin_refusals: self.pinner.refusals(),
            device_bytes: self.arena.used(),
            watched_regions: self.coherence.watched_count(),
            unwatched_regions: sh.unwatched.load(Ordering::Relaxed),
            coherence_events: sh.events.load(Ordering::Relaxed),
            watch_invalidations: sh.invalidations.load(Ordering::Relaxed),
            remaps_followed: sh.follows.load(Ordering::Relaxed),
            access_faults: sh.faults.load(Ordering::Relaxed),
            invalidations_dropped: sh.dropped.load(Ordering::Relaxed),
        }
    }

    /// The limits pinning runs under.
    pub fn pin_limits(&self) -> PinLimits {
        self.pinner.limits()
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<u32, MemError> {
        self.pds.alloc()
    }

    /// Deallocate a protection domain; refused while it holds regions or windows.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), MemError> {
        self.pds.dealloc(pd)
    }

    /// The slot number of `key` (its index without the salt). The entry in the slot holds
    /// the whole key, so a key with the right slot but wrong salt or tag is still refused.
    #[inline]
    pub(crate) fn slot_index(&self, key: u32) -> u32 {
        key_index(key) & self.slot_mask
    }

    /// The slot `key` names, or `InvalidKey`.
    #[inline]
    pub(crate) fn slot(&self, key: u32) -> Result<&RwLock<Entry>, AccessError> {
        match self.slot_index(key) {
            0 => Err(AccessError::InvalidKey(key)),
            i => self
                .slots
                .get(i as usize)
                .ok_or(AccessError::InvalidKey(key)),
        }
    }

    pub(crate) fn key_alloc(&self) -> MutexGuard<'_, KeyAllocator> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new key, or `TableFull`.
    pub(crate) fn new_key(&self) -> Result<u32, MemError> {
        self.key_alloc().alloc()?.ok_or(MemError::TableFull {
            what: "memory keys (regions + windows)",
            limit: self.config.max_keys as u64,
        })
    }
}

/// Access flags that mean "do not pin this region".
pub(crate) fn wants_on_demand(a: Access) -> bool {
    a.contains(Access::ON_DEMAND)
}
