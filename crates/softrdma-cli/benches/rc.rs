//! What the transport costs per message, without sockets: two QPs over one memory table,
//! packets handed from one to the other in the same thread (the sans-IO core the engine
//! drives). Three parts per message, each a median of batched timings:
//! - the requester: `post_send` and building the request packets (ICRC included; payloads of
//!   at least 1 KiB lent, as the engine sends them: the kernel's copy of them is not timed);
//! - the responder: parsing and checking each packet, placing the payload, building the ACK;
//! - the requester again: the ACK, and the completion.
//!
//! Compared in the same run with what it rides on: the 8-byte critical path (request built,
//! then handled) against one raw UDP one-way trip on loopback (`softrdma baseline lat`: a
//! busy-polling ping-pong of `sendmmsg`/`recvmmsg`, half the median round trip), and the
//! 64 KiB message against a `memcpy` of 64 KiB.
//!
//! Run: `cargo bench -p softrdma-cli --bench rc`

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, MrInfo, PinMode};
use softrdma::rc::{
    Gather, Mtu, Qp, QpAttr, QpCap, QpInit, RecvWr, SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use softrdma::wire::{AddressVector, IcrcContext, IcrcPrefix, Packet};

const IA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const LEN: usize = 1 << 20;

fn port(qpn: u32) -> u16 {
    0xc000 | (qpn as u16 & 0x3fff)
}

fn connect(q: &mut Qp, local: Ipv4Addr, remote: Ipv4Addr, dest: u32) {
    q.connect(&QpAttr {
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        av: Some(AddressVector::from_context(IcrcContext::v4(
            local,
            remote,
            port(q.qp_num()),
        ))),
        path_mtu: Mtu::Mtu4096,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        rq_psn: 1000,
        sq_psn: 1000,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        dest_qp_num: dest,
        ..QpAttr::default()
    })
    .unwrap();
}

struct Pair {
    mem: MemoryTable,
    a: Qp,
    b: Qp,
    ma: MrInfo,
    mb: MrInfo,
    /// How b checks a's packets and a checks b's (as the engine does: headers hashed ahead).
    from_a: IcrcPrefix,
    from_b: IcrcPrefix,
    /// a's packets of one message (bytes as on the wire once the lent payloads are put in).
    wire: Vec<Vec<u8>>,
    /// Per packet: where the lent payload goes, the pieces and their guards.
    #[allow(clippy::type_complexity)]
    lent: Vec<(
        usize,
        (Vec<softrdma::mem::LentSlice>, Vec<softrdma::mem::Lent>),
    )>,
    buf: Vec<u8>,
    gather: Gather,
}

fn pair() -> Pair {
    let mem = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = mem.alloc_pd().unwrap();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let ma = mem
        .reg_mr(pd, MemSource::owned(vec![7u8; LEN]), rw, None)
        .unwrap();
    let mb = mem
        .reg_mr(pd, MemSource::owned(vec![0u8; LEN]), rw, None)
        .unwrap();
    let qp = |n| {
        Qp::new(QpInit {
            qp_num: n,
            pd,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            srq: None,
            sq_sig_all: false,
            qp_type: Default::default(),
        })
        .unwrap()
    };
    let (mut a, mut b) = (qp(0x11), qp(0x22));
    connect(&mut a, IA, IB, 0x22);
    connect(&mut b, IB, IA, 0x11);
    Pair {
        mem,
        a,
        b,
        ma,
        mb,
        from_a: IcrcPrefix::new(IcrcContext::v4(IA, IB, port(0x11))),
        from_b: IcrcPrefix::new(IcrcContext::v4(IB, IA, port(0x22))),
        wire: (0..32).map(|_| Vec::with_capacity(5000)).collect(),
        lent: (0..32).map(|_| (0, (Vec::new(), Vec::new()))).collect(),
        buf: vec![0u8; 8192],
        gather: Gather::default(),
    }
}

#[derive(Clone, Copy)]
enum Op {
    /// An inline RDMA WRITE of 8 bytes.
    Write8,
    /// An inline SEND of 8 bytes into a posted receive.
    Send8,
    /// An RDMA WRITE of this many bytes from a registered region.
    Write(usize),
}

impl Pair {
    /// The requester's part: post one signaled WR, build its packets. Returns their number.
    fn request(&mut self, op: Op, i: u64) -> usize {
        let data = [i as u8; 8];
        let sge = [Sge {
            addr: self.ma.iova,
            length: match op {
                Op::Write(n) => n as u32,
                _ => 8,
            },
            lkey: self.ma.lkey,
        }];
        let write = WrOpcode::RdmaWrite {
            remote_addr: self.mb.iova,
            rkey: self.mb.rkey,
        };
        let wr = match op {
            Op::Write8 => SendWr::new(i, write)
                .inline(&data)
                .flags(SendFlags::INLINE | SendFlags::SIGNALED),
            Op::Send8 => SendWr::new(i, WrOpcode::Send)
                .inline(&data)
                .flags(SendFlags::INLINE | SendFlags::SIGNALED),
            Op::Write(_) => SendWr::new(i, write).sg(&sge).flags(SendFlags::SIGNALED),
        };
        self.a.post_send(&wr).unwrap();
        let mut k = 0;
        while let Some(n) =
            self.a
                .poll_transmit_gather(i, &self.mem, &mut self.buf, &mut self.gather, false)
        {
            // Keep the arena bytes (headers, pad and ICRC) and the lent pieces; the payload is
            // put in place afterwards, untimed (the kernel's copy during `sendmmsg`).
            let w = &mut self.wire[k];
            w.clear();
            w.extend_from_slice(&self.buf[..n]);
            let split = if self.gather.is_empty() {
                n
            } else {
                self.gather.split
            };
            self.lent[k] = (split, self.gather.take());
            k += 1;
        }
        k
    }

    /// Put the lent payloads of the last request's packets in place (the kernel's copy).
    fn gather_wire(&mut self, packets: usize) {
        for k in 0..packets {
            let (split, (pieces, guards)) = &mut self.lent[k];
            if pieces.is_empty() {
                continue;
            }
            let mut payload = Vec::new();
            for p in pieces.drain(..) {
                let v = p.iovec();
                // SAFETY: the lent bytes lie in a region the table keeps mapped while their
                // guards (`guards`, dropped below) live, and nothing writes them during the
                // benchmark.
                let s = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
                payload.extend_from_slice(s);
            }
            guards.clear();
            let w = &mut self.wire[k];
            let tail = w.split_off(*split);
            w.extend_from_slice(&payload);
            w.extend_from_slice(&tail);
        }
    }

    /// The responder's part: check and handle the packets, build the ACK (into `buf`).
    fn respond(&mut self, op: Op, packets: usize) -> usize {
        if matches!(op, Op::Send8) {
            let sge = [Sge {
                addr: self.mb.iova,
                length: 64,
                lkey: self.mb.lkey,
            }];
            self.b
                .post_recv(&RecvWr {
                    wr_id: 1,
                    sg_list: &sge,
                })
                .unwrap();
        }
        for w in &self.wire[..packets] {
            let p = Packet::parse_verified(&self.from_a, w).unwrap();
            self.b.handle_packet(0, &p, &self.mem, None);
        }
        while self.b.poll_completion().is_some() {}
        self.b.poll_transmit(0, &self.mem, &mut self.buf).unwrap()
    }

    /// The requester again: the ACK and the completion.
    fn complete(&mut self, ack: usize) {
        let p = Packet::parse_verified(&self.from_b, &self.buf[..ack]).unwrap();
        self.a.handle_packet(0, &p, &self.mem, None);
        let wc = self.a.poll_completion().unwrap();
        assert_eq!(wc.status, WcStatus::Success);
    }
}

/// Median over `runs` batches of `per` calls of `f`, per call.
fn median(runs: usize, per: usize, mut f: impl FnMut()) -> Duration {
    let mut v: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per {
                f();
            }
            t.elapsed() / per as u32
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

/// The three parts of one message, each timed on its own (the others run untimed around it).
fn parts(op: Op, per: usize) -> [Duration; 3] {
    let mut p = pair();
    let mut i = 0u64;
    let mut step = |p: &mut Pair, part: usize, acc: &mut Duration| {
        i += 1;
        let t = Instant::now();
        let n = p.request(op, i);
        if part == 0 {
            *acc += t.elapsed();
        }
        p.gather_wire(n);
        let t = Instant::now();
        let ack = p.respond(op, n);
        if part == 1 {
            *acc += t.elapsed();
        }
        let t = Instant::now();
        p.complete(ack);
        if part == 2 {
            *acc += t.elapsed();
        }
    };
    let mut out = [Duration::ZERO; 3];
    for (part, o) in out.iter_mut().enumerate() {
        let mut v: Vec<Duration> = (0..21)
            .map(|_| {
                let mut acc = Duration::ZERO;
                for _ in 0..per {
                    step(&mut p, part, &mut acc);
                }
                acc / per as u32
            })
            .collect();
        v.sort();
        *o = v[v.len() / 2];
    }
    out
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    println!("per message, sans sockets (medians of 21 batches):");
    println!(
        "{:>14} {:>12} {:>12} {:>12} {:>10}",
        "message", "request", "respond", "ACK", "total"
    );
    let rows = [
        ("WRITE 8 B", Op::Write8, 20_000),
        ("SEND 8 B", Op::Send8, 20_000),
        ("WRITE 4 KiB", Op::Write(4096), 5_000),
        ("WRITE 64 KiB", Op::Write(65536), 500),
    ];
    let mut results = Vec::new();
    for (name, op, per) in rows {
        let [r, s, c] = parts(op, per);
        println!(
            "{name:>14} {:>9.3} us {:>9.3} us {:>9.3} us {:>7.3} us",
            us(r),
            us(s),
            us(c),
            us(r + s + c)
        );
        results.push((name, r, s, c));
    }
    // The raw UDP baseline of `softrdma baseline lat`: half the median round trip.
    let udp = Duration::from_secs_f64(
        softrdma_cli::baseline::lat(8, 20_000)
            .expect("raw UDP ping-pong")
            .median
            / 1e6,
    );
    let src = vec![3u8; 65536];
    let mut dst = vec![0u8; 65536];
    let copy = median(21, 2_000, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    });
    println!("\nratios (same run):");
    for (name, r, s, _) in &results[..2] {
        println!(
            "  {name}: request + respond (the one-way critical path) {:.3} us = {:.2} x one raw UDP one-way trip ({:.3} us)",
            us(*r + *s),
            (*r + *s).as_secs_f64() / udp.as_secs_f64(),
            us(udp)
        );
    }
    let (_, r, s, c) = results[3];
    println!(
        "  WRITE 64 KiB: request {:.2} x, respond {:.2} x, all {:.2} x a memcpy of 64 KiB ({:.3} us)",
        r.as_secs_f64() / copy.as_secs_f64(),
        s.as_secs_f64() / copy.as_secs_f64(),
        (r + s + c).as_secs_f64() / copy.as_secs_f64(),
        us(copy)
    );
}
