//! The data path: [`MemoryAccess`] for [`MemoryTable`].
//!
//! Every call resolves the key with one array index and holds that slot's read guard (and the
//! region state's) until its copy is done; see [`table`](super::table) for why.

use std::sync::Arc;

use super::copy::{self, CopyMode, WARM_MAX};
use super::region::{Mr, MrState};
use super::table::{Entry, read};
use super::{
    Access, AccessCtx, AccessError, AtomicOp, Invalidator, Lent, MemoryAccess, MemoryTable,
    STAGE_MAX,
};

impl MemoryTable {
    /// Prefetch (`ibv_advise_mr`): validate `[iova, iova+len)` under the local key `key` for
    /// `ctx`'s PD (`LOCAL_WRITE` too when `write`), then have the kernel populate the pages
    /// behind it (`MADV_POPULATE_WRITE` or `_READ`; `MADV_WILLNEED` on a kernel without them),
    /// so that the first transfer does not fault them in. Nothing is read or written. A range
    /// whose memory is gone is a `Fault`, recorded nowhere (no transfer met it).
    pub fn prefetch(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        write: bool,
    ) -> Result<(), AccessError> {
        let need = if write {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        self.with_target_inner(ctx, key, iova, len, need, |host, _| {
            if len == 0 {
                return Ok(());
            }
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
            let start = host as usize & !(page - 1);
            let end = (host as usize).saturating_add(len as usize);
            let advice = if write {
                libc::MADV_POPULATE_WRITE
            } else {
                libc::MADV_POPULATE_READ
            };
            // SAFETY: madvise only advises about (populates) pages of a range the region
            // covers and that is validated and held in flight above; it changes no byte.
            let rc = unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
            if rc == 0 {
                return Ok(());
            }
            match std::io::Error::last_os_error().raw_os_error() {
                // A kernel before 5.14: only a hint.
                Some(libc::EINVAL) => {
                    // SAFETY: as above.
                    unsafe {
                        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED)
                    };
                    Ok(())
                }
                _ => Err(AccessError::Fault(key)),
            }
        })
    }

    /// How a region's bytes are reached: memory that may vanish under the engine (raw
    /// memory, a file the application can still truncate) as the table is configured for raw
    /// memory, memory the engine keeps mapped and whole with plain copies.
    #[inline]
    fn copy_mode(&self, st: &MrState) -> CopyMode {
        if st.backing.is_raw() || st.backing.may_vanish() {
            self.raw_copy
        } else {
            CopyMode::Plain
        }
    }

    /// Validate `[iova, iova+len)` under `key` for `need` by `ctx`, then run `f` on the host
    /// address (and how to copy there) while the access counts as in flight. A `Fault` from
    /// `f` is recorded against the region once the guards are released. A QP whose access
    /// met an invalidated key or vanished memory is reported to the device (it ends in the
    /// error state: an access violation, `AsyncEvent::QpAccessError`).
    #[inline]
    fn with_target<R>(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(*mut u8, CopyMode) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        self.noting_violation(
            ctx,
            key,
            self.with_target_inner(ctx, key, iova, len, need, f),
        )
    }

    /// `r`, an access by QP `ctx.qpn` through `key`, after reporting it to the device when it
    /// met an invalidated key or vanished memory.
    #[inline]
    fn noting_violation<R>(
        &self,
        ctx: AccessCtx,
        key: u32,
        r: Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        if let Err(AccessError::Invalidated(_) | AccessError::Fault(_)) = r {
            self.coherence.shared.note_violation(ctx.qpn, key);
        }
        r
    }

    #[inline]
    fn with_target_inner<R>(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(*mut u8, CopyMode) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        self.with_target_region(ctx, key, iova, len, need, |p, m, _| f(p, m))
    }

