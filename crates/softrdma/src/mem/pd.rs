//! Protection domains: handles, and the count of objects in each (a PD with regions or
//! windows cannot be deallocated).

use std::collections::HashMap;
use std::sync::Mutex;

use super::MemError;

pub(crate) struct PdTable {
    inner: Mutex<PdInner>,
    max: u32,
}

struct PdInner {
    /// PD handle → number of regions and windows in it.
    pds: HashMap<u32, u32>,
    next: u32,
}

impl PdTable {
    pub(crate) fn new(max: u32) -> PdTable {
        PdTable {
            inner: Mutex::new(PdInner {
                pds: HashMap::new(),
                next: 1,
            }),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PdInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count(&self) -> u64 {
        self.lock().pds.len() as u64
    }

    /// A new PD handle (never 0).
    pub(crate) fn alloc(&self) -> Result<u32, MemError> {
        let mut g = self.lock();
        if g.pds.len() as u64 >= self.max as u64 {
            return Err(MemError::TableFull {
                what: "protection domains",
                limit: self.max as u64,
            });
        }
        loop {
            let h = g.next;
            g.next = g.next.wrapping_add(1).max(1);
            if let std::collections::hash_map::Entry::Vacant(v) = g.pds.entry(h) {
                v.insert(0);
                return Ok(h);
            }
        }
    }

    pub(crate) fn dealloc(&self, pd: u32) -> Result<(), MemError> {
        let mut g = self.lock();
        match g.pds.get(&pd) {
            None => Err(MemError::InvalidPd(pd)),
            Some(&n) if n > 0 => Err(MemError::PdBusy { pd, objects: n }),
            Some(_) => {
                g.pds.remove(&pd);
                Ok(())
            }
        }
    }

    /// Count one more object in `pd`.
    pub(crate) fn acquire(&self, pd: u32) -> Result<(), MemError> {
        match self.lock().pds.get_mut(&pd) {
            Some(n) => {
                *n += 1;
                Ok(())
            }
            None => Err(MemError::InvalidPd(pd)),
        }
    }

    /// Count one object fewer in `pd`.
    pub(crate) fn release(&self, pd: u32) {
        if let Some(n) = self.lock().pds.get_mut(&pd) {
            *n = n.saturating_sub(1);
        }
    }
}
