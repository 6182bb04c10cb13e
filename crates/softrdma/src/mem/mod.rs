//! Registered memory: protection domains, regions, windows, keys, pinning.
//!
//! [`MemoryTable`] is one device's registry. The control path registers memory
//! ([`MemoryTable::reg_mr`] with a [`MemSource`] of one of four kinds), binds windows and
//! suspends/resumes regions; the transport reaches memory only through [`MemoryAccess`],
//! which validates key, PD, QP, bounds, rights and state before every copy.
//! Raw memory the application may unmap or move is copied with checked copies (caught ones on
//! x86-64, `fault.rs`; the kernel's elsewhere, see [`RawCopy`]), staged once per message for
//! sending (`Lent::staged`), and watched for changes (see [`WatchMode`], [`RemapPolicy`],
//! [`MemoryTable::take_invalidations`]).
mod access;
mod arena;
mod coherence;
mod copy;
mod error;
mod fault;
mod key;
mod lend;
mod lookup;
mod mr_ops;
mod mw_ops;
mod pagemap;
mod pd;
mod pin;
mod region;
mod source;
mod table;
mod uffd;
mod watch;
mod window;

pub use access::{Access, AccessCtx, AccessError, AtomicOp, Invalidator, MemoryAccess, MwBind};
pub use arena::PageSize;
pub use coherence::{
    INVALIDATION_QUEUE, Invalidation, InvalidationCause, InvalidationNotify, RawCopy,
    RegionCoherence, RegionState, RemapPolicy, WatchMode, WatchStatus,
};
pub use error::{MemError, PinLimitKind, RegError};
pub use key::{KEY_TAG_BITS, MAX_KEY_INDEX, key_index, key_tag, make_key};
pub use lend::{Lent, LentSlice, STAGE_MAX};
pub use mr_ops::{MrInfo, Rereg};
pub use mw_ops::{MwBinding, MwInfo};
pub use pin::{
    PinLimits, PinMode, has_cap_ipc_lock, page_size, process_pinned_bytes, rlimit_memlock,
    vm_locked_bytes,
};
pub use source::{MemSource, Returned};
pub use table::{MemConfig, MemStats, MemoryTable};
pub use window::MwType;
