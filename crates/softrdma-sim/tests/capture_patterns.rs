//! Acceptance: for the traffic patterns of the Linux rxe captures (`../shared/captures/rxe`),
//! our packet sequences follow the same opcode and acknowledgement patterns.
//!
//! Each capture is read with `tshark -T fields` (skipped with a note when tshark or the
//! captures are absent); the same workload (message count, size, MTU) runs through the
//! engine with a tap on the simulated network; per sender, the sequences of (opcode, AckReq,
//! AETH syndrome, MSN, PSN relative to the first request PSN) are compared. Intended
//! differences are listed in docs/RC-PATTERNS.md.

use std::path::PathBuf;
use std::process::Command;

use softrdma::mem::Access;
use softrdma::rc::{Mtu, QpCap, RecvWr, SendWr, Sge, WrOpcode};
use softrdma::wire::Packet;
use softrdma_sim::{ConnOpts, Faults, QpRef, World};

/// One packet as far as the patterns go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct P {
    /// 0: the side that sends the first packet; 1: the other.
    side: u8,
    opcode: u8,
    psn: u32,
    ack_req: bool,
    syndrome: Option<u8>,
    msn: Option<u32>,
}

fn captures_dir() -> PathBuf {
    match std::env::var_os("SOFTRDMA_CAPTURES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captures/rxe"),
    }
}

fn load(name: &str) -> Option<Vec<P>> {
    let path = captures_dir().join(format!("{name}.pcap"));
    // Every capture and tshark are required: a check that skips would pass without testing
    // (scripts/test installs tshark; the captures are in ../shared).
    assert!(
        path.exists(),
        "{name}: capture {} not found (../shared/captures must sit beside the repository, \
         or set SOFTRDMA_CAPTURES)",
        path.display()
    );
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-Y", "infiniband", "-T", "fields", "-E", "separator=,"])
        .args([
            "-e",
            "ip.src",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "infiniband.bth.a",
        ])
        .args([
            "-e",
            "infiniband.aeth.syndrome",
            "-e",
            "infiniband.aeth.msn",
        ])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!(
            "{name}: tshark failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("{name}: cannot run tshark ({e}): install the Debian package tshark"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut first_src: Option<String> = None;
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 6 || f[1].is_empty() {
            continue;
        }
        let src = f[0].to_string();
        let side = match &first_src {
            None => {
                first_src = Some(src);
                0
            }
            Some(s) if *s == src => 0,
            _ => 1,
        };
        v.push(P {
            side,
            opcode: f[1].parse().ok()?,
            psn: f[2].parse().ok()?,
            ack_req: f[3] == "1" || f[3] == "True",
            syndrome: f[4].parse().ok(),
            msn: f[5].parse().ok(),
        });
    }
    Some(v)
}

fn is_request(op: u8) -> bool {
    !matches!(op, 0x0d..=0x12)
}

/// Per side: (opcode, AckReq, syndrome, MSN, PSN relative to the first request PSN of the
/// side that sent the request).
type Sig = Vec<(u8, bool, Option<u8>, Option<u32>, u32)>;

fn signature(pkts: &[P], side: u8) -> Sig {
    let base = |s: u8| {
        pkts.iter()
            .find(|p| p.side == s && is_request(p.opcode))
            .map_or(0, |p| p.psn)
    };
    let (mine, theirs) = (base(side), base(1 - side));
    // A retransmitted request, and the repeated ACK that answers it, are timing events
    // (rxe_send_lat holds one): compare first transmissions only.
    let mut seen = std::collections::HashSet::new();
    pkts.iter()
        .filter(|p| p.side == side && seen.insert((p.opcode, p.psn, p.syndrome, p.msn)))
        .map(|p| {
            let b = if is_request(p.opcode) { mine } else { theirs };
            (
                p.opcode,
                p.ack_req,
                p.syndrome,
                p.msn,
                p.psn.wrapping_sub(b) & 0xff_ffff,
            )
        })
        .collect()
}

/// A two-host world for the rxe workloads, with a tap.
struct Run {
    w: World,
    a: QpRef,
    b: QpRef,
}

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

