//! Mirrors of `<rdma/rdma_cma.h>` (rdma-core 44) and of `struct ibv_sa_path_rec`; offsets and
//! sizes are checked against Debian's header by `tests/rdmacm_layout.rs`.
#![allow(non_camel_case_types, missing_docs, missing_debug_implementations)]

use core::ffi::{c_char, c_int, c_void};

use crate::abi::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_srq,
};

/// `struct rdma_event_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// A `struct sockaddr_storage` (128 bytes, 8-aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct SockStorage(pub [u8; 128]);

impl core::fmt::Debug for SockStorage {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", super::addr::of_storage(self))
    }
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination (sockaddr unions) and the IB addresses.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src: SockStorage,
    pub dst: SockStorage,
    pub ibaddr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
#[derive(Debug)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: libc::socklen_t,
    pub ai_dst_len: libc::socklen_t,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// The leading fields of `struct ibv_qp_init_attr_ex` (`<infiniband/verbs.h>`), up to `pd`:
/// what `rdma_create_qp_ex` reads.
#[repr(C)]
pub struct ibv_qp_init_attr_ex_prefix {
    pub base: crate::abi::ibv_qp_init_attr,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
}

/// `enum rdma_cm_event_type`.
pub mod event {
    use core::ffi::c_int;
    pub const ADDR_RESOLVED: c_int = 0;
    pub const ADDR_ERROR: c_int = 1;
    pub const ROUTE_RESOLVED: c_int = 2;
    pub const ROUTE_ERROR: c_int = 3;
    pub const CONNECT_REQUEST: c_int = 4;
    pub const CONNECT_RESPONSE: c_int = 5;
    pub const CONNECT_ERROR: c_int = 6;
    pub const UNREACHABLE: c_int = 7;
    pub const REJECTED: c_int = 8;
    pub const ESTABLISHED: c_int = 9;
    pub const DISCONNECTED: c_int = 10;
    pub const DEVICE_REMOVAL: c_int = 11;
    pub const MULTICAST_JOIN: c_int = 12;
    pub const MULTICAST_ERROR: c_int = 13;
    pub const ADDR_CHANGE: c_int = 14;
    pub const TIMEWAIT_EXIT: c_int = 15;
}

/// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013f;

/// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

/// `rdma_set_option` levels and names.
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

/// The layout table `tests/rdmacm_layout.rs` compares with the C header.
pub fn layout() -> Vec<(&'static str, usize)> {
    use core::mem::{offset_of, size_of};
    vec![
        ("sizeof rdma_event_channel", size_of::<rdma_event_channel>()),
        ("sizeof rdma_ib_addr", size_of::<rdma_ib_addr>()),
        ("sizeof rdma_addr", size_of::<rdma_addr>()),
        ("sizeof rdma_route", size_of::<rdma_route>()),
        ("sizeof rdma_cm_id", size_of::<rdma_cm_id>()),
        ("sizeof rdma_conn_param", size_of::<rdma_conn_param>()),
        ("sizeof rdma_ud_param", size_of::<rdma_ud_param>()),
        ("sizeof rdma_cm_event", size_of::<rdma_cm_event>()),
        ("sizeof rdma_addrinfo", size_of::<rdma_addrinfo>()),
        ("sizeof ibv_sa_path_rec", size_of::<ibv_sa_path_rec>()),
        ("rdma_addr.dst_addr", offset_of!(rdma_addr, dst)),
        ("rdma_addr.addr", offset_of!(rdma_addr, ibaddr)),
        ("rdma_route.path_rec", offset_of!(rdma_route, path_rec)),
        ("rdma_route.num_paths", offset_of!(rdma_route, num_paths)),
        ("rdma_cm_id.channel", offset_of!(rdma_cm_id, channel)),
        ("rdma_cm_id.qp", offset_of!(rdma_cm_id, qp)),
        ("rdma_cm_id.route", offset_of!(rdma_cm_id, route)),
        ("rdma_cm_id.ps", offset_of!(rdma_cm_id, ps)),
        ("rdma_cm_id.port_num", offset_of!(rdma_cm_id, port_num)),
        ("rdma_cm_id.event", offset_of!(rdma_cm_id, event)),
        (
            "rdma_cm_id.send_cq_channel",
            offset_of!(rdma_cm_id, send_cq_channel),
        ),
        ("rdma_cm_id.recv_cq", offset_of!(rdma_cm_id, recv_cq)),
        ("rdma_cm_id.srq", offset_of!(rdma_cm_id, srq)),
        ("rdma_cm_id.pd", offset_of!(rdma_cm_id, pd)),
        ("rdma_cm_id.qp_type", offset_of!(rdma_cm_id, qp_type)),
        (
            "rdma_conn_param.private_data_len",
            offset_of!(rdma_conn_param, private_data_len),
        ),
        (
            "rdma_conn_param.rnr_retry_count",
            offset_of!(rdma_conn_param, rnr_retry_count),
        ),
        (
            "rdma_conn_param.qp_num",
            offset_of!(rdma_conn_param, qp_num),
        ),
        ("rdma_ud_param.ah_attr", offset_of!(rdma_ud_param, ah_attr)),
        ("rdma_ud_param.qp_num", offset_of!(rdma_ud_param, qp_num)),
        ("rdma_ud_param.qkey", offset_of!(rdma_ud_param, qkey)),
        ("rdma_cm_event.event", offset_of!(rdma_cm_event, event)),
        ("rdma_cm_event.status", offset_of!(rdma_cm_event, status)),
        ("rdma_cm_event.param", offset_of!(rdma_cm_event, param)),
        (
            "rdma_addrinfo.ai_src_len",
            offset_of!(rdma_addrinfo, ai_src_len),
        ),
        (
            "rdma_addrinfo.ai_src_addr",
            offset_of!(rdma_addrinfo, ai_src_addr),
        ),
        (
            "rdma_addrinfo.ai_dst_addr",
            offset_of!(rdma_addrinfo, ai_dst_addr),
        ),
        (
            "rdma_addrinfo.ai_route_len",
            offset_of!(rdma_addrinfo, ai_route_len),
        ),
        (
            "rdma_addrinfo.ai_connect",
            offset_of!(rdma_addrinfo, ai_connect),
        ),
        ("rdma_addrinfo.ai_next", offset_of!(rdma_addrinfo, ai_next)),
        ("ibv_sa_path_rec.dlid", offset_of!(ibv_sa_path_rec, dlid)),
        (
            "ibv_sa_path_rec.flow_label",
            offset_of!(ibv_sa_path_rec, flow_label),
        ),
        (
            "ibv_sa_path_rec.reversible",
            offset_of!(ibv_sa_path_rec, reversible),
        ),
        ("ibv_sa_path_rec.pkey", offset_of!(ibv_sa_path_rec, pkey)),
        ("ibv_sa_path_rec.mtu", offset_of!(ibv_sa_path_rec, mtu)),
        (
            "ibv_sa_path_rec.preference",
            offset_of!(ibv_sa_path_rec, preference),
        ),
    ]
}
