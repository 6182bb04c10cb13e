//! Registered memory: protection domains, regions, windows, keys, pinning.
mod access;

pub use access::{Access, AccessCtx, AccessError, AtomicOp, MemoryAccess};
