//! What every QP carries for the extended post-send API (`struct ibv_qp_ex`): the operation
//! table C calls through ([`QpExOps`]) and the requests built since `ibv_wr_start`
//! ([`WrBatch`]). The operations themselves are `crate::wr_ex`'s; a context hands its table to
//! each QP created on it.

use core::ffi::{c_int, c_uint};
use std::sync::Mutex;

use softrdma::verbs::{SendFlags, Sge, UdDest, WrOpcode};

use crate::abi::{CompatSlot, ibv_mr, ibv_mw};

/// One work request being built.
#[derive(Debug)]
pub(crate) struct Building {
    pub(crate) wr_id: u64,
    pub(crate) opcode: WrOpcode,
    pub(crate) flags: SendFlags,
    pub(crate) sges: Vec<Sge>,
    pub(crate) inline: Option<Vec<u8>>,
    pub(crate) ud: Option<UdDest>,
    /// A type 2 window this request binds, and the region (for the window's bookkeeping).
    pub(crate) bind: Option<(*mut ibv_mw, *mut ibv_mr)>,
}

/// The requests built since `ibv_wr_start`, and the first error met.
#[derive(Debug, Default)]
pub struct WrBatch {
    pub(crate) wrs: Vec<Building>,
    pub(crate) err: Option<c_int>,
}

// SAFETY: the raw pointers name objects of this library that the C API keeps alive while a
// request naming them is being built; they are only dereferenced through registry checks.
unsafe impl Send for WrBatch {}

/// The operations of `struct ibv_qp_ex` after its `qp_base`: what a QP (`crate::qp::Qp`)
/// carries right after its `ibv_qp` (`tests/layout.rs` checks the offsets against verbs.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QpExOps {
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub ops: [CompatSlot; 21],
}

/// A guard for the batch of a QP (the QP owns one).
pub fn new_batch() -> Mutex<WrBatch> {
    Mutex::new(WrBatch::default())
}
