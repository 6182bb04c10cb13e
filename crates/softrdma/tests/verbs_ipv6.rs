//! RoCEv2 over IPv6 end to end: two devices on two IPv6 addresses, in a network namespace of
//! their own (so the addresses exist nowhere else), doing WRITE, SEND with immediate, READ and
//! Fetch&Add over real UDP sockets. Every packet's ICRC is computed over the IPv6 pseudo-header
//! by the sender and verified by the receiver.
//!
//! The outer test needs root (`unshare -n`, `ip`, `dumpcap`): it runs this binary again inside a
//! fresh network namespace with `fd00::a` and `fd00::b` on its loopback, where the ignored inner
//! test runs twice (with and without UDP GSO); the second run is captured and
//! ../shared/tools/icrc_check.py verifies every packet's ICRC independently.

use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use softrdma::verbs::*;

const A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa);
const B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xb);

#[test]
fn rdma_over_ipv6_in_a_namespace() {
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "this test needs root: it creates a network namespace with two IPv6 addresses"
    );
    let exe = std::env::current_exe().expect("test binary path");
    let dir = std::env::temp_dir().join(format!("softrdma-ipv6-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("ipv6.pcapng");
    // First with GSO (segments coalesced on the sending side), then without GSO under a
    // capture: a capture on `lo` sees GSO datagrams unsegmented, so the per-packet check of
    // the ICRC needs single packets.
    let script = format!(
        "ip link set lo up && ip -6 addr add {A}/128 dev lo nodad && \
         ip -6 addr add {B}/128 dev lo nodad || exit 1
         \"$0\" --ignored --exact ipv6_inner --nocapture --test-threads 1 || exit 1
         dumpcap -q -i lo -f 'udp port 4791' -w \"$1\" 2>/dev/null & d=$!
         sleep 1
         SOFTRDMA_TEST_GSO=off \"$0\" --ignored --exact ipv6_inner --nocapture --test-threads 1
         rc=$?
         sleep 0.5; kill $d; wait $d; exit $rc"
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &script])
        .arg(&exe)
        .arg(&cap)
        .output()
        .expect("unshare (util-linux) must be installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "inner run failed: {text}");
    assert_eq!(
        text.matches("test result: ok. 1 passed").count(),
        2,
        "the inner test did not run twice: {text}"
    );

    // The independent checker recomputes every ICRC over the IPv6 pseudo-header.
    let checker = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/tools/icrc_check.py"
    );
    let out = Command::new("python3")
        .arg(checker)
        .arg("--flows")
        .arg(&cap)
        .output()
        .expect("python3 runs the ICRC checker");
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{report}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "ICRC check failed: {report}");
    let count = |key: &str| -> u64 {
        report
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("packets=") >= 100, "{report}");
    assert_eq!(count("packets="), count("ok="), "{report}");
    assert!(
        report.contains(&format!("flow {A} -> {B}:4791")),
        "{report}"
    );
    assert!(
        report.contains(&format!("flow {B} -> {A}:4791")),
        "{report}"
    );
}

fn one(cq: &Cq) -> WorkCompletion {
    let v = cq.wait(1, Duration::from_secs(10));
    assert_eq!(v.len(), 1, "no completion within 10 s");
    v[0]
}

#[test]
#[ignore = "run by rdma_over_ipv6_in_a_namespace inside its namespace"]
fn ipv6_inner() {
    let gso = std::env::var("SOFTRDMA_TEST_GSO").as_deref() != Ok("off");
    let open = |ip: Ipv6Addr| {
        let mut cfg = DeviceConfig::new(IpAddr::V6(ip));
        cfg.pin_mode = PinMode::OnDemand;
        cfg.gso = gso;
        Device::open(cfg).expect("open a device on an IPv6 address")
    };
    let (da, db) = (open(A), open(B));
    // The GID of an IPv6 device is its address.
    assert_eq!(da.gid(), A.octets());
    assert_eq!(db.gid(), B.octets());
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (
        da.create_cq(64, None).unwrap(),
        db.create_cq(64, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInitAttr::new(&ca)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::new(&cb)).unwrap();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (sa, sb) = (random_psn(), random_psn());
    let mut attr = QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: all,
        ..QpAttr::default()
    };
    attr.dest_qp_num = qb.qp_num();
    attr.sq_psn = sa;
    attr.rq_psn = sb;
    qa.connect(db.addr(), &attr).unwrap();
    attr.dest_qp_num = qa.qp_num();
    attr.sq_psn = sb;
    attr.rq_psn = sa;
    qb.connect(da.addr(), &attr).unwrap();

    let len = 100_000usize;
    let src: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
    let local = pa.reg_buffer(src.clone(), Access::LOCAL_WRITE).unwrap();
    let remote = pb.reg_buffer(vec![0u8; len + 8], all).unwrap();
    let back = pa.reg_buffer(vec![0u8; len], Access::LOCAL_WRITE).unwrap();
    let rbuf = pb.reg_buffer(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    qb.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &[rbuf.sge(0, 64)],
    })
    .unwrap();

    // WRITE (98 packets, coalesced by GSO), then SEND with immediate.
    let sge = [local.sge(0, len as u32)];
    qa.post_send(
        &SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: remote.iova(),
                rkey: remote.rkey(),
            },
        )
        .sg(&sge),
    )
    .unwrap();
    let msg = [local.sge(0, 20)];
    qa.post_send(&SendWr::new(2, WrOpcode::SendWithImm { imm: 0x6666 }).sg(&msg))
        .unwrap();
    for id in [1, 2] {
        let w = one(&ca);
        assert_eq!((w.wr_id, w.status), (id, WcStatus::Success));
    }
    let r = one(&cb);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.imm_data),
        (9, WcStatus::Success, 20, Some(0x6666))
    );
    assert_eq!(&remote.to_vec().unwrap()[..len], &src[..]);
    assert_eq!(&rbuf.to_vec().unwrap()[..20], &src[..20]);

    // READ it back, then Fetch&Add on the 8 bytes behind it.
    let sge = [back.sge(0, len as u32)];
    qa.post_send(
        &SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote_addr: remote.iova(),
                rkey: remote.rkey(),
            },
        )
        .sg(&sge),
    )
    .unwrap();
    let w = one(&ca);
    assert_eq!(
        (w.wr_id, w.status, w.byte_len),
        (3, WcStatus::Success, len as u32)
    );
    assert_eq!(back.to_vec().unwrap(), src);
    let sge = [back.sge(0, 8)];
    qa.post_send(
        &SendWr::new(
            4,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: remote.iova() + len as u64,
                rkey: remote.rkey(),
                add: 5,
            },
        )
        .sg(&sge),
    )
    .unwrap();
    let w = one(&ca);
    assert_eq!((w.wr_id, w.status), (4, WcStatus::Success));
    assert_eq!(&back.to_vec().unwrap()[..8], &0u64.to_ne_bytes());
    let mut v = [0u8; 8];
    remote.read(len as u64, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 5);

    // Every packet arrived with a good ICRC over the IPv6 pseudo-header.
    for (name, d) in [("a", &da), ("b", &db)] {
        let c = d.counters();
        let (rx, bad) = (
            c.rx_packets.load(Ordering::Relaxed),
            c.rx_bad.load(Ordering::Relaxed),
        );
        println!("device {name}: rx_packets {rx}, rx_bad {bad}");
        assert!(rx > 0);
        assert_eq!(bad, 0);
    }
}
