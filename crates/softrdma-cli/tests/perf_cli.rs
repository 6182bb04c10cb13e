//! `softrdma perf` over UC and UD, and in perftest's latency pattern: server and client as two processes on loopback, short runs
//! that must end on their own with nonzero throughput. Each test has its own addresses and TCP
//! port, so that they run in parallel (and beside a loopback run on 127.0.0.1/127.0.0.2).

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

/// Wait for `child` at most `limit`; kill it after that.
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Run `softrdma perf TEST ARGS` with a server on 127.0.NET.2 and the client on 127.0.NET.1;
/// returns the client's JSON rows.
fn perf(test: &str, args: &[&str], net: u8, port: u16) -> Vec<Value> {
    let (srv, cli, port) = (
        format!("127.0.{net}.2"),
        format!("127.0.{net}.1"),
        port.to_string(),
    );
    let server = Command::new(BIN)
        .args([
            "perf",
            test,
            "--server",
            "--local",
            &srv,
            "--tcp-port",
            &port,
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(BIN)
        .args([
            "perf",
            test,
            "--client",
            &srv,
            "--local",
            &cli,
            "--tcp-port",
            &port,
        ])
        .args(["--json"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let c = wait_bounded(client, Duration::from_secs(60));
    let s = wait_bounded(server, Duration::from_secs(10));
    let text = String::from_utf8_lossy(&c.stdout);
    assert!(
        c.status.success() && s.status.success(),
        "{test} {args:?}: client {}: {text}{}\nserver {}: {}",
        c.status,
        String::from_utf8_lossy(&c.stderr),
        s.status,
        String::from_utf8_lossy(&s.stderr)
    );
    let rows: Vec<Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty(), "{test} {args:?}: no rows in {text}");
    rows
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("no number {k} in {v}"))
}

/// A bandwidth row of an unreliable run: something was sent and something arrived.
fn assert_bw(row: &Value, conn: &str, iters: u64) {
    assert_eq!(row["connection"], conn, "{row}");
    assert_eq!(row["iters"].as_u64(), Some(iters), "{row}");
    assert!(
        num(row, "msg_rate") > 0.0 && num(row, "mb_per_s") > 0.0,
        "{row}"
    );
    let got = row["received"].as_u64().unwrap();
    assert!(got > 0 && got <= iters, "{row}");
    assert_eq!(row["lost"].as_u64(), Some(iters - got), "{row}");
    assert!(
        num(row, "rx_msg_rate") > 0.0 && num(row, "rx_mb_per_s") > 0.0,
        "{row}"
    );
}

fn assert_lat(row: &Value, conn: &str, iters: u64) {
    assert_eq!(row["connection"], conn, "{row}");
    assert_eq!(row["iters"].as_u64(), Some(iters), "{row}");
    let (min, typ) = (num(row, "lat_min_us"), num(row, "lat_typical_us"));
    assert!(min > 0.0 && typ >= min, "{row}");
}

#[test]
fn ud_send_bw() {
    let rows = perf("send_bw", &["--ud", "-s", "64", "-n", "5000"], 91, 28791);
    assert_bw(&rows[0], "UD", 5000);
    // Without -s, UD messages are MTU-sized.
    let rows = perf(
        "send_bw",
        &["-c", "UD", "--mtu", "1024", "-n", "2000"],
        91,
        28791,
    );
    assert_eq!(rows[0]["size"].as_u64(), Some(1024));
    assert_bw(&rows[0], "UD", 2000);
}

#[test]
fn ud_send_lat() {
    let rows = perf("send_lat", &["--ud", "-s", "64", "-n", "500"], 92, 28792);
    assert_lat(&rows[0], "UD", 500);
    let rows = perf(
        "send_lat",
        &["--ud", "-s", "1024", "--mtu", "1024", "-n", "300"],
        92,
        28792,
    );
    assert_lat(&rows[0], "UD", 300);
}

#[test]
fn uc_write_bw_and_send_bw() {
    // Messages of 8 packets of 1024 bytes.
    let args = ["--uc", "-s", "8192", "--mtu", "1024", "-n", "1000"];
    assert_bw(&perf("write_bw", &args, 93, 28793)[0], "UC", 1000);
    assert_bw(&perf("send_bw", &args, 93, 28793)[0], "UC", 1000);
    assert_bw(
        &perf("send_bw", &["--uc", "-s", "64", "-n", "5000"], 93, 28793)[0],
        "UC",
        5000,
    );
}

#[test]
fn uc_write_lat_and_send_lat() {
    let args = ["-c", "uc", "-s", "64", "-n", "300"];
    assert_lat(&perf("write_lat", &args, 94, 28794)[0], "UC", 300);
    assert_lat(&perf("send_lat", &args, 94, 28794)[0], "UC", 300);
}

#[test]
fn latency_tests_in_perftests_pattern() {
    // `--signal-all`: every request signaled and its completion awaited, payloads by key.
    for conn in ["rc", "uc"] {
        let args = ["-c", conn, "-s", "8", "-n", "300", "--signal-all"];
        let name = conn.to_uppercase();
        assert_lat(&perf("write_lat", &args, 97, 28797)[0], &name, 300);
        assert_lat(&perf("send_lat", &args, 97, 28797)[0], &name, 300);
    }
}

#[test]
fn an_exchange_sends_both_ways_at_once() {
    // Each round both sides send and wait for the other's message; a side that missed one
    // would wait for it to the end (and the run would fail by its deadline).
    for (size, iters) in [("8", 300u64), ("65536", 100)] {
        let rows = perf(
            "exchange_lat",
            &["-s", size, "-n", &iters.to_string()],
            98,
            28798,
        );
        assert_eq!(rows[0]["test"], "exchange_lat", "{}", rows[0]);
        assert_lat(&rows[0], "RC", iters);
    }
}

#[test]
fn refused_before_a_server_starts() {
    for (args, msg) in [
        (
            &["send_bw", "--ud", "-s", "8192"][..],
            "a UD message is at most the MTU, 4096 bytes",
        ),
        (
            &["send_bw", "--ud", "-s", "2048", "--mtu", "1024"][..],
            "at most the MTU, 1024",
        ),
        (&["read_bw", "--ud"][..], "read_bw does not run over UD"),
        (&["atomic_bw", "--uc"][..], "atomic_bw does not run over UC"),
        (
            &["exchange_lat", "--ud"][..],
            "exchange_lat does not run over UD",
        ),
    ] {
        let out = Command::new(BIN)
            .arg("perf")
            .args(args)
            .args(["--tcp-port", "28795"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(msg),
            "{args:?}: {err}"
        );
    }
}
