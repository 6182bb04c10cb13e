//! Region verbs: register, deregister, re-register, query, suspend/resume, invalidate.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use super::copy::CopyMode;
use super::region::{Mr, MrState, MrStatus, range_fits, validate_mr_access};
use super::source::Backing;
use super::table::{Entry, read, wants_on_demand, write};
use super::{Access, MemError, MemSource, MemoryTable, RegError, Returned};

/// A registered region as `ibv_mr` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Local key.
    pub lkey: u32,
    /// Remote key (equal to `lkey`).
    pub rkey: u32,
    /// Host address of the first byte, as the engine reaches it.
    pub addr: usize,
    /// Length in bytes.
    pub length: u64,
    /// First wire address (`ibv_reg_mr_iova2`; 0 for zero-based regions).
    pub iova: u64,
    /// Protection domain.
    pub pd: u32,
    /// Access flags kept (optional flags dropped).
    pub access: Access,
}

/// What `rereg_mr` changes (as `IBV_REREG_MR_CHANGE_TRANSLATION / _PD / _ACCESS`).
#[derive(Debug, Default)]
pub struct Rereg {
    /// New memory and its IOVA (`None` = the host address).
    pub translation: Option<(MemSource, Option<u64>)>,
    /// New protection domain.
    pub pd: Option<u32>,
    /// New access flags.
    pub access: Option<Access>,
}

fn info(key: u32, st: &MrState) -> MrInfo {
    MrInfo {
        lkey: key,
        rkey: key,
        addr: st.backing.ptr() as usize,
        length: st.backing.len() as u64,
        iova: st.iova,
        pd: st.pd,
        access: st.access,
    }
}

/// Pick the IOVA of a region: 0 when zero-based, else the one asked for, else the address.
fn choose_iova(access: Access, iova: Option<u64>, addr: usize) -> u64 {
    if access.contains(Access::ZERO_BASED) {
        0
    } else {
        iova.unwrap_or(addr as u64)
    }
}

fn check_iova(iova: Option<u64>, len: usize) -> Result<(), MemError> {
    match iova {
        Some(i) if !range_fits(i, len as u64) => Err(MemError::InvalidRange {
            iova: i,
            len: len as u64,
            why: "wraps past the top of the address space",
        }),
        _ => Ok(()),
    }
}

impl MemoryTable {
    /// Register `source` in `pd` with `access`; `iova` is the address peers use
    /// (`None` = the host address, as `ibv_reg_mr`). On refusal nothing changed and the source
    /// comes back in the error.
    pub fn reg_mr(
        &self,
        pd: u32,
        source: MemSource,
        access: Access,
        iova: Option<u64>,
    ) -> Result<MrInfo, RegError> {
        let access = match validate_mr_access(access)
            .and_then(|a| check_iova(iova, source.len()).map(|_| a))
        {
            Ok(a) => a,
            Err(e) => return Err(RegError::new(e, Some(source))),
        };
        if let Err(e) = self.pds.acquire(pd) {
            return Err(RegError::new(e, Some(source)));
        }
        let key = match self.new_key() {
            Ok(k) => k,
            Err(e) => {
                self.pds.release(pd);
                return Err(RegError::new(e, Some(source)));
            }
        };
        let undo = |e: RegError| {
            self.key_alloc().release(key);
            self.pds.release(pd);
            e
        };
        let backing = source.into_backing(&self.arena).map_err(undo)?;
        let pin = match self.pinner.pin(
            backing.ptr() as usize,
            backing.len(),
            wants_on_demand(access),
        ) {
            Ok(p) => p,
            Err(e) => return Err(undo(RegError::new(e, backing.into_source()))),
        };
        let raw = backing.is_raw();
        if raw && self.raw_copy == CopyMode::Checked {
            // A program may have replaced the fault handler since: then the kernel copies.
            super::fault::still_armed();
        }
        let state = MrState {
            pd,
            access,
            iova: choose_iova(access, iova, backing.ptr() as usize),
            remap: backing
                .remap_request()
                .unwrap_or(self.coherence.default_remap),
            backing,
            pin,
            status: MrStatus::Valid,
            cause: None,
        };
        let out = info(key, &state);
        let mr = Arc::new(Mr {
            state: RwLock::new(state),
            windows: Default::default(),
            faulted: Default::default(),
            lent: Default::default(),
        });
        if raw {
            self.coherence
                .watch(key, &mr, out.addr, out.length as usize);
        }
        match self.slots.get(self.slot_index(key) as usize) {
            Some(slot) => *write(slot) = Entry::Mr { key, mr },
            None => {
                // Unreachable: the allocator only hands out indices of existing slots.
                return Err(MemError::InvalidKey(key).into());
            }
        }
        self.regions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(key, pd, len = out.length, "reg_mr");
        Ok(out)
    }

