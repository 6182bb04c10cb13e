//! The examples run as separate processes: the three-process spin-lock, rc_pingpong (busy-poll,
//! event mode, and sleeping in poll(2) on the channel's descriptor) and write_bw.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn example(name: &str) -> PathBuf {
    // `cargo test` builds the examples beside the test binaries (target/<profile>/examples/);
    // a run of this test alone (`--test examples`) does not, so build them then.
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        BUILD.call_once(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "softrdma", "--examples"]);
            if profile_dir.ends_with("release") {
                cmd.arg("--release");
            }
            assert!(
                cmd.status().unwrap().success(),
                "building the examples failed"
            );
        });
    }
    assert!(path.exists(), "{} not built", path.display());
    path
}

fn run(cmd: &mut Command, secs: u64) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("timed out: {}", String::from_utf8_lossy(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn spinlock_shared_by_three_processes_protects_the_counter() {
    let out = run(
        Command::new(example("spinlock")).args([
            "--demo",
            "--rounds",
            "50",
            "--home",
            "127.0.2.10",
        ]),
        120,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("home: lock word 0, counter 150, expected 150"),
        "{text}"
    );
    assert_eq!(text.matches("50 rounds").count(), 3, "{text}");
}

#[test]
fn rc_pingpong_server_and_client() {
    for (port, extra) in [
        ("19101", None),
        ("19102", Some("-e")),
        ("19103", Some("--poll-fd")),
    ] {
        let mut args = vec!["-p", port, "-s", "4096", "-n", "200"];
        args.extend(extra);
        let server = Command::new(example("rc_pingpong"))
            .args(["--local", "127.0.2.21"])
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        support::wait_listening(port.parse().unwrap(), Duration::from_secs(20));
        let out = run(
            Command::new(example("rc_pingpong"))
                .args(["--local", "127.0.2.20"])
                .args(&args)
                .arg("127.0.2.21"),
            60,
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("1638400 bytes in") && text.contains("200 iters in"),
            "{text}"
        );
        let sout = server.wait_with_output().unwrap();
        assert!(
            sout.status.success(),
            "{}",
            String::from_utf8_lossy(&sout.stderr)
        );
        assert!(String::from_utf8_lossy(&sout.stdout).contains("200 iters in"));
    }
}

#[test]
fn write_bw_streams_writes() {
    let server = Command::new(example("write_bw"))
        .args(["--local", "127.0.2.31"])
        .spawn()
        .unwrap();
    support::wait_listening(18700, Duration::from_secs(20));
    let out = run(
        Command::new(example("write_bw")).args([
            "--local",
            "127.0.2.30",
            "--server",
            "127.0.2.31",
            "--count",
            "2000",
        ]),
        60,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2000 WRITEs of 65536 B"), "{text}");
    let mut server = server;
    assert!(server.wait().unwrap().success());
}
