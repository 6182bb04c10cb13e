//! Devices, contexts and their operation tables, device and port attributes, GIDs, async events.

use core::ffi::{c_char, c_int, c_uint, c_void};

use super::objects::{ibv_cq, ibv_mw, ibv_pd, ibv_qp, ibv_srq};
use super::wr::{ibv_mw_bind, ibv_recv_wr, ibv_send_wr, ibv_wc};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `struct _ibv_device_ops`: two obsolete pointers, always NULL here.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct _ibv_device_ops {
    pub _dummy1: *mut c_void,
    pub _dummy2: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// A pointer-sized slot of an operation table that we leave NULL.
pub type CompatSlot = Option<unsafe extern "C" fn()>;

/// `ops.post_send`.
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.post_srq_recv`.
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.poll_cq`.
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`.
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.alloc_mw`.
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw;
/// `ops.bind_mw`.
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
/// `ops.dealloc_mw`.
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`: 32 pointers; the inline functions of verbs.h call the eight typed
/// ones, the `_compat_*` slots are never called by current headers and stay NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_context_ops {
    pub _compat_query_device: CompatSlot,
    pub _compat_query_port: CompatSlot,
    pub _compat_alloc_pd: CompatSlot,
    pub _compat_dealloc_pd: CompatSlot,
    pub _compat_reg_mr: CompatSlot,
    pub _compat_rereg_mr: CompatSlot,
    pub _compat_dereg_mr: CompatSlot,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: CompatSlot,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: CompatSlot,
    pub _compat_resize_cq: CompatSlot,
    pub _compat_destroy_cq: CompatSlot,
    pub _compat_create_srq: CompatSlot,
    pub _compat_modify_srq: CompatSlot,
    pub _compat_query_srq: CompatSlot,
    pub _compat_destroy_srq: CompatSlot,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: CompatSlot,
    pub _compat_query_qp: CompatSlot,
    pub _compat_modify_qp: CompatSlot,
    pub _compat_destroy_qp: CompatSlot,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: CompatSlot,
    pub _compat_destroy_ah: CompatSlot,
    pub _compat_attach_mcast: CompatSlot,
    pub _compat_detach_mcast: CompatSlot,
    pub _compat_async_event: CompatSlot,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended operations, placed in memory *before* the
/// `ibv_context` (which is its last member). Only consulted by verbs.h when
/// `context.abi_compat == UINTPTR_MAX`.
#[repr(C)]
pub struct verbs_context {
    /// `query_port` .. `_ABI_placeholder3`: 39 pointer slots (see verbs.h for each name).
    pub ops: [CompatSlot; VERBS_CONTEXT_OPS],
    /// Size of the extended part in bytes (`sizeof(struct verbs_context)`).
    pub sz: usize,
    pub context: ibv_context,
}

/// Number of extended operation slots before `sz` in `struct verbs_context`.
pub const VERBS_CONTEXT_OPS: usize = 39;

/// Slot indices in [`verbs_context::ops`] (offset / 8).
pub mod vctx_slot {
    pub const QUERY_PORT: usize = 0;
    pub const ADVISE_MR: usize = 1;
    pub const REG_DM_MR: usize = 7;
    pub const ALLOC_DM: usize = 8;
    pub const FREE_DM: usize = 9;
    pub const ALLOC_PARENT_DOMAIN: usize = 14;
    pub const CREATE_CQ_EX: usize = 25;
    pub const QUERY_DEVICE_EX: usize = 27;
    pub const OPEN_QP: usize = 32;
    pub const CREATE_QP_EX: usize = 33;
    pub const CREATE_SRQ_EX: usize = 35;
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// Bytes of `ibv_port_attr` that the exported `ibv_query_port` writes: everything up to and
/// including `flags`. Binaries built against headers older than `port_cap_flags2` pass a
/// 48-byte buffer; current headers zero the whole struct before the call.
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// `struct { __be64 subnet_prefix; __be64 interface_id; }` of `union ibv_gid`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_global {
    pub subnet_prefix: u64,
    pub interface_id: u64,
}

/// `union ibv_gid`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// The `element` union of `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_async_event_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

/// `struct ibv_async_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_async_event {
    pub element: ibv_async_event_element,
    pub event_type: c_int,
}