    /// Deregister the region `lkey`, waiting for accesses in flight, and hand back its memory
    /// (see [`Returned`]). Refused with `RegionBusy` while windows are bound to it.
    pub fn dereg_mr(&self, lkey: u32) -> Result<Returned, MemError> {
        let slot = self.slot(lkey)?;
        let mr = {
            let mut g = write(slot);
            match &*g {
                Entry::Mr { key, mr } if *key == lkey => {
                    let windows = mr.windows.load(Ordering::Acquire);
                    if windows > 0 {
                        return Err(MemError::RegionBusy { key: lkey, windows });
                    }
                }
                _ => return Err(MemError::InvalidKey(lkey)),
            }
            match core::mem::replace(&mut *g, Entry::Free) {
                Entry::Mr { mr, .. } => mr,
                _ => return Err(MemError::InvalidKey(lkey)),
            }
        };
        let (backing, pin, pd) = {
            let mut st = write(&mr.state);
            st.status = MrStatus::Invalidated;
            (
                core::mem::replace(&mut st.backing, Backing::empty()),
                st.pin.take(),
                st.pd,
            )
        };
        // Bytes lent to datagrams not yet sent stay where they are until then.
        mr.wait_unlent();
        self.coherence.unwatch(lkey);
        self.pinner.unpin(pin);
        self.pds.release(pd);
        self.key_alloc().release(lkey);
        self.regions.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(key = lkey, "dereg_mr");
        Ok(backing.into_returned())
    }

    /// Describe the region `lkey`.
    pub fn query_mr(&self, lkey: u32) -> Result<MrInfo, MemError> {
        self.with_mr(lkey, |_, st| Ok(info(lkey, st)))
    }

    /// A duplicate of the memfd behind device-allocated memory, so the application can map it.
    pub fn device_memory_fd(&self, lkey: u32) -> Result<File, MemError> {
        self.with_mr(lkey, |_, st| match st.backing.device_file() {
            Some(f) => f.try_clone().map_err(|e| MemError::Os {
                op: "dup",
                errno: e.raw_os_error().unwrap_or(0),
            }),
            None => Err(MemError::InvalidState {
                key: lkey,
                why: "not device-allocated memory",
            }),
        })
    }

    fn with_mr<R>(
        &self,
        lkey: u32,
        f: impl FnOnce(&Mr, &MrState) -> Result<R, MemError>,
    ) -> Result<R, MemError> {
        let g = read(self.slot(lkey)?);
        match &*g {
            Entry::Mr { key, mr } if *key == lkey => f(mr, &read(&mr.state)),
            _ => Err(MemError::InvalidKey(lkey)),
        }
    }

    /// Run `f` with the region's state write-locked (every access in flight has finished),
    /// then wait, with no lock held, for bytes lent before the change to be sent.
    fn with_mr_mut<R>(
        &self,
        lkey: u32,
        f: impl FnOnce(&Mr, &mut MrState) -> R,
    ) -> Result<R, MemError> {
        let g = read(self.slot(lkey)?);
        let (r, mr) = match &*g {
            Entry::Mr { key, mr } if *key == lkey => (f(mr, &mut write(&mr.state)), Arc::clone(mr)),
            _ => return Err(MemError::InvalidKey(lkey)),
        };
        drop(g);
        mr.wait_unlent();
        Ok(r)
    }

