//! The datapath: UDP sockets with batching, GSO and GRO; the per-device engine that drives
//! the transport; completion queues and channels.
pub mod async_event;
pub mod clock;
pub mod cq;
pub mod engine;
pub mod port;
pub mod udp;

pub use async_event::{ASYNC_EVENT_QUEUE, AsyncEvent, AsyncEventHook, AsyncEvents};
pub use clock::Clock;
pub use cq::{ChannelCore, CqCore};
pub use engine::{Engine, EngineCounters, PollMode, QpBody, QpCell, QpGuard, SrqCore};
pub use port::{Datagram, MemoryNet, MemoryPort, Port};
pub use udp::{PortOptions, Received, RxBatch, TxBatch, UdpPort};
