//! Shared by the integration tests that run real binaries: build the libraries once with
//! `scripts/build-ibverbs` and find Debian's tools (a missing one fails with the package name).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The directory `scripts/build-ibverbs` lays the libraries out in (it respects
/// `CARGO_TARGET_DIR`, as cargo does; the tests pass on the one cargo uses).
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new("bash")
            .arg(root.join("scripts/build-ibverbs"))
            .output()
            .expect("run scripts/build-ibverbs");
        assert!(
            out.status.success(),
            "scripts/build-ibverbs failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = String::from_utf8(out.stdout).unwrap();
        let dir = PathBuf::from(dir.lines().last().expect("build-ibverbs prints its dir"));
        for lib in [
            "libibverbs.so.1",
            "libmlx5.so.1",
            "libefa.so.1",
            "librdmacm.so.1",
        ] {
            assert!(dir.join(lib).exists(), "{lib} missing in {}", dir.display());
        }
        dir
    })
}

/// `/usr/bin/<tool>`, or a failure naming the Debian package to install.
pub fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    let pkg = match name {
        n if n.starts_with("ibv_") => "ibverbs-utils",
        n if n.starts_with("ib_") => "perftest (with libpci3 and libibumad3)",
        "readelf" => "binutils",
        _ => "?",
    };
    assert!(
        p.exists(),
        "{} is missing: install the Debian package {pkg}",
        p.display()
    );
    p
}

/// A command for `tool` running on our libraries with `devices` as `SOFTRDMA_DEVICES`.
pub fn on_softrdma(tool_name: &str, devices: &str) -> Command {
    let mut c = Command::new(tool(tool_name));
    c.env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTRDMA_DEVICES", devices)
        .env("LD_BIND_NOW", "1")
        .env_remove("SOFTRDMA_CONFIG");
    c
}

/// Panic unless `out` is a clean exit (a status code, not a signal) with no loader error.
pub fn assert_clean_exit(what: &str, out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code().is_some(),
        "{what} was killed by a signal ({:?}); stderr:\n{err}",
        out.status
    );
    for bad in [
        "symbol lookup error",
        "error while loading shared libraries",
        "version `",
        "panicked",
    ] {
        assert!(!err.contains(bad), "{what}: {bad:?} in stderr:\n{err}");
    }
}

#[path = "../../../softrdma/tests/support/listen.rs"]
mod listen;
// Not every test binary that includes this module waits for a port.
#[allow(unused_imports)]
pub use listen::wait_listening;
