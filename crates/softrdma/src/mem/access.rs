//! The contract between the transport and registered memory.
//!
//! The transport (`rc`) never touches application memory directly: every placement
//! (incoming SEND/WRITE payload, READ response data, atomic) and every fetch (outgoing
//! SEND/WRITE payload, READ response generation) goes through [`MemoryAccess`], which
//! validates key, protection domain, bounds, access rights, window binding and state,
//! and then copies. Tests substitute plain buffers; the memory subsystem implements it for
//! real regions and windows.

/// Access rights, with the bit values of libibverbs' `enum ibv_access_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

impl Access {
    /// No rights beyond local read (which every region has).
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`
    pub const REMOTE_READ: Access = Access(4);
    /// `IBV_ACCESS_REMOTE_ATOMIC`
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// `IBV_ACCESS_MW_BIND`
    pub const MW_BIND: Access = Access(16);
    /// `IBV_ACCESS_ZERO_BASED`
    pub const ZERO_BASED: Access = Access(32);
    /// `IBV_ACCESS_ON_DEMAND`
    pub const ON_DEMAND: Access = Access(64);
    /// `IBV_ACCESS_HUGETLB`
    pub const HUGETLB: Access = Access(128);
    /// `IBV_ACCESS_FLUSH_GLOBAL`
    pub const FLUSH_GLOBAL: Access = Access(256);
    /// `IBV_ACCESS_FLUSH_PERSISTENT`
    pub const FLUSH_PERSISTENT: Access = Access(512);
    /// `IBV_ACCESS_RELAXED_ORDERING` (the first optional flag: may be ignored)
    pub const RELAXED_ORDERING: Access = Access(1 << 20);
    /// Optional flags (`IBV_ACCESS_OPTIONAL_RANGE`): accepted and ignored when not supported.
    pub const OPTIONAL_RANGE: u32 = 0x3ff0_0000;

    /// True when every bit of `other` is set in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Bitwise union.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// Who is asking: the protection domain and queue pair on whose behalf memory is touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AccessCtx {
    /// Protection domain handle of the QP.
    pub pd: u32,
    /// The local QP number (type 2 windows are usable only through the QP they are bound to).
    pub qpn: u32,
}

/// A 64-bit atomic operation on 8 naturally aligned bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// If the current value equals `compare`, store `swap`. Returns the original value.
    CompareSwap {
        /// Value compared with the target.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// Add `add` (wrapping). Returns the original value.
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Why a memory access was refused. Each maps to a NAK or a completion status in the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region or window has this key (or its key part is stale).
    #[error("invalid key {0:#010x}")]
    InvalidKey(u32),
    /// The key exists but belongs to another protection domain.
    #[error("key {0:#010x} belongs to another protection domain")]
    WrongPd(u32),
    /// `[iova, iova+len)` is not inside the region or window (or overflows).
    #[error("range {iova:#x}+{len} outside key {key:#010x}")]
    OutOfBounds {
        /// Key used.
        key: u32,
        /// Start address asked for.
        iova: u64,
        /// Length asked for.
        len: u64,
    },
    /// The region or window lacks a required right.
    #[error("key {key:#010x} lacks access {needed:#x}")]
    AccessDenied {
        /// Key used.
        key: u32,
        /// Rights that were required.
        needed: u32,
    },
    /// The key was invalidated (LOCAL_INV, SEND with Invalidate, or an unmap of its memory).
    #[error("key {0:#010x} was invalidated")]
    Invalidated(u32),
    /// The region is suspended; the requester should back off and retry (RNR NAK).
    #[error("key {0:#010x} is suspended")]
    Suspended(u32),
    /// A type 2 window bound to another QP.
    #[error("key {0:#010x} is bound to another queue pair")]
    WrongQp(u32),
    /// An atomic on an address that is not 8-byte aligned.
    #[error("atomic at unaligned address {0:#x}")]
    Misaligned(u64),
    /// The memory behind the key faulted while being copied (it was unmapped).
    #[error("memory behind key {0:#010x} faulted")]
    Fault(u32),
    /// An operation not valid for this kind of key (for example bind on a region key).
    #[error("invalid operation on key {0:#010x}")]
    InvalidOperation(u32),
}

/// Who asks for an invalidation: the rules differ (`MemoryAccess::invalidate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Invalidator {
    /// The local application: a LOCAL_INV work request on one of its QPs.
    Local,
    /// The peer: an incoming SEND with Invalidate.
    Remote,
}

/// Registered-memory access as the transport needs it. Implementations must be usable from
/// several threads at once and never touch a byte outside a validated range.
pub trait MemoryAccess {
    /// Check that `[iova, iova+len)` under `key` is accessible with `access` by `ctx`,
    /// without touching memory (used on the first packet of a WRITE and for local SGEs).
    fn check(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError>;

    /// Copy `data` into `[iova, iova+data.len())` under `key`, requiring `access`
    /// (`REMOTE_WRITE` for an incoming WRITE, `LOCAL_WRITE` for receive buffers and READ
    /// responses).
    fn write(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        data: &[u8],
        access: Access,
    ) -> Result<(), AccessError>;

    /// Copy `[iova, iova+out.len())` under `key` into `out`, requiring `access`
    /// (`REMOTE_READ` for an incoming READ, `NONE` for local gathers).
    fn read(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        out: &mut [u8],
        access: Access,
    ) -> Result<(), AccessError>;

    /// Lend `[iova, iova+len)` under the region key `key` to the transmit path instead of
    /// copying it, requiring `access` (see [`Lent`](super::Lent)): `Ok(None)` when the memory
    /// must be copied (memory the application may unmap at any moment, windows, or an
    /// implementation that does not lend). Errors are those of [`MemoryAccess::read`].
    fn lend(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<super::Lent>, AccessError> {
        let _ = (ctx, key, iova, len, access);
        Ok(None)
    }

    /// Copy `[iova, iova+len)` under `key` (`access` as for [`MemoryAccess::read`]) into a
    /// staging buffer lent to the transmit path (see [`Lent::staged`](super::Lent)): for
    /// memory [`MemoryAccess::lend`] will not lend where it lies, so that the packets of a
    /// message cut their payloads from one copy. `Ok(None)` when the implementation does not
    /// stage or `len` exceeds [`STAGE_MAX`](super::STAGE_MAX). Errors are those of `read`.
    fn stage(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<super::Lent>, AccessError> {
        let _ = (ctx, key, iova, len, access);
        Ok(None)
    }

    /// [`MemoryAccess::lend`], or, where that would not lend (memory that is copied: raw
    /// memory, windows), [`MemoryAccess::stage`]; an implementation may do both with one
    /// lookup. Errors are those of `lend`.
    fn lend_or_stage(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<super::Lent>, AccessError> {
        match self.lend(ctx, key, iova, len, access)? {
            Some(l) => Ok(Some(l)),
            None => self.stage(ctx, key, iova, len, access),
        }
    }

    /// Bring the first bytes of `[iova, iova+len)` under `key` toward this CPU's cache (a
    /// receive buffer the next message will land in). A hint only: nothing is copied,
    /// nothing can fault, and a key or range that does not resolve is ignored, not reported.
    fn warm(&self, ctx: AccessCtx, key: u32, iova: u64, len: u64) {
        let _ = (ctx, key, iova, len);
    }

    /// Execute an atomic on the 8 bytes at `iova` (must be 8-aligned) under `key`, which
    /// needs `REMOTE_ATOMIC`. Values are in host order. Returns the original value.
    fn atomic(&self, ctx: AccessCtx, key: u32, iova: u64, op: AtomicOp)
    -> Result<u64, AccessError>;

    /// Invalidate `key` for `by`. Only keys of `ctx.pd` may be invalidated, and a type 2
    /// window only through the QP it is bound to. A peer ([`Invalidator::Remote`], SEND with
    /// Invalidate) may invalidate only a type 2 window: an R_Key of a region or a type 1
    /// window is refused with `InvalidOperation` (a region's R_Key is also its L_Key, so a
    /// peer could otherwise revoke the application's own access). The local application
    /// (LOCAL_INV) may also invalidate a region that no window is bound to.
    fn invalidate(&self, ctx: AccessCtx, key: u32, by: Invalidator) -> Result<(), AccessError>;

    /// Bind the type 2 window whose current key is `b.mw_key` to `[b.iova, b.iova+b.len)` of
    /// the region `b.mr_lkey`, with `b.access`, on QP `ctx.qpn`; afterwards its R_Key is
    /// `b.new_rkey`, which differs from `b.mw_key` only in its low 8 bits (as `ibv_inc_rkey`).
    fn bind_mw(&self, ctx: AccessCtx, b: MwBind) -> Result<(), AccessError>;
}

/// A memory window bind ([`MemoryAccess::bind_mw`], a BIND_MW work request): the window whose
/// current key is `mw_key` bound to `[iova, iova+len)` of the region `mr_lkey` with `access`
/// (a zero length unbinds a type 1 window); afterwards its R_Key is `new_rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current key.
    pub mw_key: u32,
    /// The window's R_Key after the bind.
    pub new_rkey: u32,
    /// The region bound to.
    pub mr_lkey: u32,
    /// Start of the bound range (the region's address space).
    pub iova: u64,
    /// Length of the bound range.
    pub len: u64,
    /// The remote access the window grants.
    pub access: Access,
}
