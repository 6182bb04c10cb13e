//! Memory regions: registered memory, its keys, and its re-registration.

use std::sync::Arc;

use super::{Pd, VerbsError};
use crate::mem::{Access, AccessCtx, MemSource, MemoryAccess, MrInfo, Rereg, Returned};

pub(crate) struct MrInner {
    pd: Pd,
    info: MrInfo,
    deregistered: bool,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if !self.deregistered {
            let _ = self.pd.device().engine().mem().dereg_mr(self.info.lkey);
        }
    }
}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mr({:#x})", self.info.lkey)
    }
}

/// A registered memory region. Windows bound to it keep it registered; dropping the last
/// handle deregisters it.
#[derive(Clone, Debug)]
pub struct Mr {
    pub(crate) inner: Arc<MrInner>,
}

impl Mr {
    /// The handle of a region `pd` just registered.
    pub(super) fn registered(pd: Pd, info: MrInfo) -> Mr {
        Mr {
            inner: Arc::new(MrInner {
                pd,
                info,
                deregistered: false,
            }),
        }
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.info.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.info.rkey
    }
    /// First address as peers and SGEs name it (the IOVA).
    pub fn iova(&self) -> u64 {
        self.inner.info.iova
    }
    /// Length.
    pub fn len(&self) -> u64 {
        self.inner.info.length
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.inner.info.length == 0
    }
    /// Host address of the first byte.
    pub fn addr(&self) -> usize {
        self.inner.info.addr
    }
    /// Everything `ibv_mr` says.
    pub fn info(&self) -> MrInfo {
        self.inner.info
    }

    /// An SGE covering `len` bytes at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> super::Sge {
        super::Sge {
            addr: self.iova().wrapping_add(offset),
            length: len,
            lkey: self.lkey(),
        }
    }

    fn ctx(&self) -> AccessCtx {
        AccessCtx {
            pd: self.inner.pd.handle(),
            qpn: 0,
        }
    }

    /// Copy `data` into the region at `offset` (a local write through the memory table, safe
    /// against concurrent remote access and deregistration).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), VerbsError> {
        let mem = self.inner.pd.device().engine().mem();
        // Local writes need no right beyond owning the region.
        mem.write(
            self.ctx(),
            self.lkey(),
            self.iova().wrapping_add(offset),
            data,
            Access::NONE,
        )?;
        Ok(())
    }

    /// Copy bytes from the region at `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        let mem = self.inner.pd.device().engine().mem();
        mem.read(
            self.ctx(),
            self.lkey(),
            self.iova().wrapping_add(offset),
            out,
            Access::NONE,
        )?;
        Ok(())
    }

    /// Read the whole region into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, VerbsError> {
        let mut v = vec![0; self.len() as usize];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Suspend the region: new accesses stop (remote requests are answered with RNR NAK and
    /// retried), and this returns once accesses in flight have finished.
    pub fn suspend(&self) -> Result<(), VerbsError> {
        self.inner
            .pd
            .device()
            .engine()
            .mem()
            .suspend_mr(self.lkey())?;
        Ok(())
    }

    /// Resume the region, optionally with new backing memory (same IOVA and keys). Returns the
    /// old backing when it was replaced.
    pub fn resume(&self, new: Option<MemSource>) -> Result<Returned, VerbsError> {
        Ok(self
            .inner
            .pd
            .device()
            .engine()
            .mem()
            .resume_mr(self.lkey(), new)?)
    }

    /// Re-register the region (`ibv_rereg_mr`): new memory (and IOVA), PD and/or access.
    /// The region gets **new keys** and the old ones die: a peer holding the old R_Key reaches
    /// neither the new memory nor the new rights. Returns the old memory when it was
    /// replaced. Refused with `Busy` while other handles to the region exist (windows bound to
    /// it hold one); a refusal changes nothing.
    pub fn rereg(&mut self, change: MrRereg<'_>) -> Result<Returned, VerbsError> {
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            return Err(VerbsError::Busy(
                "other handles to this region exist".into(),
            ));
        };
        if let Some(pd) = change.pd
            && !Arc::ptr_eq(pd.device().engine(), inner.pd.device().engine())
        {
            return Err(VerbsError::InvalidArgument(
                "the new PD belongs to another device".into(),
            ));
        }
        let mem = inner.pd.device().engine().mem();
        let (info, returned) = mem
            .rereg_mr(
                inner.info.lkey,
                Rereg {
                    translation: change.translation,
                    pd: change.pd.map(Pd::handle),
                    access: change.access,
                },
            )
            .map_err(|e| VerbsError::from(e.error))?;
        inner.info = info;
        if let Some(pd) = change.pd {
            inner.pd = pd.clone();
        }
        Ok(returned)
    }

    /// Deregister now and get an owned buffer back. Fails with `Busy` (and keeps the region)
    /// while windows are bound to it or other handles exist.
    pub fn dereg(self) -> Result<Returned, (Mr, VerbsError)> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                let mem = inner.pd.device().engine().mem().clone();
                match mem.dereg_mr(inner.info.lkey) {
                    Ok(ret) => {
                        inner.deregistered = true;
                        Ok(ret)
                    }
                    Err(e) => Err((
                        Mr {
                            inner: Arc::new(inner),
                        },
                        e.into(),
                    )),
                }
            }
            Err(inner) => Err((
                Mr { inner },
                VerbsError::Busy("other handles to this region exist".into()),
            )),
        }
    }
}

/// What [`Mr::rereg`] changes (as `IBV_REREG_MR_CHANGE_TRANSLATION / _PD / _ACCESS`).
#[derive(Debug, Default)]
pub struct MrRereg<'a> {
    /// New memory and its IOVA (`None` = the host address).
    pub translation: Option<(MemSource, Option<u64>)>,
    /// New protection domain (of the same device).
    pub pd: Option<&'a Pd>,
    /// New access flags.
    pub access: Option<Access>,
}
