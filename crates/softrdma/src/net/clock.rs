//! The engine's clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The transport's clock: real time since the engine started, or a time its owner sets
/// (a simulation's virtual clock, shared by the devices of one simulated network).
#[derive(Clone, Debug)]
pub enum Clock {
    /// Nanoseconds since this instant.
    Real(Instant),
    /// The value of this counter, in nanoseconds.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// Real time from now on.
    pub fn real() -> Clock {
        Clock::Real(Instant::now())
    }

    /// Nanoseconds now.
    pub fn now(&self) -> u64 {
        match self {
            Clock::Real(epoch) => epoch.elapsed().as_nanos() as u64,
            Clock::Manual(t) => t.load(Ordering::Acquire),
        }
    }
}
