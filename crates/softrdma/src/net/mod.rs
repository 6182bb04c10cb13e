//! The datapath: UDP sockets with batching, GSO and GRO; the per-device engine that drives
//! the transport; completion queues and channels.
pub mod async_event;
pub mod cq;
pub mod engine;
pub mod udp;

pub use async_event::{ASYNC_EVENT_QUEUE, AsyncEvent, AsyncEventHook, AsyncEvents};
pub use cq::{ChannelCore, CqCore};
pub use engine::{Engine, EngineCounters, PollMode, QpBody, QpCell, QpGuard, SrqCore};
pub use udp::{PortOptions, Received, RxBatch, TxBatch, UdpPort};