    /// Invalidate the region `lkey` (every later access fails with `Invalidated`), after the
    /// accesses in flight finish. `rereg_mr` makes it valid again.
    pub fn invalidate_mr(&self, lkey: u32) -> Result<(), MemError> {
        self.with_mr_mut(lkey, |_, st| st.status = MrStatus::Invalidated)
    }

    /// Suspend the region `lkey`: new accesses fail with `Suspended` (the transport answers
    /// RNR NAK, so senders back off and retry). Returns once every access already in flight
    /// has finished, so the memory can be copied or moved. Idempotent.
    pub fn suspend_mr(&self, lkey: u32) -> Result<(), MemError> {
        self.with_mr_mut(lkey, |_, st| match st.status {
            MrStatus::Invalidated => Err(MemError::InvalidState {
                key: lkey,
                why: "cannot suspend an invalidated region",
            }),
            _ => {
                st.status = MrStatus::Suspended;
                Ok(())
            }
        })?
    }

    /// Resume a suspended region, optionally on a new backing of the same length (same IOVA,
    /// same keys: the migration case). Returns the old backing's memory when replaced.
    pub fn resume_mr(&self, lkey: u32, new: Option<MemSource>) -> Result<Returned, RegError> {
        let r = self.with_mr_mut(lkey, |_, st| {
            if st.status != MrStatus::Suspended {
                return Err(RegError::new(
                    MemError::InvalidState {
                        key: lkey,
                        why: "region is not suspended",
                    },
                    new,
                ));
            }
            let Some(src) = new else {
                st.status = MrStatus::Valid;
                return Ok(None);
            };
            if src.len() != st.backing.len() {
                let len = src.len() as u64;
                return Err(RegError::new(
                    MemError::InvalidRange {
                        iova: st.iova,
                        len,
                        why: "a new backing must have the region's length",
                    },
                    Some(src),
                ));
            }
            let backing = src.into_backing(&self.arena)?;
            let pin = match self.pinner.pin(
                backing.ptr() as usize,
                backing.len(),
                wants_on_demand(st.access),
            ) {
                Ok(p) => p,
                Err(e) => return Err(RegError::new(e, backing.into_source())),
            };
            self.pinner.unpin(core::mem::replace(&mut st.pin, pin));
            if let Some(p) = backing.remap_request() {
                st.remap = p;
            }
            let old = core::mem::replace(&mut st.backing, backing);
            st.status = MrStatus::Valid;
            tracing::debug!(key = lkey, "resume_mr with a new backing");
            Ok(Some(old))
        });
        // The old backing is released only now that nothing lent from it is outstanding.
        match r.map_err(RegError::from)?? {
            Some(old) => {
                self.rewatch(lkey);
                Ok(old.into_returned())
            }
            None => Ok(Returned::none()),
        }
    }

    /// Watch the region `lkey` anew after its backing changed (or it became valid again).
    /// Call with no region lock held.
    fn rewatch(&self, lkey: u32) {
        self.coherence.unwatch(lkey);
        let found = self.with_mr(lkey, |mr, st| {
            mr.faulted.store(false, Ordering::Release);
            Ok((
                st.backing.is_raw(),
                st.backing.ptr() as usize,
                st.backing.len(),
            ))
        });
        if let Ok((true, addr, len)) = found {
            let g = self.slot(lkey).map(read);
            if let Ok(g) = g
                && let Entry::Mr { key, mr } = &*g
                && *key == lkey
            {
                let mr = Arc::clone(mr);
                drop(g);
                self.coherence.watch(lkey, &mr, addr, len);
            }
        }
    }

