//! Memory footprint of a device and of each QP, measured as resident memory, plus the bound
//! each QP's buffers can grow to.

use std::net::IpAddr;

use softrdma::verbs::{Device, DeviceConfig, PinMode, QpInitAttr};

/// What `measure` found.
#[derive(Clone, Copy, Debug)]
pub struct Footprint {
    /// Resident bytes an open device with a PD and a CQ adds.
    pub device_bytes: u64,
    /// Resident bytes each QP adds (default capacities, connected to nothing).
    pub per_qp_bytes: u64,
    /// The most a QP's own buffers can hold once used (transmit arena and queues).
    pub per_qp_bound_bytes: u64,
}

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Open a device on 127.0.0.1 (an ephemeral UDP port) and create `qps` QPs.
pub fn measure(qps: usize) -> Result<Footprint, Box<dyn std::error::Error>> {
    let before = rss();
    let mut cfg = DeviceConfig::new(IpAddr::from([127, 0, 0, 1]));
    cfg.port = 0;
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(4096, None)?;
    let base = rss();
    let mut v = Vec::with_capacity(qps);
    for _ in 0..qps {
        v.push(pd.create_qp(&QpInitAttr::new(&cq))?);
    }
    let after = rss();
    let n = qps.max(1) as u64;
    // The transmit batch at the largest path MTU (arena for one GSO datagram + a packet, and
    // its bookkeeping), 128-entry queues of work requests and completions: an upper bound on
    // what a QP's buffers reach when fully used.
    let tx = softrdma::net::endpoint::qp_tx_batch(4096 + softrdma::rc::MAX_OVERHEAD);
    let bound = (tx.reserved_bytes() + 128 * (256 + 64) * 2) as u64;
    Ok(Footprint {
        device_bytes: base.saturating_sub(before),
        per_qp_bytes: after.saturating_sub(base) / n,
        per_qp_bound_bytes: bound,
    })
}