impl Run {
    fn new(mtu: Mtu, faults: Faults, seed: u64) -> Run {
        let mut w = World::new(seed, faults);
        let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
        let cap = QpCap {
            max_send_wr: 128,
            max_recv_wr: 512,
            ..QpCap::default()
        };
        let a = w.create_qp(e0, cap, None);
        let b = w.create_qp(e1, cap, None);
        w.connect(
            a,
            b,
            ConnOpts {
                mtu,
                max_rd_atomic: 16,
                ..ConnOpts::default()
            },
        );
        w.net.tap = Some(Vec::new());
        Run { w, a, b }
    }
    fn buf(&mut self, at: QpRef, len: usize) -> [Sge; 1] {
        let k = self.w.eps[at.ep].mem.reg_mr(1, 0x1000, len.max(8), ALL);
        [Sge {
            addr: 0x1000,
            length: len as u32,
            lkey: k,
        }]
    }
    fn recv(&mut self, at: QpRef, len: usize) {
        let s = self.buf(at, len);
        self.w
            .qp(at)
            .post_recv(&RecvWr {
                wr_id: 0,
                sg_list: &s,
            })
            .unwrap();
    }
    /// Post as many as the send queue takes, run, repeat.
    fn post_all(
        &mut self,
        at: QpRef,
        n: usize,
        mk: &mut dyn FnMut(&mut Run) -> (WrOpcode, [Sge; 1]),
    ) {
        let mut left = n;
        while left > 0 {
            let (op, sge) = mk(self);
            let sg: &[Sge] = if sge[0].length == 0 { &[] } else { &sge };
            if self.w.qp(at).post_send(&SendWr::new(0, op).sg(sg)).is_ok() {
                left -= 1;
            } else {
                self.w.run(1000);
            }
        }
        self.w.run(10_000_000);
    }
    fn packets(&mut self) -> Vec<P> {
        let tap = self.w.net.tap.take().unwrap_or_default();
        let first = tap.first().map_or(0, |t| t.0);
        tap.iter()
            .filter_map(|(src, bytes)| {
                let p = Packet::parse(bytes).ok()?;
                Some(P {
                    side: u8::from(*src != first),
                    opcode: p.hdr.bth.opcode.0,
                    psn: p.hdr.bth.psn.value(),
                    ack_req: p.hdr.bth.ack_req,
                    syndrome: p.hdr.aeth.map(|a| a.syndrome.to_byte()),
                    msn: p.hdr.aeth.map(|a| a.msn),
                })
            })
            .collect()
    }
}

fn compare(name: &str, ours: &[P]) {
    let Some(theirs) = load(name) else { return };
    for side in [0, 1] {
        let (t, o) = (signature(&theirs, side), signature(ours, side));
        let n = t.len().min(o.len());
        assert_eq!(
            t.len(),
            o.len(),
            "{name} side {side}: packet count (rxe vs ours)"
        );
        for i in 0..n {
            assert_eq!(t[i], o[i], "{name} side {side} packet {i}: rxe vs ours");
        }
    }
    println!(
        "{name}: {} packets, same opcode/AckReq/AETH/MSN/PSN sequence per side",
        ours.len()
    );
}

fn bandwidth(name: &str, n: usize, len: usize, op: fn(u32) -> WrOpcode) {
    let mut r = Run::new(Mtu::Mtu1024, Faults::NONE, 1);
    let (a, b) = (r.a, r.b);
    let needs_recv = matches!(op(0), WrOpcode::Send);
    for _ in 0..n {
        if needs_recv {
            r.recv(b, len);
        }
    }
    let target = r.buf(b, len)[0].lkey;
    let l = if matches!(
        op(0),
        WrOpcode::AtomicFetchAndAdd { .. } | WrOpcode::AtomicCmpAndSwp { .. }
    ) {
        8
    } else {
        len
    };
    r.post_all(a, n, &mut |r| (op(target), r.buf(a, l)));
    compare(name, &r.packets());
}

#[test]
fn write_bw() {
    bandwidth("rxe_write_bw", 50, 8192, |rkey| WrOpcode::RdmaWrite {
        remote_addr: 0x1000,
        rkey,
    });
}

#[test]
fn send_bw() {
    bandwidth("rxe_send_bw", 50, 8192, |_| WrOpcode::Send);
}

#[test]
fn read_bw() {
    bandwidth("rxe_read_bw", 50, 8192, |rkey| WrOpcode::RdmaRead {
        remote_addr: 0x1000,
        rkey,
    });
}

#[test]
fn atomic_fadd() {
    bandwidth("rxe_atomic_fadd", 50, 8, |rkey| {
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: 0x1000,
            rkey,
            add: 1,
        }
    });
}

#[test]
fn atomic_cas() {
    bandwidth("rxe_atomic_cas", 50, 8, |rkey| WrOpcode::AtomicCmpAndSwp {
        remote_addr: 0x1000,
        rkey,
        compare: 0,
        swap: 0,
    });
}

#[test]
fn read_lat() {
    let mut r = Run::new(Mtu::Mtu1024, Faults::NONE, 1);
    let (a, b) = (r.a, r.b);
    let k = r.buf(b, 64)[0].lkey;
    for _ in 0..50 {
        let s = r.buf(a, 64);
        r.w.qp(a)
            .post_send(
                &SendWr::new(
                    0,
                    WrOpcode::RdmaRead {
                        remote_addr: 0x1000,
                        rkey: k,
                    },
                )
                .sg(&s),
            )
            .unwrap();
        r.w.run(100_000);
    }
    compare("rxe_read_lat", &r.packets());
}

