//! A buffer-backed [`MemoryAccess`] for tests and simulation: keys map to plain `Vec<u8>`
//! buffers with a PD, an IOVA, rights, an invalidated flag, a suspend flag and a fault flag;
//! type 2 memory windows are bound onto regions. Every buffer carries guard bytes before and
//! after the registered range, so a write outside it is caught by [`SimMemory::check_guards`].

use std::cell::RefCell;
use std::collections::HashMap;

use softrdma::mem::{Access, AccessCtx, AccessError, AtomicOp, Invalidator, MemoryAccess};

const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xa5;

#[derive(Debug)]
enum Kind {
    Mr {
        buf: Vec<u8>,
    },
    Mw {
        parent: Option<u32>,
        qpn: Option<u32>,
    },
}

#[derive(Debug)]
struct Region {
    pd: u32,
    iova: u64,
    len: u64,
    access: Access,
    valid: bool,
    suspended: bool,
    fault: bool,
    kind: Kind,
}

#[derive(Debug, Default)]
struct Inner {
    regions: HashMap<u32, Region>,
    next_index: u32,
}

/// Plain-buffer memory behind keys.
#[derive(Debug, Default)]
pub struct SimMemory {
    inner: RefCell<Inner>,
}

impl SimMemory {
    /// Empty.
    pub fn new() -> SimMemory {
        SimMemory::default()
    }

    /// Register `len` zeroed bytes at `iova` in `pd` with `access`; returns the key (lkey = rkey).
    pub fn reg_mr(&self, pd: u32, iova: u64, len: usize, access: Access) -> u32 {
        let mut i = self.inner.borrow_mut();
        i.next_index += 1;
        let key = (i.next_index << 8) | 0x5a;
        let mut buf = vec![GUARD_BYTE; len + 2 * GUARD];
        buf[GUARD..GUARD + len].fill(0);
        let r = Region {
            pd,
            iova,
            len: len as u64,
            access,
            valid: true,
            suspended: false,
            fault: false,
            kind: Kind::Mr { buf },
        };
        i.regions.insert(key, r);
        key
    }

    /// Allocate an unbound type 2 window in `pd`; returns its key.
    pub fn alloc_mw(&self, pd: u32) -> u32 {
        let mut i = self.inner.borrow_mut();
        i.next_index += 1;
        let key = (i.next_index << 8) | 0x01;
        let r = Region {
            pd,
            iova: 0,
            len: 0,
            access: Access::NONE,
            valid: false,
            suspended: false,
            fault: false,
            kind: Kind::Mw {
                parent: None,
                qpn: None,
            },
        };
        i.regions.insert(key, r);
        key
    }

    /// Deregister (returns false when a window is still bound to the region).
    pub fn dereg(&self, key: u32) -> bool {
        let mut i = self.inner.borrow_mut();
        let busy = i
            .regions
            .values()
            .any(|r| matches!(r.kind, Kind::Mw { parent: Some(p), .. } if p == key) && r.valid);
        if busy {
            return false;
        }
        i.regions.remove(&key).is_some()
    }

    /// Number of registered keys.
    pub fn len(&self) -> usize {
        self.inner.borrow().regions.len()
    }
    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Suspend or resume a region (accesses get `Suspended`, the transport RNR-NAKs).
    pub fn set_suspended(&self, key: u32, on: bool) {
        if let Some(r) = self.inner.borrow_mut().regions.get_mut(&key) {
            r.suspended = on;
        }
    }
    /// Make accesses to a region fault (as if its memory were unmapped under a copy).
    pub fn set_fault(&self, key: u32, on: bool) {
        if let Some(r) = self.inner.borrow_mut().regions.get_mut(&key) {
            r.fault = on;
        }
    }
    /// Whether a key is valid (not invalidated).
    pub fn is_valid(&self, key: u32) -> bool {
        self.inner
            .borrow()
            .regions
            .get(&key)
            .is_some_and(|r| r.valid)
    }

