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

/// A `struct ibv_cq_ex` entry point with no argument but the CQ.
pub type CqExFn<T> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> T>;

/// `struct ibv_cq_ex`: `struct ibv_cq`'s fields, then the extended poll interface
/// (`ibv_create_cq_ex`). Every `ibv_cq` of this library is one, so `ibv_cq_ex_to_cq` (a cast)
/// and the reverse hold.
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    /// `enum ibv_wc_status` of the current completion.
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: CqExFn<c_int>,
    pub end_poll: CqExFn<()>,
    pub read_opcode: CqExFn<c_int>,
    pub read_vendor_err: CqExFn<u32>,
    pub read_byte_len: CqExFn<u32>,
    pub read_imm_data: CqExFn<u32>,
    pub read_qp_num: CqExFn<u32>,
    pub read_src_qp: CqExFn<u32>,
    pub read_wc_flags: CqExFn<c_uint>,
    pub read_slid: CqExFn<u32>,
    pub read_sl: CqExFn<u8>,
    pub read_dlid_path_bits: CqExFn<u8>,
    pub read_completion_ts: CqExFn<u64>,
    pub read_cvlan: CqExFn<u16>,
    pub read_flow_tag: CqExFn<u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_wc_tm_info)>,
    pub read_completion_wallclock_ns: CqExFn<u64>,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_wc_tm_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc_tm_info {
    pub tag: u64,
    pub priv_: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    /// `enum ibv_create_cq_wc_flags`.
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `enum ibv_create_cq_wc_flags`: what an extended CQ's `read_*` calls may be asked for.
pub mod cq_wc_flags {
    pub const BYTE_LEN: u64 = 1 << 0;
    pub const IMM: u64 = 1 << 1;
    pub const QP_NUM: u64 = 1 << 2;
    pub const SRC_QP: u64 = 1 << 3;
    pub const SLID: u64 = 1 << 4;
    pub const SL: u64 = 1 << 5;
    pub const DLID_PATH_BITS: u64 = 1 << 6;
    pub const COMPLETION_TIMESTAMP: u64 = 1 << 7;
    pub const CVLAN: u64 = 1 << 8;
    pub const FLOW_TAG: u64 = 1 << 9;
    pub const TM_INFO: u64 = 1 << 10;
    pub const COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
    /// `IBV_WC_STANDARD_FLAGS`.
    pub const STANDARD: u64 = BYTE_LEN | IMM | QP_NUM | SRC_QP | SLID | SL | DLID_PATH_BITS;
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
