//! softrdma: an RDMA NIC written in software.
//!
//! Layers, bottom up (docs/ARCHITECTURE.md draws them):
//!
//! * [`wire`]: RoCEv2 headers, the opcode table, the ICRC, PSN arithmetic, the CM's MADs;
//!   zero-copy views with parse and emit.
//! * [`mem`]: protection domains, memory regions and windows, keys, the pinning resource
//!   manager, suspend and resume, lending to the transmit path, coherence with the
//!   application's mappings.
//! * [`rc`]: the sans-IO transports (RC's requester, completer and responder; UC and UD) and
//!   the QP state machine: packets and time in, packets, completions and deadlines out.
//! * [`cm`]: the sans-IO Communication Manager (connections, SIDR) on MADs and time.
//! * [`net`]: the device core ([`net::Endpoint`], sans-IO: the QP table, demultiplexing and
//!   the peer check, ICRC verification, the ACK policy, the transmit loop, timers) and the
//!   per-device engine that drives it over a port (a UDP socket, or a memory network for
//!   deterministic tests) on a clock; completion queues and channels; asynchronous events.
//! * [`params`]: the tunables of the layers above, in one place.
//! * [`verbs`]: the public verbs API (devices, PDs, MRs, MWs, CQs, QPs, SRQs, the connection
//!   manager), which the C ABI crate wraps as `libibverbs.so.1`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod cm;
pub mod mem;
pub mod net;
pub mod params;
pub mod rc;
mod thread;
pub mod verbs;
pub mod wire;
