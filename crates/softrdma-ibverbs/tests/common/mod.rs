//! Shared by the integration tests that run real binaries: build the libraries once with
//! `scripts/build-ibverbs` and find Debian's tools (a missing one fails with the package name).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
        "rping" | "ucmatose" | "rdma_server" | "rdma_client" => "rdmacm-utils",
        "qperf" => "qperf",
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

/// Wait for `child` at most `limit`; kill it if it is still running then.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Compile the C program `src` against verbs.h, `include/softrdma/sdv.h` and our library
/// (`cc_args` added), run it with `devices` as `SOFTRDMA_DEVICES` and `SOFTRDMA_PIN` set to
/// `pin` (unset: the default, pinned); it must exit 0 having printed "ALL OK" within a
/// minute. Returns what it printed. A compiler error or a crash fails the test.
pub fn run_c_program(src: &Path, devices: &str, pin: Option<&str>, cc_args: &[&str]) -> String {
    let name = src.file_name().unwrap().to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("softrdma-capi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("prog");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(concat!("-I", env!("CARGO_MANIFEST_DIR"), "/include"))
        .arg(src)
        .args(cc_args)
        .arg(format!("-L{}", lib_dir().display()))
        .arg("-l:libibverbs.so.1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e} (install the Debian package gcc)"));
    assert!(
        out.status.success(),
        "{name} does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new(&exe);
    cmd.env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTRDMA_DEVICES", devices)
        .env_remove("SOFTRDMA_PIN")
        .env_remove("SOFTRDMA_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = pin {
        cmd.env("SOFTRDMA_PIN", p);
    }
    let child = cmd.spawn().unwrap();
    let run = wait_bounded(child, Duration::from_secs(60));
    assert_clean_exit(&name, &run);
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && text.contains("ALL OK"),
        "{name}:\n{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    text.into_owned()
}

#[path = "../../../softrdma/tests/support/listen.rs"]
mod listen;
// Not every test binary that includes this module waits for a port.
#[allow(unused_imports)]
pub use listen::wait_listening;
