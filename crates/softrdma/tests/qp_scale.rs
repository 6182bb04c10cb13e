//! Thousands of RC QP pairs between two devices: 2,000 pairs connected, one 64-byte WRITE
//! posted on each at once; all complete with their data placed, without a retransmission
//! storm. (`examples/qp_scale.rs` is the benchmark; this runs it small.)

#[path = "../examples/qp_scale.rs"]
#[allow(dead_code)]
mod qp_scale;

#[test]
fn two_thousand_qp_pairs_each_write_once() {
    let t0 = std::time::Instant::now();
    let f = qp_scale::run(2000, [127, 0, 7, 1].into(), [127, 0, 7, 2].into(), 24806);
    eprintln!("{f:?} in {:?}", t0.elapsed());
    assert_eq!(f.ok, 2000, "WRITEs completed successfully: {f:?}");
    assert_eq!(f.placed, 2000, "WRITEs placed: {f:?}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{f:?}");
}