    /// [`MemoryTable::with_target_inner`], with `f` also given the region when `key` names one
    /// (not a window): what a lend counts against.
    #[inline]
    fn with_target_region<R>(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(*mut u8, CopyMode, Option<&Arc<Mr>>) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        let mode = |st: &MrState| self.copy_mode(st);
        // A fault while the watcher has an unread event, or gets one within a few
        // milliseconds, is the window between a move or unmap and the watcher's reaction:
        // report the region as changing, not faulted, so the transport answers RNR NAK and the
        // retry meets the region followed or invalidated. The check runs while the region's
        // state is still read-locked: the watcher write-locks every watched region before it
        // reads events, so the event that explains this fault cannot have been consumed
        // (and applied) between the fault and the check. The wait happens once per region:
        // a region that already faulted without an event (being invalidated) fails at once,
        // so that a peer cannot stall the receive path a few milliseconds per packet.
        let classify = |r: Result<R, AccessError>, faulted_before: bool| match r {
            Err(AccessError::Fault(_)) if !faulted_before && self.coherence.event_pending() => {
                (Err(AccessError::Suspended(key)), false)
            }
            r => {
                let faulted = matches!(r, Err(AccessError::Fault(_)));
                (r, faulted)
            }
        };
        let g = read(self.slot(key)?);
        // The region to blame when the copy faults (rare: only then is its `Arc` cloned).
        let (r, faulted) = match &*g {
            Entry::Mr { key: k, mr } if *k == key => {
                let st = read(&mr.state);
                let before = mr.faulted.load(std::sync::atomic::Ordering::Acquire);
                let (r, faulted) = classify(
                    f(st.resolve(key, ctx, iova, len, need)?, mode(&st), Some(mr)),
                    before,
                );
                drop(st);
                (r, faulted.then(|| (key, Arc::clone(mr))))
            }
            Entry::Mw(mw) if mw.key == key => {
                let mut faulted = false;
                let before = mw
                    .binding
                    .as_ref()
                    .is_some_and(|b| b.parent.faulted.load(std::sync::atomic::Ordering::Acquire));
                let r = mw.access(ctx, iova, len, need, |p, st| {
                    let (r, fault) = classify(f(p, mode(st), None), before);
                    faulted = fault;
                    r
                });
                let blame = match &mw.binding {
                    Some(b) if faulted => Some((b.parent_key, Arc::clone(&b.parent))),
                    _ => None,
                };
                (r, blame)
            }
            _ => return Err(AccessError::InvalidKey(key)),
        };
        drop(g);
        if let Some((lkey, mr)) = faulted {
            self.note_fault(lkey, &mr);
        }
        r
    }

    /// [`MemoryAccess::lend`] without the violation report.
    fn lend_inner(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent>, AccessError> {
        let g = read(self.slot(key)?);
        match &*g {
            Entry::Mr { key: k, mr } if *k == key => {
                let st = read(&mr.state);
                let p = st.resolve(key, ctx, iova, len, access)?;
                // Only plainly copied memory can be checksummed in place.
                if self.copy_mode(&st) != CopyMode::Plain {
                    return Ok(None);
                }
                // Counted while the state is read-locked: a change of state that follows
                // waits for this guard (see `lend.rs`).
                Ok(Some(Lent::new(mr, p, len as usize)))
            }
            Entry::Mw(mw) if mw.key == key => Ok(None),
            _ => Err(AccessError::InvalidKey(key)),
        }
    }
}

impl MemoryAccess for MemoryTable {
    fn check(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        self.with_target(ctx, key, iova, len, access, |_, _| Ok(()))
    }

    fn write(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        data: &[u8],
        access: Access,
    ) -> Result<(), AccessError> {
        self.with_target(ctx, key, iova, data.len() as u64, access, |p, m| {
            // SAFETY: `p..p+data.len()` was validated inside a live region whose memory stays
            // valid while the guards taken by `with_target` are held (`Plain`), or is raw
            // memory checked by the kernel (`Checked`).
            unsafe { copy::place(m, p, data) }.map_err(|_| AccessError::Fault(key))
        })
    }

