//! The `softrdma` command's building blocks: reading captures, decoding RoCEv2 packets, and
//! the sample capture made with softrdma's own packet builder.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod baseline;
pub mod capture;
pub mod decode;
pub mod footprint;
pub mod perf;
pub mod plot;
pub mod sample;
