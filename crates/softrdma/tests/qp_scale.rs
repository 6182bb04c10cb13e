//! Sixteen thousand QPs on two devices: 8,000 RC QP pairs connected, one 64-byte WRITE
//! posted on each at once; all complete with their data placed, without a retransmission
//! storm. (`examples/qp_scale.rs` is the benchmark; this runs its burst once.)
//!
//! The retransmission bound (a quarter of the WRITEs) failed before the engine thread took the
//! acknowledgements queued on its socket ahead of a timer scan: with another build running,
//! 4,670 of the 8,000 WRITEs were retransmitted although no datagram was lost.

#[path = "../examples/qp_scale.rs"]
#[allow(dead_code)]
mod qp_scale;

#[test]
fn eight_thousand_qp_pairs_each_write_once() {
    const PAIRS: usize = 8000;
    let t0 = std::time::Instant::now();
    let f = qp_scale::run(PAIRS, [127, 0, 7, 1].into(), [127, 0, 7, 2].into(), 24806);
    eprintln!("{f:?} in {:?}", t0.elapsed());
    assert_eq!(f.ok, PAIRS, "WRITEs completed successfully: {f:?}");
    assert_eq!(f.placed, PAIRS, "WRITEs placed: {f:?}");
    // Nothing is lost on loopback: a retransmission is a timer that fired before the
    // acknowledgement was handled. On a quiet machine none does (0 in 30 of 31 local runs);
    // when the machine is starved the burst itself outlasts the 67 ms timeout and some do
    // (1,307 in a CI run whose WRITEs cost 49 us each instead of 14). The storm this guards
    // against, a timer scan ahead of the queued acknowledgements, retransmitted 4,670 (58 %).
    assert!(
        f.retransmits < PAIRS as u64 / 4,
        "retransmission storm: {f:?}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(60), "{f:?}");
}
