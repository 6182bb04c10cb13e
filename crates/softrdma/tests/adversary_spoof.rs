//! True source spoofing: an off-path injector with a raw socket (`IP_HDRINCL`) forges the IP
//! source address *and* UDP source port of a connection's real peer, builds RoCEv2 packets
//! with `wire` (the ICRC computed for the forged addresses), and throws them at both ends of a
//! live RC connection while it carries a WRITE stream, a SEND ping-pong and READs.
//!
//! The test runs in a network namespace of its own: it re-runs its own binary (selected by
//! `SOFTRDMA_SPOOF_CHILD`) after `unshare(CLONE_NEWNET)` (plus a user namespace when not
//! root), brings `lo` up there and sends nothing outside it. When namespaces or raw sockets
//! are not available it says so loudly and passes, unless `CI` or `SOFTRDMA_STRICT` (set by
//! `scripts/test`) is set: then it fails.
//!
//! What such an injector is up against is only what the packets carry: it has the peer's
//! address and port, so the peer filter lets it through, and it must guess the QPN (given
//! here) and a PSN. Asserted below:
//! - requests at PSNs behind the expected one (duplicates), ahead within the NAK window, and
//!   far ahead, naming the secret regions with their true keys or guessed ones (and the
//!   advertised region with its key), place nothing and read nothing; far-ahead ones draw
//!   nothing, ones within the window at most one NAK-sequence per expected PSN, which costs
//!   the real requester a go-back and nothing else;
//! - forged ACKs, NAKs of every code, RNR NAKs, READ responses and atomic ACKs at PSNs that
//!   are not outstanding are ignored by both requesters (`responses_ignored`);
//! - a forger from the peer's IP but another port is dropped even at the exact PSN with a
//!   valid key (`rx_wrong_peer`: the latched port), a bad ICRC is dropped (`rx_bad`);
//! - the connection's traffic completes correctly with a bounded p99, no secret byte is ever
//!   on the wire (every frame on `lo` is captured and searched), the counters account for
//!   the forgeries.
//!
//! What it CAN do, and the test shows it at the end rather than pretending otherwise: an
//! injector that hits the exact expected PSN (1 in 2^24 blind, certain for an on-path
//! attacker) with a valid key places its WRITE into the advertised region, and the real
//! requester's WRITE at that PSN is then acknowledged as a duplicate without being placed;
//! with a wrong key it draws a Remote Access Error NAK, which is fatal to the victim's QP.
//! RoCEv2 has no authentication (docs/SECURITY.md, "Who attacks").

mod support;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use softrdma::verbs::*;
use softrdma::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, HeaderRepr, IcrcContext, IpHeader, NakCode,
    Opcode, Packet, Psn, ROCE_PORT, RethRepr, Syndrome,
};
use support::Rng;

const ROLE: &str = "SOFTRDMA_SPOOF_CHILD";
const TEST: &str = "a_spoofed_peer_places_nothing_and_breaks_nothing";

const VICTIM: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(127, 0, 9, 1);
/// The peer's host, another port: a co-tenant.
const CO_TENANT_PORT: u16 = ROCE_PORT + 1;
/// The secret regions hold this, repeated: a leak of 14 bytes or more contains "SECRET".
const CANARY: &[u8; 8] = b"SECRET\x5e\xc3";
const PUBLIC: u8 = 0xa0;
/// The peer's first PSN toward the victim, and the victim's toward the peer.
const S: u32 = 0x40_0000;
const S2: u32 = 0x70_0000;
const ITERS: u32 = 300;
const STREAM: u32 = 8;
const SLOT: u32 = 1024;
const SLOTS: u32 = 32;

#[test]
fn a_spoofed_peer_places_nothing_and_breaks_nothing() {
    if std::env::var_os(ROLE).is_some() {
        inside_namespace();
        return;
    }
    let log = support::netns::run_in_netns(
        TEST,
        ROLE,
        "true source spoofing needs a network namespace and raw sockets",
    );
    if let Some(log) = log {
        assert!(log.contains("SPOOF-DONE"), "{log}");
    }
}

fn check(r: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(r)
}

