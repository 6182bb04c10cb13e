//! What the stateful fuzz targets share: the switch that excludes known issues.
//!
//! A known issue is a bug already reported and being fixed elsewhere. Its invariant stays in
//! the target and panics with `known issue NAME` when hit; to fuzz everything else meanwhile,
//! `SOFTRDMA_FUZZ_SKIP_KNOWN` names the issues whose triggering inputs the targets stop
//! generating (`all`, or a comma-separated list of the names below). See docs/FUZZING.md.

use std::fmt::Display;
use std::sync::LazyLock;

/// A duplicate RDMA READ request (PSN below the expected one) is served with whatever RETH it
/// carries, not only as (a part of) the original READ at that PSN.
pub const DUP_READ_ANY_RETH: &str = "dup-read-any-reth";
/// A remote SEND with Invalidate invalidates a plain memory region (only type 2 windows
/// should be remotely invalidated).
pub const SEND_INV_PLAIN_MR: &str = "send-inv-plain-mr";
/// `rereg_mr` makes an invalidated key valid again.
pub const REREG_REVIVES_INVALIDATED: &str = "rereg-revives-invalidated";
/// An atomic on raw memory mapped read-only crashes the process (SIGSEGV).
pub const ATOMIC_READONLY_RAW: &str = "atomic-readonly-raw";

/// Every known issue, by name.
pub const KNOWN_ISSUES: [&str; 4] = [
    DUP_READ_ANY_RETH,
    SEND_INV_PLAIN_MR,
    REREG_REVIVES_INVALIDATED,
    ATOMIC_READONLY_RAW,
];

static SKIPPED: LazyLock<Vec<String>> = LazyLock::new(|| {
    let v = std::env::var("SOFTRDMA_FUZZ_SKIP_KNOWN").unwrap_or_default();
    if v.trim() == "all" {
        return KNOWN_ISSUES.iter().map(|s| s.to_string()).collect();
    }
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
});

/// True when inputs that trigger the known issue `name` are not to be generated.
pub fn skip(name: &str) -> bool {
    SKIPPED.iter().any(|s| s == name)
}

/// Report a violated invariant that is the known issue `name`.
#[track_caller]
pub fn known_issue(name: &str, detail: impl Display) -> ! {
    panic!("known issue {name}: {detail}")
}
