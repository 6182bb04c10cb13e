//! Static-rate conversions (`ibv_rate_to_mult`, `mult_to_ibv_rate`, `ibv_rate_to_mbps`,
//! `mbps_to_ibv_rate`): pure functions with rdma-core 44's tables, so every `enum ibv_rate`
//! value and every unknown input gives the answer Debian's library gives (`tests/exports.rs`
//! compares them over a wide range of inputs).

use core::ffi::c_int;

/// `(enum ibv_rate, multiple of 2.5 Gb/s)`. Rates that are no multiple of 2.5 Gb/s (the FDR
/// and EDR lane rates) are absent: they convert to -1.
const MULT: [(c_int, c_int); 15] = [
    (2, 1),    // IBV_RATE_2_5_GBPS
    (5, 2),    // IBV_RATE_5_GBPS
    (3, 4),    // IBV_RATE_10_GBPS
    (6, 8),    // IBV_RATE_20_GBPS
    (4, 12),   // IBV_RATE_30_GBPS
    (7, 16),   // IBV_RATE_40_GBPS
    (8, 24),   // IBV_RATE_60_GBPS
    (9, 32),   // IBV_RATE_80_GBPS
    (10, 48),  // IBV_RATE_120_GBPS
    (19, 11),  // IBV_RATE_28_GBPS
    (20, 20),  // IBV_RATE_50_GBPS
    (21, 160), // IBV_RATE_400_GBPS
    (22, 240), // IBV_RATE_600_GBPS
    (23, 320), // IBV_RATE_800_GBPS
    (24, 480), // IBV_RATE_1200_GBPS
];

/// `(enum ibv_rate, Mb/s)`: every rate but `IBV_RATE_MAX` (0), with the line rate after
/// encoding overhead for the 64b/66b rates (e.g. 25 Gb/s is 25781 Mb/s).
const MBPS: [(c_int, c_int); 23] = [
    (2, 2500),     // IBV_RATE_2_5_GBPS
    (5, 5000),     // IBV_RATE_5_GBPS
    (3, 10000),    // IBV_RATE_10_GBPS
    (6, 20000),    // IBV_RATE_20_GBPS
    (4, 30000),    // IBV_RATE_30_GBPS
    (7, 40000),    // IBV_RATE_40_GBPS
    (8, 60000),    // IBV_RATE_60_GBPS
    (9, 80000),    // IBV_RATE_80_GBPS
    (10, 120000),  // IBV_RATE_120_GBPS
    (11, 14062),   // IBV_RATE_14_GBPS
    (12, 56250),   // IBV_RATE_56_GBPS
    (13, 112500),  // IBV_RATE_112_GBPS
    (14, 168750),  // IBV_RATE_168_GBPS
    (15, 25781),   // IBV_RATE_25_GBPS
    (16, 103125),  // IBV_RATE_100_GBPS
    (17, 206250),  // IBV_RATE_200_GBPS
    (18, 309375),  // IBV_RATE_300_GBPS
    (19, 28125),   // IBV_RATE_28_GBPS
    (20, 53125),   // IBV_RATE_50_GBPS
    (21, 425000),  // IBV_RATE_400_GBPS
    (22, 637500),  // IBV_RATE_600_GBPS
    (23, 850000),  // IBV_RATE_800_GBPS
    (24, 1275000), // IBV_RATE_1200_GBPS
];

/// `IBV_RATE_MAX`: what an unknown multiple or Mb/s value converts to.
const IBV_RATE_MAX: c_int = 0;

fn forward(table: &[(c_int, c_int)], rate: c_int) -> c_int {
    table
        .iter()
        .find(|(r, _)| *r == rate)
        .map_or(-1, |(_, v)| *v)
}

fn backward(table: &[(c_int, c_int)], value: c_int) -> c_int {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map_or(IBV_RATE_MAX, |(r, _)| *r)
}

/// `ibv_rate_to_mult` (IBVERBS_1.0): the rate as a multiple of 2.5 Gb/s, -1 when it is none.
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    forward(&MULT, rate)
}

/// `mult_to_ibv_rate` (IBVERBS_1.0): the rate of a multiple of 2.5 Gb/s, `IBV_RATE_MAX` (0)
/// for an unknown one.
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    backward(&MULT, mult)
}

/// `ibv_rate_to_mbps` (IBVERBS_1.1): the rate in Mb/s, -1 for `IBV_RATE_MAX` or an unknown
/// value.
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    forward(&MBPS, rate)
}

/// `mbps_to_ibv_rate` (IBVERBS_1.1): the rate of exactly `mbps` Mb/s, `IBV_RATE_MAX` (0) for
/// an unknown value.
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    backward(&MBPS, mbps)
}
