//! The drop-in `librdmacm.so.1`: its layouts against Debian's `rdma/rdma_cma.h`, its symbol
//! set against Debian's library, and Debian's unmodified rdma_cm programs between two
//! softrdma processes on loopback (rping, ucmatose, rdma_server/rdma_client, perftest with
//! `-R`, qperf with `-cm1`).

mod common;

use std::fmt::Write as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_clean_exit, lib_dir, on_softrdma, wait_bounded};

const HEADER: &str = "/usr/include/rdma/rdma_cma.h";
const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

#[test]
fn layouts_match_rdma_cma_h() {
    assert!(
        std::path::Path::new(HEADER).exists(),
        "{HEADER} is missing: install the Debian package librdmacm-dev"
    );
    let rows = ibverbs::rdmacm::abi::layout();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (name, _) in &rows {
        if let Some(t) = name.strip_prefix("sizeof ") {
            writeln!(c, "  printf(\"%zu\\n\", sizeof(struct {t}));").unwrap();
        } else {
            let (t, f) = name.split_once('.').unwrap();
            writeln!(c, "  printf(\"%zu\\n\", offsetof(struct {t}, {f}));").unwrap();
        }
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("softrdma-cmlayout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("probe.c"), dir.join("probe"));
    std::fs::write(&src, c).unwrap();
    let out = Command::new("cc")
        .args(["-std=gnu11", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc (install the Debian package gcc)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let diffs: Vec<String> = rows
        .iter()
        .zip(text.lines())
        .filter(|((_, rust), c)| c.parse::<usize>().ok() != Some(*rust))
        .map(|((n, rust), c)| format!("{n}: C {c}, Rust {rust}"))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        diffs.is_empty(),
        "layout differences:\n{}",
        diffs.join("\n")
    );
}

/// Every (symbol, version) a library defines in the RDMACM nodes, from `objdump -T`.
fn rdmacm_symbols(lib: &std::path::Path) -> std::collections::BTreeSet<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(lib)
        .output()
        .expect("objdump (install the Debian package binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("RDMACM_") && !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f[f.len() - 2], f[f.len() - 1]);
            (ver.starts_with("RDMACM_") && name != ver).then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}

#[test]
fn every_symbol_and_version_of_debians_librdmacm() {
    assert!(
        std::path::Path::new(DEBIAN_LIB).exists(),
        "{DEBIAN_LIB} is missing: install the Debian package librdmacm1"
    );
    let theirs = rdmacm_symbols(std::path::Path::new(DEBIAN_LIB));
    let ours = rdmacm_symbols(&lib_dir().join("librdmacm.so.1"));
    assert!(theirs.len() > 60, "{theirs:?}");
    let missing: Vec<_> = theirs.difference(&ours).collect();
    let extra: Vec<_> = ours.difference(&theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}\nextra {extra:?}"
    );
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run `tool` as server on `server_ip` and as client on `client_ip` (the client retried while
/// the server's connection manager is not yet up: its REQ is rejected); both must exit 0.
/// Returns (server output, client output).
fn server_client(
    tool: &str,
    (server_ip, client_ip): (&str, &str),
    server_args: &[&str],
    client_args: &[&str],
) -> (String, String) {
    let spawn = |ip: &str, args: &[&str]| {
        let mut c = on_softrdma(tool, &format!("softrdma0={ip}"));
        c.env("SOFTRDMA_PIN", "on-demand")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let server = spawn(server_ip, server_args);
    let start = Instant::now();
    let client = loop {
        std::thread::sleep(Duration::from_millis(300));
        let c = wait_bounded(spawn(client_ip, client_args), Duration::from_secs(60));
        let t = text(&c);
        let refused = t.contains("REJECTED")
            || t.contains("UNREACHABLE")
            || t.contains("refused")
            || t.contains("error: 8");
        if c.status.success() || !refused || start.elapsed() > Duration::from_secs(15) {
            break c;
        }
    };
    let server = wait_bounded(server, Duration::from_secs(20));
    let what = format!("{tool} {}", client_args.join(" "));
    assert_clean_exit(&format!("{what} (client)"), &client);
    assert_clean_exit(&format!("{what} (server)"), &server);
    assert!(
        client.status.success() && server.status.success(),
        "{what}: client {:?}\n{}\nserver {:?}\n{}",
        client.status,
        text(&client),
        server.status,
        text(&server)
    );
    (text(&server), text(&client))
}

#[test]
fn rping_checks_its_data() {
    let (s, c) = server_client(
        "rping",
        ("127.0.4.2", "127.0.4.1"),
        &["-s", "-a", "127.0.4.2", "-p", "7174", "-v", "-C", "100"],
        &["-c", "-a", "127.0.4.2", "-p", "7174", "-v", "-C", "100"],
    );
    assert_eq!(c.matches("ping data: rdma-ping-").count(), 100, "{c}");
    assert_eq!(
        s.matches("server ping data: rdma-ping-").count(),
        100,
        "{s}"
    );
    assert!(c.contains("rdma-ping-99: "), "{c}");
}

#[test]
fn ucmatose_with_several_connections() {
    let (s, c) = server_client(
        "ucmatose",
        ("127.0.4.12", "127.0.4.11"),
        &["-p", "7300", "-c", "4", "-C", "20"],
        &["-s", "127.0.4.12", "-p", "7300", "-c", "4", "-C", "20"],
    );
    assert!(
        c.contains("data transfers complete") && c.contains("return status 0"),
        "{c}"
    );
    assert!(
        s.contains("disconnected") && s.contains("return status 0"),
        "{s}"
    );
}

/// The UDP port space: udaddy resolves the server's UD QP with SIDR_REQ/SIDR_REP (3
/// resolutions), sends 20 messages on each and the server answers each through an AH made
/// from the completion (`ibv_create_ah_from_wc`). Its port is fixed (7174).
#[test]
fn udaddy_resolves_ud_qps() {
    let (s, c) = server_client(
        "udaddy",
        ("127.0.4.22", "127.0.4.21"),
        &["-b", "127.0.4.22", "-c", "3", "-C", "20"],
        &[
            "-s",
            "127.0.4.22",
            "-b",
            "127.0.4.21",
            "-c",
            "3",
            "-C",
            "20",
        ],
    );
    for t in [&s, &c] {
        assert!(
            t.contains("data transfers complete") && t.contains("return status 0"),
            "{t}"
        );
    }
    assert!(s.contains("sending replies"), "{s}");
}

#[test]
fn rdma_server_and_rdma_client() {
    let spawn = |tool: &str, ip: &str, args: &[&str]| {
        let mut c = on_softrdma(tool, &format!("softrdma0={ip}"));
        c.env("SOFTRDMA_PIN", "on-demand")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let server = spawn("rdma_server", "127.0.4.24", &["-p", "7401"]);
    let start = Instant::now();
    let client = loop {
        std::thread::sleep(Duration::from_millis(300));
        let c = wait_bounded(
            spawn(
                "rdma_client",
                "127.0.4.23",
                &["-s", "127.0.4.24", "-p", "7401"],
            ),
            Duration::from_secs(30),
        );
        if c.status.success() || start.elapsed() > Duration::from_secs(15) {
            break c;
        }
    };
    let server = wait_bounded(server, Duration::from_secs(20));
    assert!(
        client.status.success() && text(&client).contains("end 0"),
        "{}",
        text(&client)
    );
    assert!(
        server.status.success() && text(&server).contains("end 0"),
        "{}",
        text(&server)
    );
}

#[test]
fn perftest_over_rdma_cm() {
    let runs: &[(&str, &str)] = &[
        ("ib_write_bw", "BW average"),
        ("ib_read_bw", "BW average"),
        ("ib_send_lat", "t_typical"),
    ];
    for (i, (tool, header)) in runs.iter().enumerate() {
        let port = (18700 + i).to_string();
        let args = ["-R", "-p", &port, "-n", "200"];
        let mut client_args = args.to_vec();
        client_args.push("127.0.4.32");
        let (_, c) = server_client(tool, ("127.0.4.32", "127.0.4.31"), &args, &client_args);
        let row = c
            .lines()
            .skip_while(|l| !l.contains(header))
            .nth(1)
            .unwrap_or("");
        assert_eq!(
            row.split_whitespace().nth(1),
            Some("200"),
            "{tool}: no result row:\n{c}"
        );
    }
}

#[test]
fn qperf_over_rdma_cm() {
    let tests = [
        "rc_bw",
        "rc_lat",
        "rc_rdma_write_bw",
        "rc_rdma_read_lat",
        "rc_compare_swap_mr",
    ];
    let mut server = on_softrdma("qperf", "softrdma0=127.0.4.42");
    server
        .env("SOFTRDMA_PIN", "on-demand")
        .args(["-lp", "19770"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut server = server.spawn().unwrap();
    common::wait_listening(19770, Duration::from_secs(20));
    let mut client = on_softrdma("qperf", "softrdma0=127.0.4.41");
    client
        .env("SOFTRDMA_PIN", "on-demand")
        .args(["-lp", "19770", "-cm1", "-t", "1", "127.0.4.42"])
        .args(tests)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let c = wait_bounded(client.spawn().unwrap(), Duration::from_secs(90));
    let _ = server.kill();
    let _ = server.wait();
    let t = text(&c);
    assert_clean_exit("qperf (client)", &c);
    assert!(c.status.success(), "{t}");
    for name in tests {
        let after = t.split(&format!("{name}:")).nth(1).unwrap_or("");
        let line = after.lines().nth(1).unwrap_or("");
        assert!(
            line.contains(" = ") && !line.contains("failed"),
            "{name}: no result:\n{t}"
        );
    }
}

#[test]
fn a_port_nobody_listens_on_is_rejected() {
    let mut c = on_softrdma("rping", "softrdma0=127.0.4.51");
    c.env("SOFTRDMA_PIN", "on-demand")
        .args(["-c", "-a", "127.0.4.52", "-p", "7999", "-C", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The peer's device exists (it answers for its QP1) but nothing listens on the port.
    let mut s = on_softrdma("ucmatose", "softrdma0=127.0.4.52");
    s.env("SOFTRDMA_PIN", "on-demand")
        .args(["-p", "7000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut server = s.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = wait_bounded(c.spawn().unwrap(), Duration::from_secs(30));
    let _ = server.kill();
    let _ = server.wait();
    let t = text(&out);
    assert_clean_exit("rping (client)", &out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("RDMA_CM_EVENT_REJECTED"), "{t}");
}

/// Acceptance 3 on loopback: in a network namespace of its own, nftables drops 30 % of the
/// datagrams to QP1 (every CM MAD, both ways: BTH destination QP 1) and 3 % of all RoCE
/// traffic; rping (data checked) and ucmatose (4 connections) still connect and disconnect,
/// through the CM's retries. The drop counter proves MADs were lost.
#[test]
fn connections_come_up_and_down_through_lost_mads() {
    let lib = lib_dir().display().to_string();
    let dir = std::env::temp_dir().join(format!("softrdma-cmloss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let script = format!(
        r#"set -e
ip link set lo up
nft add table inet loss
nft add chain inet loss in '{{ type filter hook input priority 0; }}'
nft add rule inet loss in udp dport 4791 @th,104,24 1 numgen random mod 100 '<' 30 counter drop
nft add rule inet loss in udp dport 4791 numgen random mod 100 '<' 3 drop
run() {{ env LD_LIBRARY_PATH={lib} SOFTRDMA_PIN=on-demand SOFTRDMA_DEVICES=softrdma0=$1 timeout 60 "${{@:2}}"; }}
pair() {{ # port server-args client-args
    run 127.0.0.1 $2 >{d}/server.log 2>&1 &
    spid=$!
    sleep 0.5
    run 127.0.0.2 $3 >{d}/client.log 2>&1 || {{ echo "CLIENT FAILED: $3"; cat {d}/client.log; cat {d}/server.log; exit 1; }}
    wait $spid || {{ echo "SERVER FAILED: $2"; cat {d}/server.log; exit 1; }}
    echo "ok: $3"
}}
for i in 1 2 3 4 5 6; do
    pair x "rping -s -a 127.0.0.1 -p 7$i -v -C 10" "rping -c -a 127.0.0.1 -p 7$i -v -C 10"
    grep -c 'ping data' {d}/client.log
done
for i in 1 2; do
    pair x "ucmatose -p 8$i -c 4 -C 5" "ucmatose -s 127.0.0.1 -p 8$i -c 4 -C 5"
done
nft list ruleset | grep -o 'packets [0-9]*'
"#
    );
    let out = Command::new("timeout")
        .args(["400", "unshare", "-n", "bash", "-c", &script])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&out);
    println!("{t}");
    assert!(out.status.success(), "rdma_cm under MAD loss failed:\n{t}");
    assert_eq!(t.matches("ok: ").count(), 8, "{t}");
    assert_eq!(
        t.lines().filter(|l| l.trim() == "10").count(),
        6,
        "rping data lines:\n{t}"
    );
    let dropped: u64 = t
        .lines()
        .filter_map(|l| l.strip_prefix("packets "))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    assert!(dropped > 0, "no MAD was dropped:\n{t}");
}

/// A REQ for a port an rdma_cm program listens on, but whose private data is not rdma_cm's
/// (no IP header), is refused at once with a consumer REJ: the requester hears within the
/// second, not after its retries run out (librdmacm used to drop it silently).
#[test]
fn a_request_without_rdma_cms_header_is_rejected_at_once() {
    use softrdma::cm::{CmEvent, ConnectParams};
    use softrdma::verbs::{ConnectionManager, Device, DeviceConfig, HookVerdict, PinMode};
    use softrdma::wire::cm::rej_reason;
    use softrdma::wire::cma::PortSpace;

    let mut s = on_softrdma("rping", "softrdma0=127.0.4.53");
    s.env("SOFTRDMA_PIN", "on-demand")
        .args(["-s", "-a", "127.0.4.53", "-p", "7011", "-C", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut server = s.spawn().unwrap();
    let mut cfg = DeviceConfig::new([127, 0, 4, 54].into());
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg).unwrap();
    let cm = ConnectionManager::open(&dev).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    cm.set_hook(Some(Box::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
        HookVerdict::Taken
    })));
    let peer: std::net::IpAddr = [127, 0, 4, 53].into();
    let mut got = None;
    // The server may not listen yet: a REJ for want of a listener (invalid service ID) means
    // try again; the one that counts is the consumer REJ of a listening rdma_cm.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        let sent = Instant::now();
        cm.raw()
            .connect(ConnectParams {
                peer,
                service_id: PortSpace::Tcp.service_id(7011),
                qpn: 0x42,
                starting_psn: 1,
                responder_resources: 1,
                initiator_depth: 1,
                path_mtu: 3,
                retry_count: 7,
                rnr_retry_count: 7,
                path: cm.path_to(peer),
                private_data: vec![0xee; 20],
                srq: false,
                transport: 0,
                defer_rtu: false,
            })
            .unwrap();
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(CmEvent::Rejected { reason, .. }) if reason == rej_reason::INVALID_SERVICE_ID => {
                std::thread::sleep(Duration::from_millis(100));
            }
            e => {
                got = Some((e, sent.elapsed()));
                break;
            }
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let (e, took) = got.expect("the server never listened");
    assert!(
        matches!(e, Ok(CmEvent::Rejected { reason, .. }) if reason == rej_reason::CONSUMER_DEFINED),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(1), "the REJ took {took:?}");
}

/// A device that cannot open (another process holds its address's RoCE port) is left out of
/// `rdma_get_devices`, whose count is written whatever happens: libfabric's verbs provider
/// reads the count before the list, and crashed in `fi_getinfo` when a failure left it unset.
/// `ibv_get_device_list` writes 0 when the configuration is refused.
#[test]
fn a_device_that_cannot_open_is_left_out_of_the_cm_device_list() {
    let prog = r#"
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
int main(int argc, char **argv) {
    int n = 12345;
    if (argc > 1 && !strcmp(argv[1], "verbs")) {
        struct ibv_device **d = ibv_get_device_list(&n);
        printf("verbs %s n=%d\n", d ? "list" : "NULL", n);
        if (d) ibv_free_device_list(d);
        return 0;
    }
    struct ibv_context **l = rdma_get_devices(&n);
    int k = 0;
    while (l && l[k]) k++;
    printf("cm %s n=%d k=%d first=%s\n", l ? "list" : "NULL", n, k,
           k ? ibv_get_device_name(l[0]->device) : "-");
    if (l) rdma_free_devices(l);
    return 0;
}
"#;
    let dir = std::env::temp_dir().join(format!("softrdma-cmdevs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("devs.c"), dir.join("devs"));
    std::fs::write(&src, prog).unwrap();
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib_dir().display()))
        .args(["-l:librdmacm.so.1", "-l:libibverbs.so.1"])
        .output()
        .expect("cc (install the Debian package gcc)");
    assert!(out.status.success(), "{}", text(&out));
    // Another process's socket on the first device's address and port.
    let taken = std::net::UdpSocket::bind("127.0.4.61:4791").unwrap();
    let run = |devices: &str, arg: &str| {
        let out = Command::new(&exe)
            .arg(arg)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("SOFTRDMA_DEVICES", devices)
            .env_remove("SOFTRDMA_CONFIG")
            .output()
            .unwrap();
        assert_clean_exit("devs", &out);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let both = run("softrdma0=127.0.4.61,softrdma1=127.0.4.62", "cm");
    let busy = run("softrdma0=127.0.4.61", "cm");
    let refused = run("softrdma0=not-an-address", "verbs");
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(both, "cm list n=1 k=1 first=softrdma1");
    assert_eq!(busy, "cm list n=0 k=0 first=-");
    assert_eq!(refused, "verbs NULL n=0");
}
