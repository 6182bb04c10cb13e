//! `#[repr(C)]` mirrors of rdma-core's `infiniband/verbs.h` (x86_64 and aarch64 Linux), and the
//! enum values the library uses. Field names follow verbs.h; `tests/layout.rs` compiles a C
//! probe against the installed header and fails on any difference with [`layout::table`].
#![allow(non_camel_case_types, missing_docs, missing_debug_implementations)]

mod attr;
mod device;
mod ext;
pub mod layout;
mod objects;
mod wr;

pub use attr::*;
pub use device::*;
pub use ext::*;
pub use objects::*;
pub use wr::*;

/// `enum ibv_node_type`: `IBV_NODE_CA`.
pub const IBV_NODE_CA: i32 = 1;
/// `enum ibv_transport_type`: `IBV_TRANSPORT_IB`.
pub const IBV_TRANSPORT_IB: i32 = 0;

/// `enum ibv_atomic_cap`.
pub const IBV_ATOMIC_HCA: i32 = 1;

/// `enum ibv_port_state`.
pub const IBV_PORT_ACTIVE: i32 = 4;
/// `enum ibv_mtu`: 256 .. 4096 are 1 .. 5.
pub const IBV_MTU_4096: i32 = 5;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_PORT_CM_SUP`.
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;
/// `IBV_PORT_IP_BASED_GIDS`.
pub const IBV_PORT_IP_BASED_GIDS: u32 = 1 << 26;

/// `enum ibv_device_cap_flags` bits softrdma claims.
pub const IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;
pub const IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;
pub const IBV_DEVICE_N_NOTIFY_CQ: u32 = 1 << 14;
pub const IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;

/// `enum ibv_gid_type` (of `struct ibv_gid_entry`).
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `enum ibv_gid_type_sysfs` (of the private `ibv_query_gid_type`): RoCE v1 is 0, v2 is 1.
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: i32 = 1;

/// `IBV_REREG_MR_CHANGE_*`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: i32 = 1;
pub const IBV_REREG_MR_CHANGE_PD: i32 = 2;
pub const IBV_REREG_MR_CHANGE_ACCESS: i32 = 4;
