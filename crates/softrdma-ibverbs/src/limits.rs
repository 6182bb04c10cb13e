//! The capabilities `ibv_query_device` and `ibv_query_port` report: within the engine's
//! limits (`softrdma::verbs::Device::query_device`), so that anything a program sizes from
//! them is accepted.

/// Largest region (128 TiB: the user address space of x86_64).
pub const MAX_MR_SIZE: u64 = 1 << 47;
/// Page sizes a region may use (any multiple of 4 KiB; regions are byte-granular anyway).
pub const PAGE_SIZE_CAP: u64 = 0xffff_f000;
/// No IEEE OUI: a software device (as Linux rxe reports).
pub const VENDOR_ID: u32 = 0x00ff_ffff;
/// "SR".
pub const VENDOR_PART_ID: u32 = 0x5352;
pub const HW_VER: u32 = 1;
pub const MAX_QP: i32 = 1 << 14;
pub const MAX_QP_WR: i32 = 1 << 14;
/// The engine's limit (`softrdma::verbs::MAX_SGE`).
pub const MAX_SGE: i32 = softrdma::verbs::MAX_SGE as i32;
pub const MAX_CQ: i32 = 1 << 14;
/// The engine's limit (`softrdma::verbs::MAX_CQE`, 2^20); libfabric's verbs provider asks for
/// 2^18 entries.
pub const MAX_CQE: i32 = softrdma::verbs::MAX_CQE as i32;
/// Regions and windows share the key space of the memory table (`MemConfig::max_keys`).
pub const MAX_MR: i32 = (1 << 16) - 1;
pub const MAX_MW: i32 = (1 << 16) - 1;
/// `MemConfig::max_pds`.
pub const MAX_PD: i32 = 1 << 12;
/// The engine's limit (`softrdma::verbs::MAX_RD_ATOMIC`).
pub const MAX_QP_RD_ATOM: i32 = softrdma::verbs::MAX_RD_ATOMIC as i32;
pub const MAX_RES_RD_ATOM: i32 = MAX_QP * MAX_QP_RD_ATOM;
pub const MAX_AH: i32 = 1 << 16;
pub const MAX_SRQ: i32 = 1 << 12;
pub const MAX_SRQ_WR: i32 = 1 << 14;
pub const MAX_SRQ_SGE: i32 = MAX_SGE;
/// 4.096 µs * 2^15 ≈ 134 ms: how long the device may take to acknowledge.
pub const LOCAL_CA_ACK_DELAY: u8 = 15;
/// Entries of the GID table (0 and 1 hold the IPv4-mapped address; the rest are empty).
pub const GID_TBL_LEN: i32 = 16;
/// Largest message (2 GiB, the InfiniBand limit).
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// `IBV_PORT_PHYS_STATE_LINK_UP`.
pub const PHYS_STATE_LINK_UP: u8 = 5;