    fn read(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        out: &mut [u8],
        access: Access,
    ) -> Result<(), AccessError> {
        self.with_target(ctx, key, iova, out.len() as u64, access, |p, m| {
            // SAFETY: as in `write`: a validated range of a live region, guards held.
            unsafe { copy::fetch(m, p, out) }.map_err(|_| AccessError::Fault(key))
        })
    }

    fn lend(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent>, AccessError> {
        self.noting_violation(ctx, key, self.lend_inner(ctx, key, iova, len, access))
    }

    fn stage(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent>, AccessError> {
        let Ok(n) = usize::try_from(len) else {
            return Ok(None);
        };
        if n == 0 || n > STAGE_MAX {
            return Ok(None);
        }
        // SAFETY: `p` is the validated range `with_target` passes, its guards held.
        self.with_target(ctx, key, iova, len, access, |p, m| unsafe {
            staged_copy(p, n, m, key)
        })
    }

    fn warm(&self, ctx: AccessCtx, key: u32, iova: u64, len: u64) {
        let len = len.min(WARM_MAX);
        // No violation is noted and no fault can happen: a prefetch is a hint the CPU drops
        // for an address it cannot reach.
        let _ = self.with_target_inner(ctx, key, iova, len, Access::LOCAL_WRITE, |p, _| {
            copy::prefetch_lines(p, len as usize);
            Ok(())
        });
    }

    fn lend_or_stage(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent>, AccessError> {
        let Ok(n) = usize::try_from(len) else {
            return Ok(None);
        };
        let r = self.with_target_region(ctx, key, iova, len, access, |p, m, mr| {
            // As `lend`: only a region's plainly copied memory is lent where it lies.
            if let (CopyMode::Plain, Some(mr)) = (m, mr) {
                return Ok(Some(Lent::new(mr, p, n)));
            }
            // As `stage`.
            // SAFETY: `p` is the validated range `with_target_region` passes, its guards held.
            unsafe { staged_copy(p, n, m, key) }
        });
        self.noting_violation(ctx, key, r)
    }

    fn atomic(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        self.with_target(ctx, key, iova, 8, Access::REMOTE_ATOMIC, |p, m| {
            if !iova.is_multiple_of(8) || !(p as usize).is_multiple_of(8) {
                return Err(AccessError::Misaligned(iova));
            }
            // SAFETY: 8 validated bytes of a live region, 8-byte aligned (checked just above);
            // raw memory is reached by the kernel's checked copies (`copy::atomic_in`).
            unsafe { copy::atomic_in(m, p, op) }.map_err(|_| AccessError::Fault(key))
        })
    }

    fn invalidate(&self, ctx: AccessCtx, key: u32, by: Invalidator) -> Result<(), AccessError> {
        self.invalidate_key(ctx, key, by)
    }

    fn bind_mw(&self, ctx: AccessCtx, b: super::MwBind) -> Result<(), AccessError> {
        self.bind_wr(ctx, b)
    }
}

/// A staged copy of the `n` bytes at `p` ([`MemoryAccess::stage`] once the range is
/// validated): none for no bytes or more than [`STAGE_MAX`]; a fault is `key`'s.
///
/// # Safety
/// `p..p+n` must be a validated range of a live region (or window) of `key`, copied in mode
/// `m`, whose guards the caller holds until this returns.
unsafe fn staged_copy(
    p: *const u8,
    n: usize,
    m: CopyMode,
    key: u32,
) -> Result<Option<Lent>, AccessError> {
    if n == 0 || n > STAGE_MAX {
        return Ok(None);
    }
    Lent::staged(n, |buf| {
        // SAFETY: forwarded from the caller (as in `read`).
        unsafe { copy::fetch(m, p, buf) }.map_err(|_| AccessError::Fault(key))
    })
}
