//! Protection domains, memory regions and memory windows.

use std::sync::Arc;

use super::{Device, Qp, QpInitAttr, Srq, VerbsError};
use crate::mem::{
    Access, AccessCtx, MemSource, MemoryAccess, MrInfo, MwType, PageSize, Rereg, Returned,
};

pub(crate) struct PdInner {
    pub device: Device,
    pub pd: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let _ = self.device.engine().mem().dealloc_pd(self.pd);
    }
}

impl std::fmt::Debug for PdInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.pd)
    }
}

/// A protection domain. Regions, windows, QPs and SRQs made from it keep it alive.
#[derive(Clone, Debug)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl Pd {
    pub(crate) fn new(device: Device, pd: u32) -> Pd {
        Pd {
            inner: Arc::new(PdInner { device, pd }),
        }
    }

    /// The PD handle.
    pub fn handle(&self) -> u32 {
        self.inner.pd
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Register memory of any of the four kinds (`ibv_reg_mr`; `iova` as `ibv_reg_mr_iova2`,
    /// default the host address). A refused registration changes nothing.
    pub fn reg_mr(
        &self,
        src: MemSource,
        access: Access,
        iova: Option<u64>,
    ) -> Result<Mr, VerbsError> {
        let info = self
            .device()
            .engine()
            .mem()
            .reg_mr(self.inner.pd, src, access, iova)?;
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: self.clone(),
                info,
                deregistered: false,
            }),
        })
    }

    /// Register an owned buffer (handed back by [`Mr::dereg`]).
    pub fn reg_buffer<B: AsMut<[u8]> + Send + 'static>(
        &self,
        buf: B,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        self.reg_mr(MemSource::owned(buf), access, None)
    }

    /// Register `len` bytes of memory the device allocates (which no application unmap can
    /// pull away).
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr, VerbsError> {
        self.reg_mr(MemSource::device(len, PageSize::Base), access, None)
    }

    /// Register raw memory.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` must stay mapped, readable and writable until the region is
    /// deregistered, and may be read and written by the engine at any time meanwhile.
    pub unsafe fn reg_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: forwarded from this function's contract.
        let src = unsafe { MemSource::raw(ptr, len) };
        self.reg_mr(src, access, None)
    }

    /// Allocate a memory window (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw, VerbsError> {
        let key = self.device().engine().mem().alloc_mw(self.inner.pd, ty)?;
        Ok(Mw {
            pd: self.clone(),
            key: std::sync::atomic::AtomicU32::new(key),
            ty,
            bound_to: std::sync::Mutex::new(None),
        })
    }

    /// Create a Reliable Connected QP (`ibv_create_qp`).
    pub fn create_qp(&self, attr: &QpInitAttr) -> Result<Qp, VerbsError> {
        Qp::create(self, attr)
    }

    /// Create a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq, VerbsError> {
        Srq::create(self, max_wr, max_sge)
    }
}

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

/// A memory window.
#[derive(Debug)]
pub struct Mw {
    pd: Pd,
    key: std::sync::atomic::AtomicU32,
    ty: MwType,
    bound_to: std::sync::Mutex<Option<Mr>>,
}

impl Mw {
    /// The current R_Key.
    pub fn rkey(&self) -> u32 {
        self.key.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Window type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// Bind a type 1 window to `[iova, iova+len)` of `mr` through `qp`'s PD (`ibv_bind_mw`):
    /// the window gets a new R_Key (returned); the old one stops working. A zero `len` unbinds.
    pub fn bind(
        &self,
        qp: &Qp,
        mr: &Mr,
        iova: u64,
        len: u64,
        access: Access,
    ) -> Result<u32, VerbsError> {
        if self.ty != MwType::Type1 {
            return Err(VerbsError::InvalidArgument(
                "type 2 windows are bound with a BIND_MW work request".into(),
            ));
        }
        let ctx = AccessCtx {
            pd: self.pd.handle(),
            qpn: qp.qp_num(),
        };
        let mem = self.pd.device().engine().mem();
        let k = mem.bind_mw_type1(ctx, self.rkey(), mr.lkey(), iova, len, access)?;
        self.key.store(k, std::sync::atomic::Ordering::Release);
        *self.bound_to.lock().unwrap_or_else(|e| e.into_inner()) = (len > 0).then(|| mr.clone());
        Ok(k)
    }

    /// The R_Key a type 1 window gets from its next bind by a work request (a `BIND_MW`
    /// work request posted with it as `new_rkey`, as `ibv_bind_mw` does): drawn at random,
    /// unused in the window's slot.
    pub fn draw_type1_key(&self) -> Result<u32, VerbsError> {
        let mem = self.pd.device().engine().mem();
        Ok(mem.draw_type1_key(self.rkey())?)
    }

    /// Record that the window was bound by a work request to `mr` (`None`: unbound) with
    /// R_Key `rkey` (keeps the region registered while the window may refer to it).
    pub fn bound_by_wr(&self, mr: Option<&Mr>, rkey: u32) {
        self.key.store(rkey, std::sync::atomic::Ordering::Release);
        *self.bound_to.lock().unwrap_or_else(|e| e.into_inner()) = mr.cloned();
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let mem = self.pd.device().engine().mem();
        let _ = mem.dealloc_mw(self.rkey());
    }
}