    /// Re-register `lkey` (`ibv_rereg_mr`): new range, access or PD. Waits for accesses in
    /// flight; refused while windows are bound. On refusal nothing changed and the new source
    /// comes back in the error.
    ///
    /// Keys: a valid region whose memory stays (only access or PD change) keeps its key, as
    /// rxe and mlx5 keep theirs, so work requests already posted with it and keys already
    /// handed out go on working under the new rights. A new translation, or a region that was
    /// invalidated or suspended, gets a **new key** (returned in the [`MrInfo`]; the slot
    /// stays, salt and tag are drawn anew) and the old key is dead: whoever was given it
    /// reaches none of the new memory, and a key invalidated earlier (local invalidation, an
    /// unmap) is never valid again. The region itself becomes valid.
    pub fn rereg_mr(&self, lkey: u32, change: Rereg) -> Result<(MrInfo, Returned), RegError> {
        let Rereg {
            translation,
            pd,
            access,
        } = change;
        let (src, new_iova) = match translation {
            Some((s, i)) => (Some(s), i),
            None => (None, None),
        };
        // The slot is write-locked: its key changes below.
        let mut g = match self.slot(lkey) {
            Ok(s) => write(s),
            Err(e) => return Err(RegError::new(e.into(), src)),
        };
        let (key_field, mr) = match &mut *g {
            Entry::Mr { key, mr } if *key == lkey => (key, Arc::clone(mr)),
            _ => return Err(RegError::new(MemError::InvalidKey(lkey), src)),
        };
        let mut st = write(&mr.state);
        let windows = mr.windows.load(Ordering::Acquire);
        if windows > 0 {
            return Err(RegError::new(
                MemError::RegionBusy { key: lkey, windows },
                src,
            ));
        }
        let new_access = match validate_mr_access(access.unwrap_or(st.access)) {
            Ok(a) => a,
            Err(e) => return Err(RegError::new(e, src)),
        };
        if let Some(s) = &src
            && let Err(e) = check_iova(new_iova, s.len())
        {
            return Err(RegError::new(e, src));
        }
        let old_pd = st.pd;
        let new_pd = pd.unwrap_or(old_pd);
        if new_pd != old_pd
            && let Err(e) = self.pds.acquire(new_pd)
        {
            return Err(RegError::new(e, src));
        }
        let undo_pd = |e: RegError| {
            if new_pd != old_pd {
                self.pds.release(new_pd);
            }
            e
        };
        let backing = match src {
            Some(s) => Some(s.into_backing(&self.arena).map_err(undo_pd)?),
            None => None,
        };
        let (addr, len) = match &backing {
            Some(b) => (b.ptr() as usize, b.len()),
            None => (st.backing.ptr() as usize, st.backing.len()),
        };
        let pin = match self.pinner.pin(addr, len, wants_on_demand(new_access)) {
            Ok(p) => p,
            Err(e) => {
                return Err(undo_pd(RegError::new(
                    e,
                    backing.and_then(Backing::into_source),
                )));
            }
        };
        let keep_key = backing.is_none() && st.status == MrStatus::Valid;
        let new_key = match if keep_key {
            Ok(lkey)
        } else {
            self.key_alloc().retag(lkey)
        } {
            Ok(k) => k,
            Err(e) => {
                // Only a failing OS CSPRNG gets here.
                self.pinner.unpin(pin);
                return Err(undo_pd(RegError::new(
                    e,
                    backing.and_then(Backing::into_source),
                )));
            }
        };
        // Commit: nothing below can fail.
        *key_field = new_key;
        self.pinner.unpin(core::mem::replace(&mut st.pin, pin));
        if new_pd != old_pd {
            self.pds.release(old_pd);
            st.pd = new_pd;
        }
        let returned = match backing {
            Some(b) => {
                st.iova = choose_iova(new_access, new_iova, b.ptr() as usize);
                if let Some(p) = b.remap_request() {
                    st.remap = p;
                }
                Some(core::mem::replace(&mut st.backing, b))
            }
            None => {
                if new_access.contains(Access::ZERO_BASED) {
                    st.iova = 0;
                } else if st.access.contains(Access::ZERO_BASED) {
                    st.iova = st.backing.ptr() as u64;
                }
                None
            }
        };
        st.access = new_access;
        st.status = MrStatus::Valid;
        st.cause = None;
        tracing::debug!(old = lkey, key = new_key, "rereg_mr");
        let out = info(new_key, &st);
        drop(st);
        drop(g);
        // The old backing is released only once nothing lent from it is outstanding.
        mr.wait_unlent();
        let returned = returned.map_or_else(Returned::none, Backing::into_returned);
        self.coherence.unwatch(lkey);
        self.rewatch(new_key);
        Ok((out, returned))
    }
}
