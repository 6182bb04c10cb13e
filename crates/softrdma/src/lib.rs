//! softrdma: an RDMA NIC written in software.
//!
//! Layers, bottom up: [`wire`] (RoCEv2 headers, opcode table, ICRC, PSN arithmetic) and
//! [`mem`] (protection domains, memory regions and windows, keys, the pinning resource manager).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
pub mod mem;
pub mod net;
pub mod rc;
mod thread;
pub mod verbs;
pub mod wire;
