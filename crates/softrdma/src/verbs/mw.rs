//! Memory windows: remote access granted to part of a region, and revoked.

use super::{Mr, Pd, Qp, VerbsError};
use crate::mem::{Access, AccessCtx, MwType};

/// A memory window.
#[derive(Debug)]
pub struct Mw {
    pd: Pd,
    key: std::sync::atomic::AtomicU32,
    ty: MwType,
    bound_to: std::sync::Mutex<Option<Mr>>,
}

impl Mw {
    /// The handle of a window `pd` just allocated with R_Key `key`.
    pub(super) fn allocated(pd: Pd, key: u32, ty: MwType) -> Mw {
        Mw {
            pd,
            key: std::sync::atomic::AtomicU32::new(key),
            ty,
            bound_to: std::sync::Mutex::new(None),
        }
    }

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
