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

/// `name@NODE` of every symbol of the table, compatibility-only ones included.
fn table() -> BTreeSet<String> {
    ibverbs::exports::EXPORTS
        .iter()
        .chain(ibverbs::exports::COMPAT_EXPORTS)
        .map(|(n, v)| format!("{n}@{v}"))
        .collect()
}

/// The defined dynamic symbols of `file` as readelf spells them: `name@@NODE` for a default
/// version, `name@NODE` for a compatibility-only one (unversioned ones are left out).
fn versioned_definitions(file: &std::path::Path) -> BTreeSet<String> {
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
            (f.len() >= 8 && f[6] != "UND" && f[7].contains('@')).then(|| f[7].to_string())
        })
        .collect()
}

#[test]
fn map_matches_export_table() {
    assert_eq!(map_symbols(), table());
}

#[test]
fn library_exports_every_symbol_debian_tools_import() {
    let lib = lib_dir().join("libibverbs.so.1");
    let ours = dyn_syms(&lib, true);
    assert_eq!(
        ours,
        table(),
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

/// Debian's libibverbs.so.1 (rdma-core 44).
const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// Whether a versioned definition of Debian's library is part of the provider ABI rather than
/// the application one: the `IBVERBS_PRIVATE_<n>` node (which changes with every rdma-core
/// release: `ibv_cmd_*`, `verbs_*`, `_verbs_*`, `execute_ioctl`, `__ioctl_final_num_attrs`,
/// `__verbs_log`, `ibv_read_ibdev_sysfs_file`, `ibv_query_gid_type`) and the node markers
/// themselves.
fn provider_private(sym: &str) -> bool {
    let (name, node) = sym.split_once('@').unwrap();
    let node = node.trim_start_matches('@');
    node.starts_with("IBVERBS_PRIVATE_")
        || name == node
        || ["ibv_cmd_", "verbs_", "_verbs_", "execute_ioctl"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// Every public function Debian's library defines is defined by ours with the same version,
/// default or compatibility-only alike. The one family left out: the `@IBVERBS_1.0`
/// compatibility versions of functions whose default is `@@IBVERBS_1.1` (`ibv_alloc_pd`,
/// `ibv_create_qp`, ...: libibverbs 1.0's ABI, with other struct layouts). No binary built
/// since 2007 binds to them, and serving them would mean a second set of structs.
#[test]
fn library_defines_every_public_symbol_of_debians_libibverbs() {
    let debian = std::path::Path::new(DEBIAN_LIB);
    assert!(
        debian.exists(),
        "{DEBIAN_LIB} is missing: install the Debian package libibverbs1"
    );
    let theirs: BTreeSet<String> = versioned_definitions(debian)
        .into_iter()
        .filter(|s| !provider_private(s))
        .collect();
    let defaults: BTreeSet<&str> = theirs
        .iter()
        .filter(|s| s.contains("@@"))
        .map(|s| s.split('@').next().unwrap())
        .collect();
    let (old_abi, wanted): (BTreeSet<&String>, BTreeSet<&String>) = theirs.iter().partition(|s| {
        let (name, node) = s.split_once('@').unwrap();
        node == "IBVERBS_1.0" && defaults.contains(name)
    });
    assert!(
        old_abi.len() > 20 && old_abi.iter().all(|s| !s.contains("@@")),
        "unexpected set of IBVERBS_1.0 compatibility symbols: {old_abi:?}"
    );
    let ours = versioned_definitions(&lib_dir().join("libibverbs.so.1"));
    let missing: Vec<&String> = wanted.into_iter().filter(|s| !ours.contains(*s)).collect();
    assert!(
        missing.is_empty(),
        "Debian's libibverbs.so.1 defines these, ours does not (or at another version):\n{}",
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The stub provider libraries (scripts/gen-provider-stubs) define every symbol of every
/// version node Debian's libmlx5.so.1 and libefa.so.1 define, so that programs linked
/// against them (perftest, pyverbs, UCX) load; `mlx5dv_is_supported` says no.
#[test]
fn provider_stubs_define_every_symbol_of_debians() {
    for lib in ["libmlx5.so.1", "libefa.so.1"] {
        let debian = std::path::Path::new("/usr/lib/x86_64-linux-gnu").join(lib);
        assert!(
            debian.exists(),
            "{} is missing: install the Debian package ibverbs-providers",
            debian.display()
        );
        let theirs = versioned_definitions(&debian);
        let ours = versioned_definitions(&lib_dir().join(lib));
        assert!(theirs.len() > 5, "{theirs:?}");
        let missing: Vec<_> = theirs.difference(&ours).collect();
        let extra: Vec<_> = ours.difference(&theirs).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{lib}: missing {missing:?}\nextra {extra:?} (run scripts/gen-provider-stubs)"
        );
    }
}
