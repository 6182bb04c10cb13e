//! The verbs API: the InfiniBand verbs as Rust types, in the vocabulary RDMA programmers know.
//!
//! ```text
//! Device::open(cfg)            ibv_open_device (a device is one IP address)
//!   .alloc_pd()  -> Pd         ibv_alloc_pd
//!   .create_cq() -> Cq         ibv_create_cq (optionally on a CompChannel)
//! Pd::reg_mr / reg_raw / ...   ibv_reg_mr (owned buffer, raw address, file range, device memory)
//! Pd::create_qp  -> Qp         ibv_create_qp (RC)
//! Pd::create_srq -> Srq        ibv_create_srq
//! Pd::alloc_mw   -> Mw         ibv_alloc_mw (type 1 or 2)
//! Qp::modify / post_send / post_recv / bind_mw
//! Cq::poll / req_notify        ibv_poll_cq / ibv_req_notify_cq
//! ConnectionManager::open(dev) rdma_cm on the device's QP1: listen / connect / accept / reject
//! ```
//!
//! Lifetimes are enforced by ownership: a QP holds its CQs, SRQ and device alive; dropping a
//! QP moves it to the error state, flushes its work requests and forgets it. Registered memory
//! is reached only through keys validated by the memory table, so a region dropped while a
//! work request still names its key makes that request fail (`LocProtErr` locally,
//! `RemAccessErr` remotely); it can never touch freed memory.

mod cm;
mod cq;
mod device;
mod error;
mod mr;
mod mw;
mod pd;
mod qp;
mod srq;

pub mod connect;

pub use cm::{
    CmError, CmHook, ConnParam, ConnRequest, Connection, ConnectionManager, HookVerdict, Listener,
    RawCm,
};
pub use cq::{CompChannel, Cq, EMPTY_WC};
pub use device::{Device, DeviceAttr, DeviceConfig, MAX_CQE, PortAttr};
pub use error::VerbsError;
pub use mr::{Mr, MrRereg};
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{Ah, MwBind, PostBatch, Qp, QpInitAttr, RecvBatch, random_psn};
pub use srq::Srq;

pub use crate::mem::{
    Access, AccessCtx, AccessError, InvalidationCause, MemConfig, MemSource, MwType, PageSize,
    PinMode, RawCopy, RegionState, RemapPolicy, WatchMode,
};
pub use crate::net::{AsyncEvent, AsyncEventHook, EngineCounters, PollMode};
pub use crate::rc::qp_state::MAX_RD_ATOMIC;
pub use crate::rc::unreliable::grh_source;
pub use crate::rc::{
    GRH_LEN, MAX_SGE, Mtu, NetworkHdr, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
pub use crate::wire::AddressVector;
