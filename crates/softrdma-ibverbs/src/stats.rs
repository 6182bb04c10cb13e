//! `SOFTRDMA_STATS`: a device's datapath counters, written when the process stops using it.
//!
//! With `SOFTRDMA_STATS` set, each device engine this process opened reports its counters
//! (`softrdma::verbs::EngineCounters`) in one line when its last context closes, or at process
//! exit for an engine still open (MPI ranks and many benchmarks never close their devices):
//!
//! ```text
//! softrdma-stats: pid=4242 dev=softrdma0 addr=10.77.0.1 tx_packets=... rx_packets=... ...
//! ```
//!
//! A value containing `/` names a file the line is appended to (one `write` each, so lines of
//! several processes do not interleave); any other value means standard error. This is how a
//! client's run shows that its traffic went through softrdma and how much of it.

use std::io::Write;
use std::sync::Once;
use std::sync::atomic::Ordering::Relaxed;

use softrdma::verbs;

/// Where the lines go: `None` when `SOFTRDMA_STATS` is unset or empty.
fn target() -> Option<String> {
    std::env::var("SOFTRDMA_STATS")
        .ok()
        .filter(|v| !v.is_empty())
}

/// The report line of one device.
pub fn line(name: &str, d: &verbs::Device) -> String {
    let c = d.counters();
    let fields = [
        ("tx_packets", &c.tx_packets),
        ("tx_datagrams", &c.tx_datagrams),
        ("tx_zero_copy", &c.tx_zero_copy),
        ("tx_errors", &c.tx_errors),
        ("rx_packets", &c.rx_packets),
        ("rx_datagrams", &c.rx_datagrams),
        ("rx_bad", &c.rx_bad),
        ("rx_unknown_qp", &c.rx_unknown_qp),
        ("rx_wrong_peer", &c.rx_wrong_peer),
        ("access_violations", &c.access_violations),
        ("posts_deferred", &c.posts_deferred),
        ("posts_inboxed", &c.posts_inboxed),
        ("posts_dropped", &c.posts_dropped),
        ("thread_wakeups", &c.thread_wakeups),
        ("thread_receives", &c.thread_receives),
    ];
    let mut s = format!(
        "softrdma-stats: pid={} dev={name} addr={}",
        std::process::id(),
        d.local_addr().ip()
    );
    for (k, v) in fields {
        s.push_str(&format!(" {k}={}", v.load(Relaxed)));
    }
    s.push('\n');
    s
}

/// Write `text` where `SOFTRDMA_STATS` says (errors are ignored: reporting must never
/// disturb the program).
fn emit(to: &str, text: &str) {
    if to.contains('/') {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(to)
        {
            let _ = f.write_all(text.as_bytes());
        }
    } else {
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
}

/// Report `d` now (its last context is closing), if asked to.
pub fn report(name: &str, d: &verbs::Device) {
    if let Some(to) = target() {
        emit(&to, &line(name, d));
    }
}

static AT_EXIT: Once = Once::new();

/// Arrange for `at_exit` to run at process exit, once per process, nothing when
/// `SOFTRDMA_STATS` is unset: the engine table's function that reports the engines still open
/// ([`report_open`]). It must never unwind.
pub fn report_at_exit(at_exit: extern "C" fn()) {
    if target().is_none() {
        return;
    }
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that never unwinds (the contract).
        unsafe { libc::atexit(at_exit) };
    });
}

/// Report the engines still open at process exit, if asked to: `lines` gives their report
/// lines ([`fn@line`] of each; empty when there is none or the table was busy).
pub fn report_open(lines: impl FnOnce() -> String) {
    if let Some(to) = target() {
        let text = lines();
        if !text.is_empty() {
            emit(&to, &text);
        }
    }
}
