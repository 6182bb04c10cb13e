//! Acceptance 4: every offset, size and alignment this library relies on equals the installed
//! `infiniband/verbs.h` (Debian package libibverbs-dev). The C probe is generated from
//! `ibverbs::abi::layout::table()`, so a field added to the table is checked automatically.

use std::fmt::Write as _;
use std::process::Command;

use ibverbs::abi::layout::{FieldLayout, table};

const HEADER: &str = "/usr/include/infiniband/verbs.h";

fn probe_source(rows: &[FieldLayout]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         #include <softrdma/sdv.h>\n\
         /* verbs_context is declared in verbs.h */\nint main(void) {\n",
    );
    for r in rows {
        if r.field.is_empty() {
            writeln!(
                c,
                "  printf(\"%s||%zu|%zu\\n\", \"{t}\", (size_t)_Alignof({t}), sizeof({t}));",
                t = r.c_type
            )
            .unwrap();
        } else {
            writeln!(
                c,
                "  printf(\"%s|%s|%zu|%zu\\n\", \"{t}\", \"{f}\", offsetof({t}, {f}), \
                 sizeof((({t} *)0)->{f}));",
                t = r.c_type,
                f = r.field
            )
            .unwrap();
        }
    }
    c.push_str("  return 0;\n}\n");
    c
}

#[test]
fn layouts_match_installed_verbs_h() {
    assert!(
        std::path::Path::new(HEADER).exists(),
        "{HEADER} is missing: install the Debian package libibverbs-dev"
    );
    let rows = table();
    assert!(rows.len() > 300, "layout table unexpectedly small");
    let dir = std::env::temp_dir().join(format!("softrdma-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, probe_source(&rows)).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-std=gnu11")
        .arg(concat!("-I", env!("CARGO_MANIFEST_DIR"), "/include"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e} (install the Debian package gcc)"));
    assert!(
        out.status.success(),
        "the C probe does not compile against {HEADER}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let text = String::from_utf8(run.stdout).unwrap();
    let mut diffs = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), rows.len());
    for (r, line) in rows.iter().zip(lines) {
        let parts: Vec<&str> = line.split('|').collect();
        let (off, size): (usize, usize) = (parts[2].parse().unwrap(), parts[3].parse().unwrap());
        if (off, size) != (r.offset, r.size) {
            let what = if r.field.is_empty() {
                "align/size"
            } else {
                "offset/size"
            };
            diffs.push(format!(
                "{}.{}: C {what} {off}/{size}, Rust {}/{}",
                r.c_type, r.field, r.offset, r.size
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        diffs.is_empty(),
        "layout differences:\n{}",
        diffs.join("\n")
    );
}

/// The sizes verbs-abi.md records (a second, independent check of the table itself).
#[test]
fn sizes_as_documented() {
    use core::mem::{offset_of, size_of};
    use ibverbs::abi::*;
    assert_eq!(size_of::<ibv_context>(), 328);
    assert_eq!(size_of::<verbs_context>(), 648);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(size_of::<ibv_device>(), 664);
    assert_eq!(size_of::<ibv_mr>(), 48);
    assert_eq!(size_of::<ibv_cq>(), 128);
    assert_eq!(size_of::<ibv_qp>(), 160);
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(size_of::<ibv_send_wr>(), 128);
    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(size_of::<ibv_qp_ex>(), 352);
    assert_eq!(
        offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
        208
    );
    assert_eq!(ibverbs::context::CONTEXT_OFFSET, 320);
    // /work/shared/reference/verbs-abi-offsets.txt: reg_dm_mr 56, alloc_dm 64, free_dm 72.
    for (slot, off) in [
        (vctx_slot::REG_DM_MR, 56),
        (vctx_slot::ALLOC_DM, 64),
        (vctx_slot::FREE_DM, 72),
        (vctx_slot::QUERY_DEVICE_EX, 216),
        // verbs.h (offsetof(struct verbs_context, ...)): create_cq_ex 200, create_qp_ex 264.
        (vctx_slot::CREATE_CQ_EX, 200),
        (vctx_slot::CREATE_QP_EX, 264),
        (vctx_slot::ADVISE_MR, 8),
    ] {
        assert_eq!(offset_of!(verbs_context, ops) + slot * 8, off);
    }
    assert_eq!(size_of::<ibv_dm>(), 32);
    assert_eq!(size_of::<ibv_alloc_dm_attr>(), 16);
}

/// A QP of this library is a `struct ibv_qp_ex` (`ibv_qp_to_qp_ex` is a cast): its `ibv_qp`,
/// then the operations in verbs.h's order.
#[test]
fn a_qp_is_an_ibv_qp_ex() {
    use core::mem::offset_of;
    use ibverbs::abi::ibv_qp_ex;
    use ibverbs::qp::Qp;
    use ibverbs::qp_ex::QpExOps;
    assert_eq!(offset_of!(Qp, qp), 0);
    assert_eq!(offset_of!(Qp, ex), offset_of!(ibv_qp_ex, comp_mask));
    assert_eq!(
        offset_of!(Qp, ex) + offset_of!(QpExOps, wr_id),
        offset_of!(ibv_qp_ex, wr_id)
    );
    assert_eq!(
        offset_of!(Qp, ex) + offset_of!(QpExOps, wr_flags),
        offset_of!(ibv_qp_ex, wr_flags)
    );
    assert_eq!(
        offset_of!(Qp, ex) + offset_of!(QpExOps, ops),
        offset_of!(ibv_qp_ex, wr_atomic_cmp_swp)
    );
    assert_eq!(
        offset_of!(Qp, ex) + offset_of!(QpExOps, ops) + 20 * 8,
        offset_of!(ibv_qp_ex, wr_atomic_write)
    );
    assert_eq!(
        offset_of!(Qp, ex) + core::mem::size_of::<QpExOps>(),
        core::mem::size_of::<ibv_qp_ex>()
    );
}
