//! The engines behind contexts: a `softrdma::verbs::Device` per device in use in this process,
//! shared by every context of the device (`engine_for`: a device is one address and one UDP
//! port) and stopped when the last of them closes (`release_engine`); and the engine's
//! settings from the environment ([`poll_mode`], [`pin_mode`], [`raw_copy`]).
//!
//! With `SOFTRDMA_STATS` set, an engine's counters are reported when it stops, and those of
//! the engines still open at process exit (`crate::stats`).

use core::ffi::c_int;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use softrdma::verbs;
use softrdma::verbs::PinMode;

use crate::device::Device;
use crate::stats;

/// Where the asynchronous events of the engine of a device go (the context assembling it
/// names the function: an `ibv_async_event` on the async fd of the context owning the QP).
pub type AsyncEventHook = fn(&'static Device, verbs::AsyncEvent);

/// Engines in use in this process, by device name, with their number of users.
static ENGINES: LazyLock<Mutex<HashMap<String, (verbs::Device, usize)>>> =
    LazyLock::new(Default::default);

/// The engine of `dev`, opening it if no context of this process uses it yet (then its
/// asynchronous events go to `on_async_event`).
pub(crate) fn engine_for(
    dev: &'static Device,
    on_async_event: AsyncEventHook,
) -> Result<verbs::Device, c_int> {
    let mut g = ENGINES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((d, users)) = g.get_mut(&dev.cfg.name) {
        *users += 1;
        return Ok(d.clone());
    }
    let mut cfg = verbs::DeviceConfig::new(std::net::IpAddr::V4(dev.cfg.addr));
    cfg.mode = poll_mode();
    cfg.pin_mode = pin_mode();
    cfg.raw_copy = raw_copy();
    cfg.active_mtu = verbs::Mtu::ALL
        .into_iter()
        .find(|m| *m as i32 == dev.cfg.active_mtu)
        .unwrap_or(verbs::Mtu::Mtu1024);
    let d = verbs::Device::open(cfg).map_err(|e| {
        let errno = e.errno();
        eprintln!(
            "softrdma: cannot open {} ({}): {e}",
            dev.cfg.name, dev.cfg.addr
        );
        errno
    })?;
    // Asynchronous events of the engine go to the async fd of the context owning the QP.
    d.set_async_event_hook(Some(std::sync::Arc::new(move |ev| on_async_event(dev, ev))));
    g.insert(dev.cfg.name.clone(), (d.clone(), 1));
    stats::report_at_exit(report_open_engines);
    Ok(d)
}

/// The concatenated `f(name, engine)` of every engine still open (empty if the table is busy:
/// this runs at process exit, where waiting could deadlock).
fn open_engines(f: impl Fn(&str, &verbs::Device) -> String) -> String {
    match ENGINES.try_lock() {
        Ok(g) => g.iter().map(|(name, (d, _))| f(name, d)).collect(),
        Err(_) => String::new(),
    }
}

/// At process exit: report the engines still open (registered by `stats::report_at_exit`).
extern "C" fn report_open_engines() {
    // Never unwind across the C runtime; a poisoned or busy table is skipped.
    let _ = std::panic::catch_unwind(|| stats::report_open(|| open_engines(stats::line)));
}

/// A context stopped using the engine of `dev`; the last one stops it.
pub(crate) fn release_engine(dev: &'static Device) {
    let mut g = ENGINES.lock().unwrap_or_else(PoisonError::into_inner);
    let last = match g.get_mut(&dev.cfg.name) {
        Some((_, users)) => {
            *users -= 1;
            *users == 0
        }
        None => false,
    };
    if last {
        if let Some((d, _)) = g.get(&dev.cfg.name) {
            stats::report(&dev.cfg.name, d);
        }
        // Dropping the last handle stops the engine and closes its socket; under the lock, so
        // that a context opening the device again meanwhile binds only after the close.
        drop(g.remove(&dev.cfg.name));
    }
}

/// The engine's polling mode from `SOFTRDMA_POLL`: `busy` (the default: `ibv_poll_cq`
/// receives and processes packets in the calling thread, and the engine thread steps in
/// when nobody polls, so `ibv_get_cq_event` users are served too) or `blocking` (only the
/// engine thread receives; less CPU, more latency).
pub fn poll_mode() -> verbs::PollMode {
    match std::env::var("SOFTRDMA_POLL").as_deref() {
        Ok("blocking") => verbs::PollMode::Blocking,
        _ => verbs::PollMode::BusyPoll,
    }
}

/// The pinning policy from `SOFTRDMA_PIN` (`pinned`, the default, or `on-demand`).
pub fn pin_mode() -> PinMode {
    match std::env::var("SOFTRDMA_PIN").as_deref() {
        Ok("on-demand") | Ok("odp") => PinMode::OnDemand,
        _ => PinMode::Pinned,
    }
}

/// How registered memory is copied, from `SOFTRDMA_RAW_COPY`: `checked` (the default:
/// checked copies, so that memory unmapped under traffic ends in an access error, never a
/// signal), `kernel` (always the kernel's checked copies, for programs that own `SIGSEGV`
/// and `SIGBUS` without chaining) or `plain` (`memcpy`, for programs that never unmap or
/// move registered memory: an unmap under traffic may then crash the process).
pub fn raw_copy() -> verbs::RawCopy {
    match std::env::var("SOFTRDMA_RAW_COPY").as_deref() {
        Ok("plain") => verbs::RawCopy::Plain,
        Ok("kernel") => verbs::RawCopy::Kernel,
        _ => verbs::RawCopy::Checked,
    }
}
