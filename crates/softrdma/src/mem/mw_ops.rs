//! Window verbs: allocate, deallocate, bind (type 1 by the verb, type 2 by a work request
//! through [`MemoryAccess::bind_mw`](super::MemoryAccess::bind_mw)), invalidate.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::key::key_index;
use super::table::{Entry, read, write};
use super::window::{Mw, MwType, Range, bind};
use super::{Access, AccessCtx, AccessError, Invalidator, MemError, MemoryTable, MwBind};

/// A memory window as the verbs describe it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwInfo {
    /// Current R_Key.
    pub rkey: u32,
    /// Protection domain.
    pub pd: u32,
    /// Window type.
    pub ty: MwType,
    /// The binding, if bound.
    pub bound: Option<MwBinding>,
}

/// Where a window is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBinding {
    /// L_Key of the parent region.
    pub mr_lkey: u32,
    /// First wire address of the window (0 when zero-based).
    pub addr: u64,
    /// Length.
    pub length: u64,
    /// Rights granted.
    pub access: Access,
    /// The QP a type 2 window is bound to.
    pub qpn: Option<u32>,
}

impl MemoryTable {
    /// Describe the window whose current R_Key is `key`.
    pub fn query_mw(&self, key: u32) -> Result<MwInfo, MemError> {
        let g = read(self.slot(key)?);
        match &*g {
            Entry::Mw(mw) if mw.key == key => Ok(MwInfo {
                rkey: mw.key,
                pd: mw.pd,
                ty: mw.ty,
                bound: mw.binding.as_ref().map(|b| MwBinding {
                    mr_lkey: b.parent_key,
                    addr: b.start,
                    length: b.len,
                    access: b.access,
                    qpn: b.qpn,
                }),
            }),
            _ => Err(MemError::InvalidKey(key)),
        }
    }

    /// Allocate an unbound memory window of type `ty` in `pd`; returns its R_Key.
    pub fn alloc_mw(&self, pd: u32, ty: MwType) -> Result<u32, MemError> {
        self.pds.acquire(pd)?;
        let key = match self.new_key() {
            Ok(k) => k,
            Err(e) => {
                self.pds.release(pd);
                return Err(e);
            }
        };
        if let Some(slot) = self.slots.get(self.slot_index(key) as usize) {
            *write(slot) = Entry::Mw(Mw {
                key,
                pd,
                ty,
                binding: None,
                invalidated: false,
                unbound_from: None,
            });
        }
        self.windows.fetch_add(1, Ordering::Relaxed);
        Ok(key)
    }

