//! Errors of the control path: registration, deregistration, windows, protection domains.
//!
//! The data path reports [`AccessError`](super::AccessError) instead (one variant per NAK or
//! completion status the transport may need).

use super::{AccessError, MemSource};

/// Which limit refused a pinned registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinLimitKind {
    /// The process's `RLIMIT_MEMLOCK` (the process lacks `CAP_IPC_LOCK`).
    Rlimit,
    /// The device's own pinning quota ([`MemConfig::pin_quota`](super::MemConfig)).
    Quota,
}

impl core::fmt::Display for PinLimitKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            PinLimitKind::Rlimit => "RLIMIT_MEMLOCK",
            PinLimitKind::Quota => "the device pinning quota",
        })
    }
}

/// Why a control-path operation failed. A failed operation changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// No protection domain has this handle.
    #[error("unknown protection domain {0}")]
    InvalidPd(u32),
    /// The access flags are malformed or break an IB rule.
    #[error("invalid access flags {flags:#x}: {why}")]
    InvalidAccess {
        /// Flags given.
        flags: u32,
        /// The rule broken.
        why: &'static str,
    },
    /// No region or window has this key.
    #[error("invalid key {0:#010x}")]
    InvalidKey(u32),
    /// The address range is malformed (it wraps past the top of the address space, or is not
    /// the size the operation needs).
    #[error("invalid range {iova:#x}+{len}: {why}")]
    InvalidRange {
        /// Start address.
        iova: u64,
        /// Length.
        len: u64,
        /// The rule broken.
        why: &'static str,
    },
    /// A region still has memory windows bound to it (`EBUSY`).
    #[error("region {key:#010x} is busy: {windows} memory window(s) bound to it")]
    RegionBusy {
        /// Region key.
        key: u32,
        /// Windows still bound.
        windows: u32,
    },
    /// A protection domain still has regions or windows (`EBUSY`).
    #[error("protection domain {pd} is busy: {objects} region(s)/window(s) still in it")]
    PdBusy {
        /// PD handle.
        pd: u32,
        /// Objects still in it.
        objects: u32,
    },
    /// A bounded table is full.
    #[error("too many {what}: the limit is {limit}")]
    TableFull {
        /// What kind of object.
        what: &'static str,
        /// The configured bound.
        limit: u64,
    },
    /// A pinned registration would exceed a limit; nothing was pinned.
    #[error(
        "cannot pin a {asked}-byte registration: it needs {needed} more pinned bytes but only \
         {free} of {limit} are free under {kind}"
    )]
    PinLimit {
        /// Bytes of the registration (its length).
        asked: u64,
        /// Bytes of pages not yet pinned by this device that it would pin.
        needed: u64,
        /// Bytes still free under the limit.
        free: u64,
        /// The limit, in bytes.
        limit: u64,
        /// Which limit.
        kind: PinLimitKind,
    },
    /// A system call failed.
    #[error("{op} failed: errno {errno}")]
    Os {
        /// What was attempted.
        op: &'static str,
        /// `errno`.
        errno: i32,
    },
    /// The object is not in a state that allows the operation.
    #[error("key {key:#010x}: {why}")]
    InvalidState {
        /// Key of the object.
        key: u32,
        /// What is wrong.
        why: &'static str,
    },
    /// The configuration is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// An error of the data-path kind (for example from a bind).
    #[error(transparent)]
    Access(#[from] AccessError),
}

impl MemError {
    /// `MemError::Os` from the current `errno`.
    pub(crate) fn last_os(op: &'static str) -> MemError {
        MemError::Os {
            op,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }
}

/// A refused registration: the error, and the memory source handed back unchanged so an owned
/// buffer is never lost.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct RegError {
    /// Why it was refused.
    pub error: MemError,
    /// The source that was offered, returned to the caller (absent when none was offered).
    pub offered: Option<MemSource>,
}

impl RegError {
    pub(crate) fn new(error: MemError, offered: Option<MemSource>) -> RegError {
        RegError { error, offered }
    }
}

impl From<RegError> for MemError {
    fn from(e: RegError) -> MemError {
        e.error
    }
}

impl From<MemError> for RegError {
    fn from(error: MemError) -> RegError {
        RegError {
            error,
            offered: None,
        }
    }
}
