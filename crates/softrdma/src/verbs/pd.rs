//! Protection domains: what registers memory, allocates windows and creates QPs and SRQs.

use std::sync::Arc;

use super::{Device, Mr, Mw, Qp, QpInitAttr, Srq, VerbsError};
use crate::mem::{Access, MemSource, MwType, PageSize};

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
        Ok(Mr::registered(self.clone(), info))
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
        Ok(Mw::allocated(self.clone(), key, ty))
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