/// A raw IPv4 socket that writes whole IP headers: any source address and port.
struct Injector {
    fd: OwnedFd,
    sent: u64,
}

impl Injector {
    fn open() -> io::Result<Injector> {
        // SAFETY: a new socket, closed by OwnedFd. IPPROTO_RAW implies IP_HDRINCL.
        let fd = check(
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) },
            "raw socket",
        )?;
        // SAFETY: fd is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Injector { fd, sent: 0 })
    }

    /// `hdr` + `payload` from `src` to `dst`, with the ICRC of those addresses (IPv4 ID 0 and
    /// DF, as the kernel leaves a raw DF packet with ID 0); `corrupt` flips an ICRC bit.
    fn forge(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        hdr: HeaderRepr,
        payload: &[u8],
        corrupt: bool,
    ) {
        let ctx = IcrcContext {
            ip: IpHeader::V4 {
                src: *src.ip(),
                dst: *dst.ip(),
                id: 0,
                dont_fragment: true,
            },
            src_port: src.port(),
            dst_port: dst.port(),
        };
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        let mut body = vec![0u8; pkt.buffer_len()];
        let n = pkt.emit(&ctx, &mut body).unwrap();
        if corrupt {
            body[n - 1] ^= 0x10;
        }
        self.send_udp(src, dst, &body[..n]);
    }

    /// One UDP datagram with a forged source; the UDP checksum is left 0 (none, IPv4).
    fn send_udp(&mut self, src: SocketAddrV4, dst: SocketAddrV4, body: &[u8]) {
        let total = 28 + body.len();
        let mut b = Vec::with_capacity(total);
        b.extend_from_slice(&[0x45, 0]);
        b.extend_from_slice(&(total as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0, 0x40, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
        b.extend_from_slice(&src.ip().octets());
        b.extend_from_slice(&dst.ip().octets());
        b.extend_from_slice(&src.port().to_be_bytes());
        b.extend_from_slice(&dst.port().to_be_bytes());
        b.extend_from_slice(&((8 + body.len()) as u16).to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(body);
        // SAFETY: sockaddr_in is plain data.
        let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        to.sin_family = libc::AF_INET as libc::sa_family_t;
        to.sin_addr.s_addr = u32::from_ne_bytes(dst.ip().octets());
        // SAFETY: `b` and `to` are valid for the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                b.as_ptr().cast(),
                b.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(n, b.len() as isize, "{}", io::Error::last_os_error());
        self.sent += 1;
    }
}

/// Every frame on the namespace's `lo`, searched for the canary by a thread.
struct Capture {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u64, Vec<String>)>,
}

impl Capture {
    fn open() -> io::Result<Capture> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: a new socket, closed by OwnedFd.
        let fd = check(
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, libc::c_int::from(proto)) },
            "packet socket",
        )?;
        // SAFETY: fd is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let big: libc::c_int = 64 << 20;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 20_000,
        };
        // SAFETY: option values valid for their sizes.
        unsafe {
            if libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&big as *const libc::c_int).cast(),
                4,
            ) != 0
            {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&big as *const libc::c_int).cast(),
                    4,
                );
            }
            check(
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                ),
                "SO_RCVTIMEO",
            )?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 17];
            let (mut frames, mut leaks) = (0u64, Vec::new());
            let mut idle_after_stop = 0;
            loop {
                // SAFETY: buf is valid for its length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n <= 0 {
                    if s.load(Relaxed) {
                        idle_after_stop += 1;
                        if idle_after_stop > 2 {
                            break;
                        }
                    }
                    continue;
                }
                frames += 1;
                let f = &buf[..n as usize];
                if let Some(at) = f.windows(6).position(|w| w == b"SECRET")
                    && leaks.len() < 5
                {
                    leaks.push(format!(
                        "{n}-byte frame, canary at {at}: {:02x?}",
                        &f[..64.min(f.len())]
                    ));
                }
            }
            (frames, leaks)
        });
        Ok(Capture { stop, thread })
    }

    /// Frames seen, and descriptions of those that held the canary.
    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap()
    }
}

