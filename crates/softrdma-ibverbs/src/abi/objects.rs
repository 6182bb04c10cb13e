//! The objects a context creates: PD, MR, MW, CQ, completion channel, QP (and `ibv_qp_ex`),
//! SRQ, AH.

use core::ffi::{c_int, c_uint, c_void};

use super::device::{CompatSlot, ibv_context};

/// `struct ibv_pd`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`: 1 = type 1, 2 = type 2.
    pub type_: c_int,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: c_int,
    /// `enum ibv_qp_type`.
    pub qp_type: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_ex`: an `ibv_qp` followed by the work-request builder operations
/// (`ibv_wr_*` inline functions call them). Only QPs created through `create_qp_ex` with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` have one.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: CompatSlot,
    pub wr_atomic_fetch_add: CompatSlot,
    pub wr_bind_mw: CompatSlot,
    pub wr_local_inv: CompatSlot,
    pub wr_rdma_read: CompatSlot,
    pub wr_rdma_write: CompatSlot,
    pub wr_rdma_write_imm: CompatSlot,
    pub wr_send: CompatSlot,
    pub wr_send_imm: CompatSlot,
    pub wr_send_inv: CompatSlot,
    pub wr_send_tso: CompatSlot,
    pub wr_set_ud_addr: CompatSlot,
    pub wr_set_xrc_srqn: CompatSlot,
    pub wr_set_inline_data: CompatSlot,
    pub wr_set_inline_data_list: CompatSlot,
    pub wr_set_sge: CompatSlot,
    pub wr_set_sge_list: CompatSlot,
    pub wr_start: CompatSlot,
    pub wr_complete: CompatSlot,
    pub wr_abort: CompatSlot,
    pub wr_atomic_write: CompatSlot,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}
