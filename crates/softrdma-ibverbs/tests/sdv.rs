//! softrdma's own C calls (`include/softrdma/sdv.h`), device memory and dma-buf regions,
//! through C programs compiled against verbs.h, sdv.h and the built library. A program that
//! does not compile, crashes, or does not print "ALL OK" within a minute fails its test.

mod common;

use std::path::Path;

use common::run_c_program;

fn manifest(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Bad pointers, resume without suspend, the state through suspend / resume on new memory /
/// unmap, the remap policy, out-struct sizes (tests/c/sdv_misuse.c).
#[test]
fn sdv_calls_refuse_misuse_and_report_state() {
    let out = run_c_program(
        &manifest("tests/c/sdv_misuse.c"),
        "softrdma0=127.0.0.61,softrdma1=127.0.0.62",
        Some("on-demand"),
        &[],
    );
    eprintln!("{out}");
}

/// `ibv_alloc_dm` / `ibv_memcpy_to_dm` / a peer's RDMA READ and WRITE / `ibv_memcpy_from_dm`,
/// and `ibv_reg_dmabuf_mr` on a memfd, with their error paths (tests/c/dm_dmabuf.c).
#[test]
fn device_memory_and_dmabuf_regions_through_verbs_h() {
    let out = run_c_program(
        &manifest("tests/c/dm_dmabuf.c"),
        "softrdma0=127.0.0.63,softrdma1=127.0.0.64",
        Some("on-demand"),
        &[],
    );
    eprintln!("{out}");
}

/// The extended verbs through verbs.h: `ibv_create_cq_ex` and its poll calls, `ibv_create_qp_ex`
/// with the `ibv_wr_*` post API for every operation offered, type 1 and type 2 windows, and
/// the refusals of what is not offered (tests/c/ext_verbs.c).
#[test]
fn extended_cqs_and_the_wr_post_api_through_verbs_h() {
    let out = run_c_program(
        &manifest("tests/c/ext_verbs.c"),
        "softrdma0=127.0.0.69,softrdma1=127.0.0.70",
        Some("on-demand"),
        &[],
    );
    eprintln!("{out}");
}

/// The example `examples/c/migrate.c`: a region moved to new memory in the middle of a
/// 32 MiB WRITE, SEND and READ and under an atomic; the peer sees only RNR NAKs and
/// successes, every byte is in the new memory.
#[test]
fn migrate_example_moves_a_region_under_traffic() {
    let out = run_c_program(
        &manifest("examples/c/migrate.c"),
        "softrdma0=127.0.0.65,softrdma1=127.0.0.66",
        Some("on-demand"),
        &["-O2"],
    );
    eprintln!("{out}");
    for phase in ["WRITE", "SEND", "READ"] {
        assert!(
            out.contains(&format!("{phase}: suspended mid-message")),
            "{phase} was not suspended mid-message:\n{out}"
        );
    }
}
