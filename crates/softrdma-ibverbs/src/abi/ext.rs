//! Device memory (`struct ibv_dm`, `struct ibv_alloc_dm_attr`), the extended device attributes
//! (`struct ibv_device_attr_ex`), and the structs of softrdma's own header
//! `include/softrdma/sdv.h`.

use core::ffi::{c_int, c_void};

use super::device::{ibv_context, ibv_device_attr};

/// `ibv_dm.memcpy_to_dm`.
pub type MemcpyToDmFn = unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int;
/// `ibv_dm.memcpy_from_dm`.
pub type MemcpyFromDmFn = unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int;

/// `struct ibv_dm`: device memory; verbs.h's inline `ibv_memcpy_to_dm`/`_from_dm` call its
/// two function pointers.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<MemcpyToDmFn>,
    pub memcpy_from_dm: Option<MemcpyFromDmFn>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps.per_transport_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_per_transport_caps {
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub per_transport_caps: ibv_odp_per_transport_caps,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

/// `IBV_ACCESS_ZERO_BASED` (required by `ibv_reg_dm_mr`).
pub const IBV_ACCESS_ZERO_BASED: u32 = 1 << 5;

/// `struct softrdma_mr_coherence` (sdv.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct softrdma_mr_coherence {
    pub size: u32,
    pub state: u32,
    pub cause: u32,
    pub remap_policy: u32,
    pub watched: u32,
    pub checked_copy: u32,
    pub iova: u64,
    pub addr: u64,
    pub length: u64,
}

/// `struct softrdma_counters` (sdv.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct softrdma_counters {
    pub size: u32,
    pub reserved: u32,
    pub rx_datagrams: u64,
    pub rx_packets: u64,
    pub rx_bad: u64,
    pub rx_icrc_solved: u64,
    pub rx_unknown_qp: u64,
    pub rx_wrong_peer: u64,
    pub tx_datagrams: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_zero_copy: u64,
    pub thread_wakeups: u64,
    pub thread_receives: u64,
    pub timer_scans: u64,
    pub regions: u64,
    pub windows: u64,
    pub pds: u64,
    pub pinned_bytes: u64,
    pub pin_refusals: u64,
    pub device_bytes: u64,
    pub watched_regions: u64,
    pub unwatched_regions: u64,
    pub coherence_events: u64,
    pub watch_invalidations: u64,
    pub remaps_followed: u64,
    pub access_faults: u64,
    pub invalidations_dropped: u64,
    pub access_violations: u64,
}

/// `struct softrdma_qp_counters` (sdv.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct softrdma_qp_counters {
    pub size: u32,
    pub reserved: u32,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub packets_dropped: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub rnr_naks_received: u64,
    pub seq_naks_received: u64,
    pub rerequests: u64,
    pub duplicates: u64,
    pub rnr_naks_sent: u64,
    pub seq_naks_sent: u64,
    pub naks_sent: u64,
}

/// `enum softrdma_remap_policy`.
pub const SOFTRDMA_REMAP_INVALIDATE: u32 = 0;
pub const SOFTRDMA_REMAP_FOLLOW: u32 = 1;
/// `enum softrdma_mr_state`.
pub const SOFTRDMA_MR_ACTIVE: u32 = 0;
pub const SOFTRDMA_MR_SUSPENDED: u32 = 1;
pub const SOFTRDMA_MR_INVALIDATED: u32 = 2;
/// `enum softrdma_mr_cause`.
pub const SOFTRDMA_CAUSE_NONE: u32 = 0;
pub const SOFTRDMA_CAUSE_UNMAPPED: u32 = 1;
pub const SOFTRDMA_CAUSE_DISCARDED: u32 = 2;
pub const SOFTRDMA_CAUSE_REMAPPED: u32 = 3;
pub const SOFTRDMA_CAUSE_FAULTED: u32 = 4;
pub const SOFTRDMA_CAUSE_VERB: u32 = 5;
