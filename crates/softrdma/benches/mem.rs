//! Memory registration benchmarks (see docs/PERFORMANCE.md).
fn main() {}
