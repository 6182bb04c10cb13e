//! Packets made by our builder (every opcode; with and without immediate, invalidate and pad;
//! MTU 256 to 4096) decode in Wireshark to the field values we meant, and the independent
//! ICRC checker agrees with our ICRC on the same file.
//!
//! Wireshark 4.0 decodes no header past the BTH for the IBTA 1.5 opcodes FLUSH (0x1C) and
//! ATOMIC WRITE (0x1D); for those the BTH fields are compared. It shows the ICRC read
//! big-endian; RoCEv2 stores it little-endian, so the comparison swaps it.

mod common;

use std::process::Command;

use softrdma::wire::{OpKind, Syndrome};
use softrdma_cli::capture::write_pcap;
use softrdma_cli::sample::{MTUS, corpus};

const FIELDS: &[&str] = &[
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.destqp",
    "infiniband.bth.psn",
    "infiniband.bth.a",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.invariant.crc",
];

fn num(s: &str) -> u64 {
    let s = s.trim();
    match s {
        "True" => 1,
        "False" => 0,
        _ => match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("not hex: {s}")),
            None => s.parse().unwrap_or_else(|_| panic!("not a number: {s}")),
        },
    }
}

fn bytes_hex(s: &str) -> u64 {
    u64::from_str_radix(&s.replace(':', ""), 16).unwrap_or_else(|_| panic!("not bytes: {s}"))
}

#[test]
fn tshark_decodes_what_we_built_and_icrc_check_agrees() {
    let built = corpus(&MTUS).unwrap();
    let pcap = write_pcap(&built.iter().map(|b| b.datagram.clone()).collect::<Vec<_>>()).unwrap();
    let dir = std::env::temp_dir().join(format!("softrdma-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("built.pcap");
    std::fs::write(&file, &pcap).unwrap();

    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&file)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    cmd.args(["--disable-protocol", "rpcordma"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark must be installed (Debian package tshark; .ci/run installs it)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        rows.len(),
        built.len(),
        "tshark saw a different number of frames"
    );

    let mut compared = 0usize;
    for (b, row) in built.iter().zip(&rows) {
        let get = |name: &str| row[FIELDS.iter().position(|f| *f == name).unwrap()];
        let h = &b.hdr;
        let bth = &h.bth;
        let what = format!("frame {} ({})", get("frame.number"), bth.opcode.name());
        let mut eq = |field: &str, want: u64| {
            let got = get(field);
            assert!(!got.is_empty(), "{what}: tshark has no {field}");
            assert_eq!(num(got), want, "{what}: {field}");
            compared += 1;
        };
        eq("infiniband.bth.opcode", u64::from(bth.opcode.0));
        eq("infiniband.bth.destqp", u64::from(bth.dest_qp));
        eq("infiniband.bth.psn", u64::from(bth.psn.value()));
        eq("infiniband.bth.a", u64::from(bth.ack_req));
        eq("infiniband.bth.se", u64::from(bth.se));
        eq("infiniband.bth.padcnt", u64::from(bth.pad_cnt));
        eq("infiniband.bth.p_key", u64::from(bth.pkey));
        let info = bth.opcode.info().unwrap();
        if matches!(info.kind, OpKind::Flush | OpKind::AtomicWrite) {
            continue; // not decoded past the BTH by Wireshark 4.0 (see the module comment)
        }
        if let Some(r) = h.reth {
            eq("infiniband.reth.va", r.va);
            eq("infiniband.reth.r_key", u64::from(r.rkey));
            eq("infiniband.reth.dmalen", u64::from(r.dma_len));
        }
        if let Some(a) = h.atomic_eth {
            // Wireshark files the AtomicETH address and key under the RETH field names.
            eq("infiniband.reth.va", a.va);
            eq("infiniband.reth.r_key", u64::from(a.rkey));
            eq("infiniband.atomiceth.swapdt", a.swap_add);
            eq("infiniband.atomiceth.cmpdt", a.compare);
        }
        if let Some(a) = h.aeth {
            eq("infiniband.aeth.syndrome", u64::from(a.syndrome.to_byte()));
            eq("infiniband.aeth.msn", u64::from(a.msn));
            assert!(!matches!(a.syndrome, Syndrome::Reserved(_)));
        }
        if let Some(a) = h.atomic_ack_eth {
            eq("infiniband.atomicacketh.origremdt", a.orig);
        }
        if let Some(d) = h.deth {
            eq("infiniband.deth.q_key", u64::from(d.qkey));
            eq("infiniband.deth.srcqp", u64::from(d.src_qp));
        }
        let mut eq_bytes = |field: &str, want: u32| {
            let got = get(field);
            assert!(!got.is_empty(), "{what}: tshark has no {field}");
            assert_eq!(bytes_hex(got), u64::from(want), "{what}: {field}");
            compared += 1;
        };
        if let Some(v) = h.immdt {
            eq_bytes("infiniband.immdt", v);
        }
        if let Some(v) = h.ieth {
            eq_bytes("infiniband.ieth", v);
        }
        let shown = get("infiniband.invariant.crc");
        if !shown.is_empty() {
            let carried = u32::from_le_bytes(
                b.datagram.payload[b.datagram.payload.len() - 4..]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(num(shown) as u32, carried.swap_bytes(), "{what}: ICRC");
            compared += 1;
        }
    }
    println!(
        "{} packets, {compared} field values agree with tshark",
        built.len()
    );

    let check = Command::new("python3")
        .arg(common::shared().join("tools/icrc_check.py"))
        .arg(&file)
        .output()
        .expect("python3");
    let report = String::from_utf8_lossy(&check.stdout);
    println!("icrc_check.py: {}", report.trim());
    assert!(check.status.success(), "icrc_check.py disagrees: {report}");
    assert!(
        report.contains(&format!("ICRC ok={} bad=0", built.len())),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
