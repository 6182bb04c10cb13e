//! The datapath: UDP sockets with batching, GSO and GRO; the device core (the sans-IO
//! endpoint: QP table, demultiplexing, transmit loop, timers); the per-device engine that
//! drives it with a port, a clock and a thread; completion queues and channels.
pub mod async_event;
pub mod clock;
pub mod counters;
pub mod cq;
pub mod endpoint;
pub mod engine;
pub mod port;
pub mod udp;

pub use async_event::{ASYNC_EVENT_QUEUE, AsyncEvent, AsyncEventHook, AsyncEvents};
pub use clock::Clock;
pub use counters::EngineCounters;
pub use cq::{ChannelCore, CqCore};
pub use endpoint::{Endpoint, EndpointIo, QpBody, QpCell, QpGuard, RxWork, SrqCore};
pub use engine::{Engine, PollMode};
pub use port::{Datagram, MemoryNet, MemoryPort, Port};
pub use udp::{PortOptions, Received, RxBatch, TxBatch, UdpPort};
