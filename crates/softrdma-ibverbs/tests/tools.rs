//! Debian's rdma-core tools and perftest against the built libraries (acceptance 1 and, in
//! phase 1, "they load and fail cleanly" for 2 and 3).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_clean_exit, lib_dir, on_softrdma, tool};

const TWO: &str = "softrdma0=127.0.0.1,softrdma1=127.0.0.2";

#[test]
fn devinfo_lists_the_devices() {
    let out = on_softrdma("ibv_devinfo", TWO).arg("-v").output().unwrap();
    assert_clean_exit("ibv_devinfo -v", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ibv_devinfo -v failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "hca_id:\tsoftrdma0",
        "hca_id:\tsoftrdma1",
        "max_mr_size:\t\t\t0x800000000000",
        "max_qp:\t\t\t\t16384",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
        "active_mtu:\t\t1024 (3)",
        "max_mtu:\t\t4096 (5)",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        "GID[  0]:\t\t::ffff:127.0.0.2, RoCE v2",
        "board_id:\t\t\tSOFTRDMA",
        "node_guid:\t\t\t0273:6f66:7f00:0001",
    ] {
        assert!(
            text.contains(want),
            "ibv_devinfo -v lacks {want:?}:\n{text}"
        );
    }
}

#[test]
fn devinfo_mtu_from_config_file() {
    let dir = std::env::temp_dir().join(format!("softrdma-conf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("softrdma.conf");
    std::fs::write(&conf, "# test\nsoftrdma0 127.0.0.9 mtu=4096\n").unwrap();
    let out = Command::new(tool("ibv_devinfo"))
        .env("LD_LIBRARY_PATH", lib_dir())
        .env_remove("SOFTRDMA_DEVICES")
        .env("SOFTRDMA_CONFIG", &conf)
        .output()
        .unwrap();
    assert_clean_exit("ibv_devinfo", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("active_mtu:\t\t4096 (5)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn devices_and_bad_config() {
    let out = on_softrdma("ibv_devices", TWO).output().unwrap();
    assert_clean_exit("ibv_devices", &out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("softrdma1") && text.contains("02736f667f000002"),
        "{text}"
    );

    let out = on_softrdma("ibv_devinfo", "softrdma0=not-an-address")
        .output()
        .unwrap();
    assert_clean_exit("ibv_devinfo (bad config)", &out);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an IPv4 address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run a server and a client of `tool_name` on two loopback addresses; both must exit
/// cleanly (phase 1: with an error at CQ creation) within the timeout.
fn server_client(tool_name: &str, gid_flag: &str, port: u16) {
    let mut server = on_softrdma(tool_name, "softrdma0=127.0.0.1")
        .args(["-d", "softrdma0", gid_flag, "0", "-p", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = on_softrdma(tool_name, "softrdma1=127.0.0.2")
        .args([
            "-d",
            "softrdma1",
            gid_flag,
            "0",
            "-p",
            &port.to_string(),
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert_clean_exit(&format!("{tool_name} client"), &client);
    let start = Instant::now();
    while server.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = server.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = server.wait_with_output().unwrap();
    assert_clean_exit(&format!("{tool_name} server"), &out);
    // Phase 1: no CQs yet, so both sides stop with an error exit status.
    assert!(!client.status.success(), "{tool_name} client succeeded?");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        all.contains("CQ"),
        "{tool_name} client did not stop at CQ creation:\n{all}"
    );
}

#[test]
fn rc_pingpong_loads_and_fails_cleanly() {
    server_client("ibv_rc_pingpong", "-g", 18601);
}

#[test]
fn perftest_loads_and_fails_cleanly() {
    for (i, t) in [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
    ]
    .iter()
    .enumerate()
    {
        server_client(t, "-x", 18610 + i as u16);
    }
}

#[test]
fn every_tool_loads_with_bind_now() {
    for t in [
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
        let out = on_softrdma(t, TWO).arg("--help").output().unwrap();
        assert_clean_exit(&format!("{t} --help"), &out);
    }
}

/// The C API as a C program sees it: verbs.h's inline wrappers and macros, our library.
#[test]
fn c_api_misuse_returns_documented_errors() {
    let dir = std::env::temp_dir().join(format!("softrdma-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("misuse");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/misuse.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(src)
        .arg(format!("-L{}", lib_dir().display()))
        .arg("-l:libibverbs.so.1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e} (install the Debian package gcc)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("SOFTRDMA_DEVICES", TWO)
        .output()
        .unwrap();
    assert_clean_exit("misuse.c", &run);
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && text.contains("ALL OK"),
        "misuse.c:\n{text}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