    /// Write bytes into a region directly (the application filling its buffer).
    pub fn fill(&self, key: u32, offset: usize, data: &[u8]) {
        let mut i = self.inner.borrow_mut();
        if let Some(Region {
            kind: Kind::Mr { buf },
            ..
        }) = i.regions.get_mut(&key)
        {
            buf[GUARD + offset..GUARD + offset + data.len()].copy_from_slice(data);
        }
    }
    /// A copy of a region's bytes.
    pub fn contents(&self, key: u32) -> Vec<u8> {
        let i = self.inner.borrow();
        match i.regions.get(&key) {
            Some(Region {
                kind: Kind::Mr { buf },
                len,
                ..
            }) => buf[GUARD..GUARD + *len as usize].to_vec(),
            _ => Vec::new(),
        }
    }
    /// Compare `len` bytes at `offset` of a region with `expect` without copying.
    pub fn equals(&self, key: u32, offset: usize, expect: &[u8]) -> bool {
        let i = self.inner.borrow();
        match i.regions.get(&key) {
            Some(Region {
                kind: Kind::Mr { buf },
                len,
                ..
            }) => {
                offset + expect.len() <= *len as usize
                    && &buf[GUARD + offset..GUARD + offset + expect.len()] == expect
            }
            _ => false,
        }
    }
    /// The 8 bytes at `offset` of a region, host order.
    pub fn read_u64(&self, key: u32, offset: usize) -> u64 {
        let c = self.contents(key);
        let mut a = [0u8; 8];
        a.copy_from_slice(&c[offset..offset + 8]);
        u64::from_ne_bytes(a)
    }

    /// Verify every guard zone is intact (invariant 2: no byte written outside a
    /// registered range).
    pub fn check_guards(&self) -> Result<(), String> {
        let i = self.inner.borrow();
        for (k, r) in &i.regions {
            if let Kind::Mr { buf } = &r.kind {
                let n = buf.len();
                if buf[..GUARD]
                    .iter()
                    .chain(&buf[n - GUARD..])
                    .any(|&b| b != GUARD_BYTE)
                {
                    return Err(format!("guard bytes of key {k:#x} overwritten"));
                }
            }
        }
        Ok(())
    }

    /// Resolve `key` for an access of `[iova, iova+len)` needing `access`: returns the MR key
    /// and the offset into its buffer.
    fn resolve(
        &self,
        i: &Inner,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<(u32, usize), AccessError> {
        let r = i.regions.get(&key).ok_or(AccessError::InvalidKey(key))?;
        if r.pd != ctx.pd {
            return Err(AccessError::WrongPd(key));
        }
        if !r.valid {
            return Err(AccessError::Invalidated(key));
        }
        let end = iova
            .checked_add(len)
            .ok_or(AccessError::OutOfBounds { key, iova, len })?;
        if iova < r.iova || end > r.iova + r.len {
            return Err(AccessError::OutOfBounds { key, iova, len });
        }
        if !r.access.contains(access) {
            return Err(AccessError::AccessDenied {
                key,
                needed: access.0,
            });
        }
        let (mr_key, mr_off) = match r.kind {
            Kind::Mr { .. } => (key, 0u64),
            Kind::Mw { parent, qpn } => {
                if qpn != Some(ctx.qpn) {
                    return Err(AccessError::WrongQp(key));
                }
                let p = parent.ok_or(AccessError::InvalidKey(key))?;
                let pr = i.regions.get(&p).ok_or(AccessError::Invalidated(key))?;
                if !pr.valid {
                    return Err(AccessError::Invalidated(key));
                }
                (p, r.iova - pr.iova)
            }
        };
        let mr = i.regions.get(&mr_key).ok_or(AccessError::InvalidKey(key))?;
        if r.suspended || mr.suspended {
            return Err(AccessError::Suspended(key));
        }
        if r.fault || mr.fault {
            return Err(AccessError::Fault(key));
        }
        Ok((mr_key, (mr_off + iova - r.iova) as usize))
    }
}

impl MemoryAccess for SimMemory {
    fn check(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<(), AccessError> {
        let i = self.inner.borrow();
        self.resolve(&i, ctx, key, iova, len, access).map(|_| ())
    }

    fn write(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        data: &[u8],
        access: Access,
    ) -> Result<(), AccessError> {
        let mut i = self.inner.borrow_mut();
        let (k, off) = self.resolve(&i, ctx, key, iova, data.len() as u64, access)?;
        if let Some(Region {
            kind: Kind::Mr { buf },
            ..
        }) = i.regions.get_mut(&k)
        {
            buf[GUARD + off..GUARD + off + data.len()].copy_from_slice(data);
        }
        Ok(())
    }

    fn read(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        out: &mut [u8],
        access: Access,
    ) -> Result<(), AccessError> {
        let i = self.inner.borrow();
        let (k, off) = self.resolve(&i, ctx, key, iova, out.len() as u64, access)?;
        if let Some(Region {
            kind: Kind::Mr { buf },
            ..
        }) = i.regions.get(&k)
        {
            out.copy_from_slice(&buf[GUARD + off..GUARD + off + out.len()]);
        }
        Ok(())
    }

    fn atomic(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        if !iova.is_multiple_of(8) {
            return Err(AccessError::Misaligned(iova));
        }
        let mut i = self.inner.borrow_mut();
        let (k, off) = self.resolve(&i, ctx, key, iova, 8, Access::REMOTE_ATOMIC)?;
        let Some(Region {
            kind: Kind::Mr { buf },
            ..
        }) = i.regions.get_mut(&k)
        else {
            return Err(AccessError::InvalidKey(key));
        };
        let b = &mut buf[GUARD + off..GUARD + off + 8];
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        let orig = u64::from_ne_bytes(a);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        };
        b.copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }

