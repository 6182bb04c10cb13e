//! The datapath: UDP sockets with batching, GSO and GRO.
pub mod udp;

pub use udp::{PortOptions, Received, RxBatch, TxBatch, UdpPort};