/// Ping-pong: side 0 sends, side 1 answers when it has received, `n` rounds.
fn ping_pong(name: &str, n: usize, len: usize, write: bool, mtu: Mtu) {
    let mut r = Run::new(mtu, Faults::NONE, 1);
    let (a, b) = (r.a, r.b);
    let ka = r.buf(a, len)[0].lkey;
    let kb = r.buf(b, len)[0].lkey;
    for _ in 0..n {
        for (from, to, key) in [(a, b, kb), (b, a, ka)] {
            if !write {
                r.recv(to, len);
            }
            let op = if write {
                WrOpcode::RdmaWrite {
                    remote_addr: 0x1000,
                    rkey: key,
                }
            } else {
                WrOpcode::Send
            };
            let s = r.buf(from, len);
            r.w.qp(from).post_send(&SendWr::new(0, op).sg(&s)).unwrap();
            r.w.run(100_000);
        }
    }
    compare(name, &r.packets());
}

#[test]
fn write_lat() {
    ping_pong("rxe_write_lat", 50, 64, true, Mtu::Mtu1024);
}

#[test]
fn send_lat() {
    ping_pong("rxe_send_lat", 50, 64, false, Mtu::Mtu1024);
}

#[test]
fn rc_pingpong() {
    ping_pong("rxe_rc_pingpong", 20, 4096, false, Mtu::Mtu1024);
}

/// Loss: the properties both rxe's trace and ours have (timing makes exact sequences differ).
fn loss_properties(name: &str, pkts: &[P]) -> (usize, usize) {
    let mut naks = 0;
    let mut last_nak: Option<u32> = None;
    let mut first_op = std::collections::HashMap::new();
    let mut resent = 0;
    for (i, p) in pkts.iter().enumerate() {
        if p.side == 0 && is_request(p.opcode) {
            // A retransmitted PSN carries the same opcode as its first transmission
            // (go-back-N resumes mid-message with MIDDLE/LAST, not FIRST).
            let o = *first_op.entry(p.psn).or_insert(p.opcode);
            assert_eq!(
                o, p.opcode,
                "{name}: PSN {} resent as another opcode",
                p.psn
            );
        }
        if p.side == 1 && p.opcode == 0x11 {
            let syn = p.syndrome.unwrap_or(0);
            assert!(
                syn == 0x1f || syn == 0x60,
                "{name}: unexpected syndrome {syn:#x}"
            );
            if syn == 0x60 {
                naks += 1;
                // One NAK per gap: NAK PSNs only move forward.
                if let Some(l) = last_nak {
                    assert!(
                        ((p.psn.wrapping_sub(l)) & 0xff_ffff) > 0,
                        "{name}: second NAK for PSN {}",
                        p.psn
                    );
                }
                last_nak = Some(p.psn);
                // Go-back-N: the requester resends from the NAKed PSN.
                if pkts[i..]
                    .iter()
                    .any(|q| q.side == 0 && q.psn == p.psn && is_request(q.opcode))
                {
                    resent += 1;
                }
            }
        }
    }
    (naks, resent)
}

fn lossy(name: &str, send: bool) {
    let Some(theirs) = load(name) else { return };
    let (tn, tr) = loss_properties(name, &theirs);
    assert!(
        tn > 0 && tr + 1 >= tn,
        "{name}: rxe {tn} NAKs, {tr} followed by a resend"
    );
    let f = Faults {
        loss: 0.03,
        ..Faults::NONE
    };
    let mut r = Run::new(Mtu::Mtu1024, f, 3);
    let (a, b) = (r.a, r.b);
    if send {
        for _ in 0..200 {
            r.recv(b, 8192);
        }
    }
    let k = r.buf(b, 8192)[0].lkey;
    r.post_all(a, 200, &mut |r| {
        let op = if send {
            WrOpcode::Send
        } else {
            WrOpcode::RdmaWrite {
                remote_addr: 0x1000,
                rkey: k,
            }
        };
        (op, r.buf(a, 8192))
    });
    let ours = r.packets();
    let (on, or) = loss_properties(name, &ours);
    assert!(
        on > 0 && or == on,
        "{name}: ours {on} NAKs, {or} followed by a resend"
    );
    println!(
        "{name}: rxe {tn} NAK-sequence errors ({tr} resent), ours {on} ({or} resent); same go-back-N shape"
    );
}

#[test]
fn loss_write_bw() {
    lossy("rxe_loss_write_bw", false);
}

#[test]
fn loss_send_bw() {
    lossy("rxe_loss_send_bw", true);
}
