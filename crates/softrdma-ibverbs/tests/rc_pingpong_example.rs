//! softrdma's `rc_pingpong` example speaks the exchange of Debian's `ibv_rc_pingpong`: the
//! unmodified Debian binary (on softrdma's libibverbs.so.1) and the Rust example complete a
//! ping-pong with each other, each as server and as client.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn example() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples").join("rc_pingpong");
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "softrdma", "--example", "rc_pingpong"]);
        if profile_dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().unwrap().success(),
            "building the rc_pingpong example failed"
        );
    });
    path
}

fn wait(mut child: std::process::Child, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} timed out");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    common::assert_clean_exit(what, &out);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

#[test]
fn debian_server_and_rust_client() {
    let server = common::on_softrdma("ibv_rc_pingpong", "softrdma0=127.0.0.32")
        .args(["-g", "0", "-p", "18651", "-s", "4096", "-n", "100"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_listening(18651, Duration::from_secs(20));
    let client = Command::new(example())
        .args([
            "--local",
            "127.0.0.31",
            "-p",
            "18651",
            "-s",
            "4096",
            "-n",
            "100",
            "127.0.0.32",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = wait(client, "rc_pingpong example (client)");
    let s = wait(server, "ibv_rc_pingpong (server)");
    for (who, out) in [("example", &c), ("ibv_rc_pingpong", &s)] {
        assert!(
            out.contains("819200 bytes in") && out.contains("100 iters in"),
            "{who}:\n{out}"
        );
    }
    assert!(
        s.contains("GID ::ffff:127.0.0.31"),
        "the Debian side saw our GID:\n{s}"
    );
}

#[test]
fn rust_server_and_debian_client() {
    let server = Command::new(example())
        .args([
            "--local",
            "127.0.0.34",
            "-p",
            "18652",
            "-s",
            "4096",
            "-n",
            "100",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_listening(18652, Duration::from_secs(20));
    let client = common::on_softrdma("ibv_rc_pingpong", "softrdma0=127.0.0.33")
        .args([
            "-g",
            "0",
            "-p",
            "18652",
            "-s",
            "4096",
            "-n",
            "100",
            "127.0.0.34",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = wait(client, "ibv_rc_pingpong (client)");
    let s = wait(server, "rc_pingpong example (server)");
    for (who, out) in [("ibv_rc_pingpong", &c), ("example", &s)] {
        assert!(
            out.contains("819200 bytes in") && out.contains("100 iters in"),
            "{who}:\n{out}"
        );
    }
}
