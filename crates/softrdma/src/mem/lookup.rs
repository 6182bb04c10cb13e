//! The data path: [`MemoryAccess`] for [`MemoryTable`].
//!
//! Every call resolves the key with one array index and holds that slot's read guard (and the
//! region state's) until its copy is done; see [`table`](super::table) for why.

use super::copy;
use super::table::{Entry, read};
use super::{Access, AccessCtx, AccessError, AtomicOp, MemoryAccess, MemoryTable};

impl MemoryTable {
    /// Validate `[iova, iova+len)` under `key` for `need` by `ctx`, then run `f` on the host
    /// address while the access counts as in flight.
    #[inline]
    fn with_target<R>(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(*mut u8) -> Result<R, AccessError>,
    ) -> Result<R, AccessError> {
        let g = read(self.slot(key)?);
        match &*g {
            Entry::Mr { key: k, mr } if *k == key => {
                let st = read(&mr.state);
                f(st.resolve(key, ctx, iova, len, need)?)
            }
            Entry::Mw(mw) if mw.key == key => mw.access(ctx, iova, len, need, f),
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
        self.with_target(ctx, key, iova, len, access, |_| Ok(()))
    }

    fn write(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        data: &[u8],
        access: Access,
    ) -> Result<(), AccessError> {
        self.with_target(ctx, key, iova, data.len() as u64, access, |p| {
            // SAFETY: `p..p+data.len()` was validated inside a live region whose memory stays
            // valid while the guards taken by `with_target` are held.
            unsafe { copy::copy_in(p, data) };
            Ok(())
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
        self.with_target(ctx, key, iova, out.len() as u64, access, |p| {
            // SAFETY: as in `write`: a validated range of a live region, guards held.
            unsafe { copy::copy_out(p, out) };
            Ok(())
        })
    }

    fn atomic(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        self.with_target(ctx, key, iova, 8, Access::REMOTE_ATOMIC, |p| {
            if !iova.is_multiple_of(8) || !(p as usize).is_multiple_of(8) {
                return Err(AccessError::Misaligned(iova));
            }
            // SAFETY: 8 validated bytes of a live region, 8-byte aligned (checked just above).
            Ok(unsafe { copy::atomic(p, op) })
        })
    }

    fn invalidate(&self, ctx: AccessCtx, key: u32) -> Result<(), AccessError> {
        self.invalidate_key(ctx, key)
    }

    fn bind_mw(
        &self,
        ctx: AccessCtx,
        mw_key: u32,
        new_rkey: u32,
        mr_lkey: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        self.bind_type2(ctx, mw_key, new_rkey, mr_lkey, iova, len, access)
    }
}