    /// Deallocate the window whose current R_Key is `key` (unbinding it first).
    pub fn dealloc_mw(&self, key: u32) -> Result<(), MemError> {
        let slot = self.slot(key)?;
        let pd = {
            let mut g = write(slot);
            let Entry::Mw(mw) = &mut *g else {
                return Err(MemError::InvalidKey(key));
            };
            if mw.key != key {
                return Err(MemError::InvalidKey(key));
            }
            mw.unbind();
            let pd = mw.pd;
            *g = Entry::Free;
            pd
        };
        self.pds.release(pd);
        self.key_alloc().release(key);
        self.windows.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Bind the type 1 window `mw_key` to `[iova, iova+len)` of region `mr_lkey` with `access`
    /// (`ibv_bind_mw` through a QP of `ctx.pd`). Returns the window's new R_Key, drawn at random;
    /// the previous R_Key stops working. A zero `len` unbinds the window.
    pub fn bind_mw_type1(
        &self,
        ctx: AccessCtx,
        mw_key: u32,
        mr_lkey: u32,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, AccessError> {
        let slot = self.slot(mw_key)?;
        if self.slot_index(mr_lkey) == self.slot_index(mw_key) {
            return Err(AccessError::InvalidKey(mr_lkey));
        }
        let mut g = write(slot);
        let Entry::Mw(mw) = &mut *g else {
            return Err(AccessError::InvalidKey(mw_key));
        };
        if mw.key != mw_key {
            return Err(AccessError::InvalidKey(mw_key));
        }
        if mw.ty != MwType::Type1 {
            return Err(AccessError::InvalidOperation(mw_key));
        }
        if mw.pd != ctx.pd {
            return Err(AccessError::WrongPd(mw_key));
        }
        let binding = if len == 0 {
            None
        } else {
            let pg = read(self.slot(mr_lkey)?);
            let Entry::Mr { key, mr } = &*pg else {
                return Err(AccessError::InvalidKey(mr_lkey));
            };
            if *key != mr_lkey {
                return Err(AccessError::InvalidKey(mr_lkey));
            }
            let range = Range {
                mr_key: mr_lkey,
                mw_key,
                iova,
                len,
                access,
            };
            Some(bind(mr, range, mw.pd, None)?)
        };
        let new_key = match self.key_alloc().retag(mw_key) {
            Ok(k) => k,
            Err(_) => {
                // Only a failing OS CSPRNG gets here; undo the new binding.
                if let Some(b) = binding {
                    b.parent.windows.fetch_sub(1, Ordering::AcqRel);
                }
                return Err(AccessError::InvalidOperation(mw_key));
            }
        };
        mw.unbind();
        mw.binding = binding;
        mw.key = new_key;
        mw.invalidated = false;
        Ok(new_key)
    }

    /// Draw the next R_Key of the type 1 window `mw_key`, for a bind that a work request
    /// carries out later (`ibv_bind_mw`, which hands the key out at once, as rdma-core's
    /// providers do): random like [`MemoryTable::bind_mw_type1`]'s, unused in its slot.
    pub fn draw_type1_key(&self, mw_key: u32) -> Result<u32, AccessError> {
        let slot = self.slot(mw_key)?;
        let g = read(slot);
        match &*g {
            Entry::Mw(mw) if mw.key == mw_key && mw.ty == MwType::Type1 => {}
            Entry::Mw(mw) if mw.key == mw_key => {
                return Err(AccessError::InvalidOperation(mw_key));
            }
            _ => return Err(AccessError::InvalidKey(mw_key)),
        }
        self.key_alloc()
            .retag(mw_key)
            .map_err(|_| AccessError::InvalidOperation(mw_key))
    }

    /// A BIND_MW work request executing: a type 2 window (its new key differs from the old
    /// in the tag only, `ibv_inc_rkey`; bound to the QP; unbound first), or a type 1 window
    /// with a key from [`MemoryTable::draw_type1_key`] (rebound in place; a zero length
    /// unbinds).
    pub(crate) fn bind_wr(&self, ctx: AccessCtx, b: MwBind) -> Result<(), AccessError> {
        let MwBind {
            mw_key,
            new_rkey,
            mr_lkey,
            iova,
            len,
            access,
        } = b;
        let slot = self.slot(mw_key)?;
        if self.slot_index(new_rkey) != self.slot_index(mw_key) {
            return Err(AccessError::InvalidOperation(mw_key));
        }
        if self.slot_index(mr_lkey) == self.slot_index(mw_key) {
            return Err(AccessError::InvalidKey(mr_lkey));
        }
        let mut g = write(slot);
        let Entry::Mw(mw) = &mut *g else {
            return Err(AccessError::InvalidKey(mw_key));
        };
        if mw.key != mw_key {
            return Err(AccessError::InvalidKey(mw_key));
        }
        let type1 = mw.ty == MwType::Type1;
        // A type 2 window's new key differs in the tag only.
        if !type1 && key_index(new_rkey) != key_index(mw_key) {
            return Err(AccessError::InvalidOperation(mw_key));
        }
        if mw.pd != ctx.pd {
            return Err(AccessError::WrongPd(mw_key));
        }
        if type1 && len == 0 {
            mw.unbind();
            mw.key = new_rkey;
            mw.invalidated = false;
            return Ok(());
        }
        if !type1 && mw.binding.is_some() {
            // A bound type 2 window must be invalidated before it is bound again.
            return Err(AccessError::InvalidOperation(mw_key));
        }
        let pg = read(self.slot(mr_lkey)?);
        let Entry::Mr { key, mr } = &*pg else {
            return Err(AccessError::InvalidKey(mr_lkey));
        };
        if *key != mr_lkey {
            return Err(AccessError::InvalidKey(mr_lkey));
        }
        let range = Range {
            mr_key: mr_lkey,
            mw_key,
            iova,
            len,
            access,
        };
        let binding = bind(mr, range, mw.pd, (!type1).then_some(ctx.qpn))?;
        mw.unbind();
        mw.binding = Some(binding);
        mw.key = new_rkey;
        mw.invalidated = false;
        drop(pg);
        if !type1 {
            self.key_alloc().note(new_rkey);
        }
        Ok(())
    }

    /// Wait, holding no lock, until no byte lent to the transmit path from the region `key`
    /// reaches (its own key, or a window's: the region it is bound to, or was when it was
    /// invalidated) remains unsent. A driver calls it before it reports the completion of
    /// work that invalidated `key` (LOCAL_INV, SEND with Invalidate): once the application
    /// sees the key invalidated, nothing reads the region's bytes for an earlier request any
    /// more. Returns at once for a key that names nothing.
    pub fn wait_unlent(&self, key: u32) {
        let Ok(slot) = self.slot(key) else {
            return;
        };
        let mr = match &*read(slot) {
            Entry::Mr { key: k, mr } if *k == key => Some(Arc::clone(mr)),
            Entry::Mw(mw) if mw.key == key => mw
                .binding
                .as_ref()
                .map(|b| Arc::clone(&b.parent))
                .or_else(|| mw.unbound_from.as_ref().and_then(std::sync::Weak::upgrade)),
            _ => None,
        };
        if let Some(mr) = mr {
            mr.wait_unlent();
        }
    }

    pub(crate) fn invalidate_key(
        &self,
        ctx: AccessCtx,
        key: u32,
        by: Invalidator,
    ) -> Result<(), AccessError> {
        let mut g = write(self.slot(key)?);
        match &mut *g {
            Entry::Mr { key: k, mr } if *k == key => {
                let mut st = write(&mr.state);
                if st.pd != ctx.pd {
                    return Err(AccessError::WrongPd(key));
                }
                // A peer never invalidates a region (only type 2 windows); the application
                // does not invalidate one under bound windows.
                if by == Invalidator::Remote || mr.windows.load(Ordering::Acquire) > 0 {
                    return Err(AccessError::InvalidOperation(key));
                }
                st.status = super::region::MrStatus::Invalidated;
                Ok(())
            }
            Entry::Mw(mw) if mw.key == key => {
                if mw.pd != ctx.pd {
                    return Err(AccessError::WrongPd(key));
                }
                if mw.ty != MwType::Type2 {
                    return Err(AccessError::InvalidOperation(key));
                }
                let Some(b) = &mw.binding else {
                    return Err(if mw.invalidated {
                        AccessError::Invalidated(key)
                    } else {
                        AccessError::InvalidKey(key)
                    });
                };
                if b.qpn != Some(ctx.qpn) {
                    return Err(AccessError::WrongQp(key));
                }
                let from = Arc::downgrade(&b.parent);
                mw.unbound_from = Some(from);
                mw.unbind();
                mw.invalidated = true;
                Ok(())
            }
            _ => Err(AccessError::InvalidKey(key)),
        }
    }
}
