//! `softrdma decode --check` passes on every rxe capture and fails, naming the packet, on a
//! copy with one flipped bit; malformed and truncated input is reported, never a panic.

mod common;

use std::process::Command;

fn decode(args: &[&str], file: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("decode")
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

#[test]
fn check_passes_on_every_rxe_capture() {
    for path in common::captures("rxe") {
        let out = decode(&["--check", "--quiet"], &path);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {text}{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("0 bad ICRC, 0 malformed"), "{text}");
    }
}

#[test]
fn check_names_the_packet_with_a_flipped_bit() {
    let path = common::shared().join("captures/rxe/rxe_rc_pingpong.pcap");
    let ds = common::datagrams(&path);
    let victim = &ds[ds.len() / 2];
    let mut bytes = std::fs::read(&path).unwrap();
    // Find the victim's UDP payload in the file and flip one bit of its payload area.
    let pos = bytes
        .windows(victim.payload.len())
        .position(|w| w == victim.payload.as_slice())
        .unwrap();
    bytes[pos + victim.payload.len() / 2] ^= 0x10;
    let dir = std::env::temp_dir().join(format!("softrdma-decode-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("flipped.pcap");
    std::fs::write(&bad, &bytes).unwrap();
    let out = decode(&["--check"], &bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("frames #{}", victim.frame)),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("#{:<6}", victim.frame)) && l.contains("BAD"))
    );

    // JSON names it too.
    let out = decode(&["--json", "--check"], &bad);
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .to_owned();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["summary"]["failed_frames"][0], victim.frame);

    // Truncated files: every cut is reported or decoded, never a crash.
    let good = std::fs::read(&path).unwrap();
    for cut in [3, 10, 24, 40, 100, 1000, good.len() - 7] {
        std::fs::write(&bad, &good[..cut]).unwrap();
        let out = decode(&["--check", "--quiet"], &bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        match cut {
            // Shorter than a pcap file header: not a capture.
            0..24 => assert_eq!(out.status.code(), Some(2), "cut {cut}: {stderr}"),
            // A header and no records: an empty capture.
            24 => assert_eq!(out.status.code(), Some(0), "cut {cut}: {stderr}"),
            // Cut inside a record: the damage is reported after the frames before it.
            _ => {
                assert_eq!(out.status.code(), Some(2), "cut {cut}: {stderr}");
                assert!(stderr.contains("damaged"), "cut {cut}: {stderr}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bundled_sample_is_what_the_builder_makes_and_decodes_cleanly() {
    let fresh = softrdma_cli::sample::sample_pcap().unwrap();
    assert!(
        fresh == softrdma_cli::sample::BUNDLED_SAMPLE,
        "data/sample.pcap is stale: regenerate with `softrdma sample crates/softrdma-cli/data/sample.pcap`"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["decode", "--check"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("127 frames: 127 RoCEv2 (127 good, 0 bad ICRC, 0 malformed)"),
        "{text}"
    );
}
