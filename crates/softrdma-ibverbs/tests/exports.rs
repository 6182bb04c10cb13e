//! The symbol list (`src/exports.rs`), the version script (`libibverbs.map`), the built
//! library and what Debian's binaries import must all agree.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{lib_dir, tool};

/// `name@NODE` of every symbol in the version script.
fn map_symbols() -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/libibverbs.map")).unwrap();
    let mut out = BTreeSet::new();
    let mut node = String::new();
    for line in text.lines().map(str::trim) {
        if let Some(n) = line.strip_suffix('{').map(str::trim)
            && !n.is_empty()
        {
            node = n.to_string();
        } else if let Some(sym) = line.strip_suffix(';')
            && !sym.contains(':')
            && !sym.contains('}')
            && !sym.contains('*')
            && !sym.is_empty()
        {
            out.insert(format!("{sym}@{node}"));
        }
    }
    out
}

/// `name@NODE` of the dynamic symbols of `file` that are defined (or undefined) there.
fn dyn_syms(file: &std::path::Path, defined: bool) -> BTreeSet<String> {
    let out = Command::new(tool("readelf"))
        .args(["--dyn-syms", "-W"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || (f[6] == "UND") == defined {
                return None;
            }
            Some(f[7].replace("@@", "@"))
        })
        .filter(|s| {
            s.contains("@IBVERBS_")
                || s.contains("@SOFTRDMA_")
                || (defined && (s.starts_with("ibv_") || s.starts_with("softrdma_")))
        })
        .map(|s| s.split(" (").next().unwrap_or(&s).to_string())
        .collect()
}

#[test]
fn map_matches_export_table() {
    let table: BTreeSet<String> = ibverbs::exports::EXPORTS
        .iter()
        .map(|(n, v)| format!("{n}@{v}"))
        .collect();
    assert_eq!(map_symbols(), table);
}

#[test]
fn library_exports_every_symbol_debian_tools_import() {
    let lib = lib_dir().join("libibverbs.so.1");
    let ours = dyn_syms(&lib, true);
    let table: BTreeSet<String> = ibverbs::exports::EXPORTS
        .iter()
        .map(|(n, v)| format!("{n}@{v}"))
        .collect();
    assert_eq!(
        ours, table,
        "the built library's versioned symbols differ from the table"
    );
    let mut missing = Vec::new();
    for bin in [
        "ibv_devinfo",
        "ibv_devices",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
        "ibv_asyncwatch",
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
    ] {
        for sym in dyn_syms(&tool(bin), false) {
            if !ours.contains(&sym) {
                missing.push(format!("{bin}: {sym}"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported:\n{}", missing.join("\n"));
}
