//! Deterministic simulation of softrdma endpoints over a faulty virtual network.
//!
//! [`World`] holds endpoints (memory, QPs, SRQs) joined by a seeded [`Network`] that drops,
//! duplicates, reorders, delays, corrupts and partitions; time is virtual and a seed
//! reproduces a run exactly. [`SimMemory`] is a buffer-backed `MemoryAccess` with guard
//! bytes. [`workload`] generates random mixed traffic and checks the invariants after every
//! step: RC traffic, UD datagrams ([`workload::ud`]) and UC messages ([`workload::uc`]).

pub mod devices;
pub mod memory;
pub mod net;
pub mod rng;
pub mod workload;
pub mod world;

pub use devices::{DeviceNet, DeviceNetStats};
pub use memory::SimMemory;
pub use net::{Faults, NetEvent, NetStats, Network, Partition};
pub use rng::Rng;
pub use world::{Completion, ConnOpts, Endpoint, Fate, QpRef, TraceEvent, World, WorldStats};