    fn invalidate(&self, ctx: AccessCtx, key: u32, by: Invalidator) -> Result<(), AccessError> {
        let mut i = self.inner.borrow_mut();
        let r = i
            .regions
            .get_mut(&key)
            .ok_or(AccessError::InvalidKey(key))?;
        if r.pd != ctx.pd {
            return Err(AccessError::WrongPd(key));
        }
        // As the memory table: a peer invalidates type 2 windows (bound to a QP) only.
        if by == Invalidator::Remote && !matches!(r.kind, Kind::Mw { qpn: Some(_), .. }) {
            return Err(AccessError::InvalidOperation(key));
        }
        if let Kind::Mw { qpn, .. } = r.kind
            && qpn.is_some()
            && qpn != Some(ctx.qpn)
        {
            return Err(AccessError::WrongQp(key));
        }
        if !r.valid {
            return Err(AccessError::Invalidated(key));
        }
        r.valid = false;
        Ok(())
    }

    fn bind_mw(&self, ctx: AccessCtx, b: softrdma::mem::MwBind) -> Result<(), AccessError> {
        let softrdma::mem::MwBind {
            mw_key,
            new_rkey,
            mr_lkey,
            iova,
            len,
            access,
        } = b;
        let mut i = self.inner.borrow_mut();
        let mr = i
            .regions
            .get(&mr_lkey)
            .ok_or(AccessError::InvalidKey(mr_lkey))?;
        if mr.pd != ctx.pd {
            return Err(AccessError::WrongPd(mr_lkey));
        }
        if !matches!(mr.kind, Kind::Mr { .. }) || !mr.valid {
            return Err(AccessError::InvalidOperation(mr_lkey));
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(AccessError::AccessDenied {
                key: mr_lkey,
                needed: Access::MW_BIND.0,
            });
        }
        let end = iova.checked_add(len).ok_or(AccessError::OutOfBounds {
            key: mr_lkey,
            iova,
            len,
        })?;
        if iova < mr.iova || end > mr.iova + mr.len {
            return Err(AccessError::OutOfBounds {
                key: mr_lkey,
                iova,
                len,
            });
        }
        if new_rkey >> 8 != mw_key >> 8 || (new_rkey != mw_key && i.regions.contains_key(&new_rkey))
        {
            return Err(AccessError::InvalidOperation(mw_key));
        }
        let mut mw = i
            .regions
            .remove(&mw_key)
            .ok_or(AccessError::InvalidKey(mw_key))?;
        if mw.pd != ctx.pd || !matches!(mw.kind, Kind::Mw { .. }) {
            i.regions.insert(mw_key, mw);
            return Err(AccessError::InvalidOperation(mw_key));
        }
        mw.iova = iova;
        mw.len = len;
        mw.access = access;
        mw.valid = true;
        mw.kind = Kind::Mw {
            parent: Some(mr_lkey),
            qpn: Some(ctx.qpn),
        };
        i.regions.insert(new_rkey, mw);
        Ok(())
    }
}