fn device(ip: Ipv4Addr) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::V4(ip));
    cfg.mode = PollMode::Blocking;
    cfg.pin_mode = PinMode::OnDemand;
    Device::open(cfg).unwrap()
}

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

fn req(op: Opcode, qpn: u32, psn: u32) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, qpn, Psn::new(psn)));
    h.bth.ack_req = true;
    h
}

fn with_reth(op: Opcode, qpn: u32, psn: u32, va: u64, rkey: u32, len: u32) -> HeaderRepr {
    let mut h = req(op, qpn, psn);
    h.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    h
}

fn ack(op: Opcode, qpn: u32, psn: u32, syndrome: Syndrome) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, qpn, Psn::new(psn)));
    h.aeth = Some(AethRepr { syndrome, msn: 0 });
    h
}

/// UDP receive-buffer overflows in this namespace (all of them are ours): exact counts are
/// only asserted when no datagram was lost.
fn udp_rcvbuf_errors() -> u64 {
    let s = std::fs::read_to_string("/proc/net/snmp").unwrap();
    let mut udp = s.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

/// A PSN the injector draws at random, outside `[lo - margin, lo + span + margin]` (where the
/// connection's PSNs run during the test) so that it is never the expected one.
fn far_psn(rng: &mut Rng, lo: u32, span: u32, margin: u32) -> u32 {
    loop {
        let p = (rng.next() & 0xff_ffff) as u32;
        let d = p.wrapping_sub(lo.wrapping_sub(margin)) & 0xff_ffff;
        if d > span + 2 * margin {
            return p;
        }
    }
}

/// Is `p` more than the NAK window ahead of every expected PSN in `[lo, lo + span]`?
fn always_far_ahead(p: u32, lo: u32, span: u32) -> bool {
    let d = p.wrapping_sub(lo + span) & 0xff_ffff;
    d > 1024 + 16 && d < (1 << 23) - span - 16
}

fn inside_namespace() {
    let setup = || -> io::Result<(Injector, Capture)> {
        support::netns::lo_up()?;
        Ok((Injector::open()?, Capture::open()?))
    };
    let (mut inj, cap) = match setup() {
        Ok(x) => x,
        Err(e) => {
            println!("NETNS-UNAVAILABLE {e}");
            return;
        }
    };
    println!("NETNS-READY");
    let t0 = Instant::now();

    // The victim: an advertised region (a WRITE stream lands in its first half, its second
    // half is read), a secret region in the connection's PD and one in another PD.
    let vdev = device(VICTIM);
    let pd_a = vdev.alloc_pd().unwrap();
    let pd_b = vdev.alloc_pd().unwrap();
    let canary: Vec<u8> = CANARY.iter().copied().cycle().take(8192).collect();
    let public = pd_a
        .reg_buffer(vec![PUBLIC; 2 * (SLOTS * SLOT) as usize], all())
        .unwrap();
    let secret_a = pd_a.reg_buffer(canary.clone(), all()).unwrap();
    let secret_b = pd_b.reg_buffer(canary.clone(), all()).unwrap();
    let pongs = pd_a.reg_buffer(vec![0u8; 64 * 8], all()).unwrap();
    let echo = pd_a.reg_buffer(vec![0u8; 64 * 8], all()).unwrap();
    let vcq = vdev.create_cq(512, None).unwrap();
    let vq = pd_a.create_qp(&QpInitAttr::new(&vcq)).unwrap();

    // The real peer.
    let pdev = device(PEER);
    let ppd = pdev.alloc_pd().unwrap();
    let src = ppd
        .reg_buffer(vec![0u8; (STREAM * SLOT) as usize], Access::LOCAL_WRITE)
        .unwrap();
    let ping = ppd.reg_buffer(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
    let pong = ppd.reg_buffer(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
    let landing = ppd.reg_buffer(vec![0u8; SLOT as usize], all()).unwrap();
    let pcq = pdev.create_cq(512, None).unwrap();
    let pq = ppd.create_qp(&QpInitAttr::new(&pcq)).unwrap();

    let attr = |dest, rq, sq| QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: all(),
        dest_qp_num: dest,
        rq_psn: rq,
        sq_psn: sq,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    };
    vq.connect(IpAddr::V4(PEER), &attr(pq.qp_num(), S, S2))
        .unwrap();
    pq.connect(IpAddr::V4(VICTIM), &attr(vq.qp_num(), S2, S))
        .unwrap();
    for slot in 0..64u64 {
        vq.post_recv(&RecvWr {
            wr_id: slot,
            sg_list: &[pongs.sge(slot * 8, 8)],
        })
        .unwrap();
    }

    // The victim's application echoes every ping back with a SEND.
    let stop = Arc::new(AtomicBool::new(false));
    let echoer = {
        let (stop, vq, vcq, pongs, echo) = (Arc::clone(&stop), &vq, &vcq, &pongs, &echo);
        move || -> Result<u64, String> {
            let mut echoed = 0u64;
            while !stop.load(Relaxed) {
                for wc in vcq.wait(1, Duration::from_millis(20)) {
                    if wc.status != WcStatus::Success {
                        return Err(format!("victim completion {wc:?}"));
                    }
                    if !wc.is_recv() {
                        continue;
                    }
                    let slot = wc.wr_id;
                    let mut b = [0u8; 8];
                    pongs.read(slot * 8, &mut b).unwrap();
                    echo.write(slot * 8, &b).unwrap();
                    vq.post_recv(&RecvWr {
                        wr_id: slot,
                        sg_list: &[pongs.sge(slot * 8, 8)],
                    })
                    .unwrap();
                    let sge = [echo.sge(slot * 8, 8)];
                    vq.post_send(
                        &SendWr::new(slot, WrOpcode::Send)
                            .sg(&sge)
                            .flags(SendFlags::NONE),
                    )
                    .unwrap();
                    echoed += 1;
                }
            }
            Ok(echoed)
        }
    };

    let to_victim = SocketAddrV4::new(VICTIM, ROCE_PORT);
    let to_peer = SocketAddrV4::new(PEER, ROCE_PORT);
    let as_peer = to_peer;
    let as_victim = to_victim;
    let co_tenant = SocketAddrV4::new(PEER, CO_TENANT_PORT);
    let (vqpn, pqpn) = (vq.qp_num(), pq.qp_num());
    let vc0 = snapshot(&vdev);
    let pc0 = snapshot(&pdev);
    let lost0 = udp_rcvbuf_errors();
    // PSNs the peer consumes toward the victim: 8 WRITEs and a SEND per round, a READ every
    // fourth round.
    let total = ITERS * (STREAM + 1) + ITERS.div_ceil(4);
    let mut rng = Rng(0x5eed_f00d_5b00);
    let mut n = Forged::default();
    let secrets = [
        (secret_a.iova(), secret_a.rkey()),
        (secret_b.iova(), secret_b.rkey()),
    ];

    let mut rounds = Vec::with_capacity(ITERS as usize);
    let echoed = std::thread::scope(|sc| {
        let h = sc.spawn(echoer);
        // A failed assertion below must not leave the scope waiting for the echoer forever.
        let _stop = StopOnDrop(&stop);
        let mut psn = S;
        for i in 0..ITERS {
            let t = Instant::now();
            // The WRITE stream: 8 KiB in 1 KiB WRITEs to rotating slots, the last signaled.
            for k in 0..STREAM {
                let w = i * STREAM + k;
                src.write(u64::from(k * SLOT), &[stream_byte(w); SLOT as usize])
                    .unwrap();
            }
            for k in 0..STREAM {
                let w = i * STREAM + k;
                let sge = [src.sge(u64::from(k * SLOT), SLOT)];
                let mut wr = SendWr::new(
                    1,
                    WrOpcode::RdmaWrite {
                        remote_addr: public.iova() + u64::from((w % SLOTS) * SLOT),
                        rkey: public.rkey(),
                    },
                )
                .sg(&sge)
                .flags(SendFlags::NONE);
                if k == STREAM - 1 {
                    wr = wr.flags(SendFlags::SIGNALED);
                }
                pq.post_send(&wr).unwrap();
            }
            // The ping-pong.
            pq.post_recv(&RecvWr {
                wr_id: 4,
                sg_list: &[pong.sge(0, 8)],
            })
            .unwrap();
            ping.write(0, &u64::from(i).to_ne_bytes()).unwrap();
            let sge = [ping.sge(0, 8)];
            pq.post_send(
                &SendWr::new(2, WrOpcode::Send)
                    .sg(&sge)
                    .flags(SendFlags::SIGNALED),
            )
            .unwrap();
            let mut want = 3;
            if i % 4 == 0 {
                let sge = [landing.sge(0, SLOT)];
                let off = u64::from(SLOTS * SLOT + (i % SLOTS) * SLOT);
                pq.post_send(
                    &SendWr::new(
                        3,
                        WrOpcode::RdmaRead {
                            remote_addr: public.iova() + off,
                            rkey: public.rkey(),
                        },
                    )
                    .sg(&sge)
                    .flags(SendFlags::SIGNALED),
                )
                .unwrap();
                want += 1;
            }
            let mut got = Vec::new();
            while got.len() < want {
                let w = pcq.wait(want - got.len(), Duration::from_secs(5));
                assert!(
                    !w.is_empty(),
                    "round {i}: the peer's work did not complete: {got:?}"
                );
                got.extend(w);
            }
            for w in &got {
                assert_eq!(w.status, WcStatus::Success, "round {i}: {w:?}");
            }
            assert_eq!(
                pong.to_vec().unwrap(),
                u64::from(i).to_ne_bytes(),
                "pong {i}: {got:?}"
            );
            if i % 4 == 0 {
                assert_eq!(
                    landing.to_vec().unwrap(),
                    vec![PUBLIC; SLOT as usize],
                    "READ {i}: {got:?}"
                );
                psn += 1;
            }
            psn += STREAM + 1;
            rounds.push(t.elapsed());

            // Everything the peer posted completed, so the victim expects exactly `psn` now:
            // the injector forges around it without ever hitting it.
            n.forge_round(
                &mut inj,
                &mut rng,
                i,
                psn,
                &Target {
                    vqpn,
                    pqpn,
                    to_victim,
                    to_peer,
                    as_peer,
                    as_victim,
                    co_tenant,
                    total,
                    public: (public.iova(), public.rkey()),
                    secrets,
                },
            );
        }
        stop.store(true, Relaxed);
        h.join().unwrap()
    });
    let echoed = echoed.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(echoed, u64::from(ITERS));

    // Quiet: let the last answers land.
    std::thread::sleep(Duration::from_millis(100));
    let lost = udp_rcvbuf_errors() - lost0;
    let vc = snapshot(&vdev).since(&vc0);
    let pc = snapshot(&pdev).since(&pc0);
    let (vqc, pqc) = (vq.counters(), pq.counters());
    println!(
        "{} forgeries ({n:?}) in {:?}; victim {vc:?} {vqc:?}; peer {pc:?} {pqc:?}; \
         UDP datagrams lost to full buffers: {lost}",
        inj.sent,
        t0.elapsed()
    );

    // The data: the stream's last bytes in each slot, the read half and the secrets intact.
    let pv = public.to_vec().unwrap();
    for s in 0..SLOTS {
        let last = (ITERS * STREAM - SLOTS..ITERS * STREAM)
            .find(|w| w % SLOTS == s)
            .unwrap();
        let at = (s * SLOT) as usize;
        assert!(
            pv[at..at + SLOT as usize]
                .iter()
                .all(|b| *b == stream_byte(last)),
            "slot {s} does not hold the stream's last WRITE"
        );
    }
    assert!(pv[(SLOTS * SLOT) as usize..].iter().all(|b| *b == PUBLIC));
    assert_eq!(
        secret_a.to_vec().unwrap(),
        canary,
        "secret region (same PD)"
    );
    assert_eq!(
        secret_b.to_vec().unwrap(),
        canary,
        "secret region (other PD)"
    );

    // The connection stayed healthy, with a bounded p99.
    rounds.sort();
    let p99 = rounds[rounds.len() * 99 / 100];
    let max = *rounds.last().unwrap();
    println!(
        "rounds: p50 {:?} p99 {p99:?} max {max:?}",
        rounds[rounds.len() / 2]
    );
    assert!(
        p99 < Duration::from_millis(50) && max < Duration::from_millis(500),
        "rounds p99 {p99:?} max {max:?}"
    );
    assert_eq!(vq.query().0, QpState::Rts);
    assert_eq!(pq.query().0, QpState::Rts);

    // The counters account for the forgeries.
    assert_eq!(vqc.resp.naks_sent, 0, "{vqc:?}");
    assert!(vqc.resp.duplicates >= n.past, "{vqc:?} {n:?}");
    assert!(vqc.resp.duplicates_dropped >= n.past_reads, "{vqc:?} {n:?}");
    assert!(
        (1..=u64::from(ITERS)).contains(&vqc.resp.seq_naks_sent),
        "one NAK-sequence per expected PSN at most: {vqc:?}"
    );
    assert!(
        pqc.comp.retransmits <= vqc.resp.seq_naks_sent + pqc.comp.timeouts,
        "{pqc:?}"
    );
    assert!(
        vqc.comp.responses_ignored >= n.to_victim_requester,
        "{vqc:?} {n:?}"
    );
    assert!(
        pqc.comp.responses_ignored >= n.to_peer_requester,
        "{pqc:?} {n:?}"
    );
    assert_eq!(vqc.comp.rnr_naks_received + pqc.comp.rnr_naks_received, 0);
    if lost == 0 {
        assert_eq!(vqc.resp.far_ahead_dropped, n.far, "{vqc:?} {n:?}");
        assert_eq!(vc.wrong_peer, n.co_tenant, "{vc:?} {n:?}");
        assert_eq!(vc.bad + vc.solved, n.bad_icrc, "{vc:?} {n:?}");
        assert_eq!(pc.bad + pc.solved + pc.wrong_peer, 0, "{pc:?}");
    } else {
        assert!(vqc.resp.far_ahead_dropped <= n.far);
    }

    // What an injector that hits the exact PSN can do. The victim expects `psn` and the peer
    // sends it next. A forged WRITE there with the advertised key is placed...
    let psn = S + total;
    let slot0 = public.iova();
    inj.forge(
        as_peer,
        to_victim,
        with_reth(Opcode::RC_WRITE_ONLY, vqpn, psn, slot0, public.rkey(), SLOT),
        &[0xee; SLOT as usize],
        false,
    );
    // ...but not from the peer's IP and another port (the latched port), even exactly so.
    inj.forge(
        co_tenant,
        to_victim,
        with_reth(
            Opcode::RC_WRITE_ONLY,
            vqpn,
            psn,
            slot0 + u64::from(SLOT),
            public.rkey(),
            SLOT,
        ),
        &[0xef; SLOT as usize],
        false,
    );
    std::thread::sleep(Duration::from_millis(50));
    let pv = public.to_vec().unwrap();
    assert!(
        pv[..SLOT as usize].iter().all(|b| *b == 0xee),
        "the exact forgery was placed"
    );
    assert!(
        pv[SLOT as usize..2 * SLOT as usize]
            .iter()
            .all(|b| *b != 0xef),
        "the co-tenant's forgery was placed"
    );
    // ...and the peer's own WRITE at that PSN is then acknowledged as a duplicate and lost.
    src.write(0, &[0x11; SLOT as usize]).unwrap();
    let sge = [src.sge(0, SLOT)];
    pq.post_send(
        &SendWr::new(
            9,
            WrOpcode::RdmaWrite {
                remote_addr: slot0 + 2 * u64::from(SLOT),
                rkey: public.rkey(),
            },
        )
        .sg(&sge)
        .flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let w = pcq.wait(1, Duration::from_secs(5));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].status, WcStatus::Success);
    let pv = public.to_vec().unwrap();
    assert!(
        pv[2 * SLOT as usize..3 * SLOT as usize]
            .iter()
            .all(|b| *b != 0x11),
        "the peer's WRITE behind an exact forgery was placed after all"
    );
    // With a wrong key at the exact PSN it draws Remote Access Error: the victim's QP dies.
    let psn = psn + 1;
    inj.forge(
        as_peer,
        to_victim,
        with_reth(
            Opcode::RC_WRITE_ONLY,
            vqpn,
            psn,
            secret_a.iova(),
            secret_a.rkey() ^ 0x5a5a_0000,
            8,
        ),
        &[0xee; 8],
        false,
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        vq.query().0,
        QpState::Err,
        "a NAK at the expected PSN is fatal"
    );
    assert_eq!(secret_a.to_vec().unwrap(), canary);
    assert_eq!(secret_b.to_vec().unwrap(), canary);

    let (frames, leaks) = cap.finish();
    println!("captured {frames} frames on lo");
    assert!(leaks.is_empty(), "secret bytes on the wire: {leaks:#?}");
    assert!(
        frames > u64::from(ITERS) * 10,
        "the capture saw only {frames} frames"
    );
    println!("SPOOF-DONE in {:?}", t0.elapsed());
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

fn stream_byte(w: u32) -> u8 {
    (w % 200) as u8 + 1
}

#[derive(Debug, Default)]
struct Forged {
    /// Requests at PSNs behind the expected one.
    past: u64,
    /// Of those, READs (never matching a READ that ran).
    past_reads: u64,
    /// Requests ahead within the NAK window.
    ahead: u64,
    /// Requests more than the NAK window ahead.
    far: u64,
    /// Requests to PSNs drawn at random (far, or behind) whose class is not counted.
    random: u64,
    /// Responses for PSNs the victim's requester has not outstanding.
    to_victim_requester: u64,
    /// Responses for PSNs the peer's requester has not outstanding.
    to_peer_requester: u64,
    /// Packets from the peer's IP and another port.
    co_tenant: u64,
    /// Packets with a bad ICRC.
    bad_icrc: u64,
}

struct Target {
    vqpn: u32,
    pqpn: u32,
    to_victim: SocketAddrV4,
    to_peer: SocketAddrV4,
    as_peer: SocketAddrV4,
    as_victim: SocketAddrV4,
    co_tenant: SocketAddrV4,
    total: u32,
    public: (u64, u32),
    secrets: [(u64, u32); 2],
}

impl Forged {
    /// One round of forgeries while the victim expects exactly `epsn` (never sent to it).
    fn forge_round(&mut self, inj: &mut Injector, rng: &mut Rng, i: u32, epsn: u32, t: &Target) {
        let (sva, skey) = t.secrets[(i % 2) as usize];
        let guessed = (rng.next() as u32) | 1;
        let key = [skey, guessed, t.public.1][(i % 3) as usize];
        let va = if key == t.public.1 { t.public.0 } else { sva };
        let w = |psn| with_reth(Opcode::RC_WRITE_ONLY, t.vqpn, psn, va, key, 64);
        let r = |psn| with_reth(Opcode::RC_READ_REQUEST, t.vqpn, psn, sva, skey, 4096);
        let pay = [0xe5u8; 64];

        // Within the window ahead (never the expected PSN itself).
        let ahead = 1 + rng.below(1000) as u32;
        inj.forge(t.as_peer, t.to_victim, w(epsn + ahead), &pay, false);
        inj.forge(
            t.as_peer,
            t.to_victim,
            r(epsn + 1 + (ahead % 7)),
            &[],
            false,
        );
        self.ahead += 2;
        // Behind it: a WRITE and a READ (duplicates; the READ names a secret, so it repeats
        // no READ that ran, even where the peer's READs ran).
        let back = 1 + rng.below(1000) as u32;
        inj.forge(t.as_peer, t.to_victim, w(epsn - back), &pay, false);
        inj.forge(
            t.as_peer,
            t.to_victim,
            r(epsn - 1 - (back % 40)),
            &[],
            false,
        );
        self.past += 2;
        self.past_reads += 1;
        // A bad ICRC, behind (were an ICRC flip ever explained by IPv4-ID solving, the packet
        // is a duplicate and places nothing).
        inj.forge(t.as_peer, t.to_victim, w(epsn - back), &pay, true);
        self.bad_icrc += 1;
        // The co-tenant at the exact PSN with the advertised key: the latched port stops it.
        let h = with_reth(
            Opcode::RC_WRITE_ONLY,
            t.vqpn,
            epsn,
            t.public.0,
            t.public.1,
            64,
        );
        inj.forge(t.co_tenant, t.to_victim, h, &[0xef; 64], false);
        self.co_tenant += 1;
        // Blind: PSNs at random, away from everything the connection uses.
        for _ in 0..2 {
            let p = far_psn(rng, S, t.total, 1100);
            let op = match rng.below(4) {
                0 => w(p),
                1 => r(p),
                2 => {
                    let mut h = req(Opcode::RC_FETCH_ADD, t.vqpn, p);
                    h.atomic_eth = Some(AtomicEthRepr {
                        va: sva,
                        rkey: skey,
                        swap_add: 1,
                        compare: 0,
                    });
                    h
                }
                _ => {
                    let mut h = req(Opcode::RC_SEND_ONLY_INV, t.vqpn, p);
                    h.ieth = Some(t.public.1);
                    h
                }
            };
            let payload: &[u8] = if op.bth.opcode == Opcode::RC_WRITE_ONLY
                || op.bth.opcode == Opcode::RC_SEND_ONLY_INV
            {
                &pay
            } else {
                &[]
            };
            inj.forge(t.as_peer, t.to_victim, op, payload, false);
            if always_far_ahead(p, S, t.total) {
                self.far += 1;
            } else {
                self.random += 1;
            }
        }

        // Responses at both requesters, at PSNs they have not outstanding (the victim's
        // requester sends one SEND per round from S2; the peer's from S).
        let kinds = [
            Syndrome::Ack { credits: 0x1f },
            Syndrome::Nak(NakCode::RemoteAccessError),
            Syndrome::Nak(NakCode::PsnSequenceError),
            Syndrome::Nak(NakCode::InvalidRequest),
            Syndrome::Nak(NakCode::RemoteOperationalError),
            Syndrome::RnrNak { timer: 31 },
        ];
        for (to, from, qpn, lo, span, count) in [
            (
                t.to_victim,
                t.as_peer,
                t.vqpn,
                S2,
                ITERS,
                &mut self.to_victim_requester,
            ),
            (
                t.to_peer,
                t.as_victim,
                t.pqpn,
                S,
                t.total,
                &mut self.to_peer_requester,
            ),
        ] {
            let p = far_psn(rng, lo, span, 64);
            let h = match rng.below(8) {
                6 => {
                    let mut h = ack(
                        Opcode::RC_READ_RESPONSE_ONLY,
                        qpn,
                        p,
                        Syndrome::Ack { credits: 0x1f },
                    );
                    h.bth.ack_req = false;
                    inj.forge(from, to, h, &[0x5e; 1024], false);
                    *count += 1;
                    continue;
                }
                7 => {
                    let mut h = ack(
                        Opcode::RC_ATOMIC_ACK,
                        qpn,
                        p,
                        Syndrome::Ack { credits: 0x1f },
                    );
                    h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 0x5e5e });
                    h
                }
                k => ack(Opcode::RC_ACK, qpn, p, kinds[k as usize]),
            };
            inj.forge(from, to, h, &[], false);
            *count += 1;
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Snap {
    bad: u64,
    solved: u64,
    wrong_peer: u64,
    unknown: u64,
}

fn snapshot(d: &Device) -> Snap {
    let c = d.counters();
    Snap {
        bad: c.rx_bad.load(Relaxed),
        solved: c.rx_icrc_solved.load(Relaxed),
        wrong_peer: c.rx_wrong_peer.load(Relaxed),
        unknown: c.rx_unknown_qp.load(Relaxed),
    }
}

impl Snap {
    fn since(&self, o: &Snap) -> Snap {
        Snap {
            bad: self.bad - o.bad,
            solved: self.solved - o.solved,
            wrong_peer: self.wrong_peer - o.wrong_peer,
            unknown: self.unknown - o.unknown,
        }
    }
}
