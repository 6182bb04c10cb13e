//! A hostile connected peer against a real device over UDP. The attacker is a bare socket at
//! the address the victim's QP is connected to, speaking RoCEv2 built with `wire`: it is the
//! peer, so every packet passes the victim's peer filter, and it controls every header. The
//! victim's PD holds an advertised region and a secret one; a bystander device does WRITE
//! round trips to the victim through another QP of the same device before and after the
//! attacks. After every attack: no secret byte was ever on the wire, the secret region is
//! unchanged, and the bystander's round trips all succeed within a bound.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma::net::{PortOptions, RxBatch, TxBatch, UdpPort};
use softrdma::verbs::*;
use softrdma::wire::{
    AtomicEthRepr, BthRepr, HeaderRepr, IcrcContext, IpHeader, NakCode, OpKind, Opcode, Packet,
    Psn, RethRepr, Syndrome,
};

const PORT: u16 = 24860;
const VICTIM: [u8; 4] = [127, 0, 6, 2];
const ATTACKER: [u8; 4] = [127, 0, 6, 3];
const BYSTANDER: [u8; 4] = [127, 0, 6, 1];
const EPSN: u32 = 90_000;
const SECRET: u8 = 0x5e;
const PUBLIC: u8 = 0xa0;
const ATTACKER_QPN: u32 = 0x77;

/// The tests share addresses and ports: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn device(ip: [u8; 4]) -> Device {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = PORT;
    cfg.mode = PollMode::Blocking;
    cfg.pin_mode = PinMode::OnDemand;
    Device::open(cfg).unwrap()
}

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

struct Attacker {
    port: UdpPort,
    victim: SocketAddr,
    qpn: u32,
    rx: RxBatch,
}

impl Attacker {
    fn new(victim_qpn: u32) -> Attacker {
        Attacker::at(ATTACKER, PORT, victim_qpn)
    }

    /// An attacker socket at `ip:port`, aiming at the victim's QP `victim_qpn`.
    fn at(ip: [u8; 4], port: u16, victim_qpn: u32) -> Attacker {
        let port = UdpPort::bind(SocketAddr::from((ip, port)), PortOptions::default()).unwrap();
        port.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        Attacker {
            port,
            victim: SocketAddr::from((VICTIM, PORT)),
            qpn: victim_qpn,
            // Whole GRO datagrams (a smaller buffer truncates the last segment of a stream).
            rx: RxBatch::new(64, softrdma::net::udp::MAX_DATAGRAM),
        }
    }

    /// The packet `hdr` + `payload` for the victim's QP, with a good ICRC.
    fn packet(&self, mut hdr: HeaderRepr, payload: &[u8]) -> Vec<u8> {
        hdr.bth.dest_qp = self.qpn;
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        let SocketAddr::V4(me) = self.port.local_addr() else {
            unreachable!("IPv4 only")
        };
        let ctx = IcrcContext {
            ip: IpHeader::V4 {
                src: *me.ip(),
                dst: Ipv4Addr::from(VICTIM),
                id: 0,
                dont_fragment: true,
            },
            src_port: me.port(),
            dst_port: PORT,
        };
        let mut buf = vec![0u8; 9000];
        let n = pkt.emit(&ctx, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn send(&self, hdr: HeaderRepr, payload: &[u8]) {
        let b = self.packet(hdr, payload);
        self.send_raw(&b);
    }

    /// One datagram of exactly these bytes (at least one).
    fn send_raw(&self, bytes: &[u8]) {
        let mut tx = TxBatch::new(1, bytes.len().max(1));
        assert!(tx.push(self.victim, bytes, bytes.len().max(1) as u16));
        self.port.send(&mut tx).unwrap();
    }

    /// Every packet the victim sends within `wait`: kind, PSN, syndrome, payload.
    fn collect(&mut self, wait: Duration) -> Vec<(OpKind, Psn, Option<Syndrome>, Vec<u8>)> {
        let mut out = Vec::new();
        let end = Instant::now() + wait;
        while Instant::now() < end && out.len() < 100_000 {
            let Ok(n) = self.port.recv(&mut self.rx) else {
                continue;
            };
            for i in 0..n {
                let Some(d) = self.rx.get(i) else { continue };
                for seg in d.segments() {
                    let pkt = Packet::parse(seg).expect("the victim sent a malformed packet");
                    let kind = pkt.hdr.bth.opcode.info().unwrap().kind;
                    out.push((
                        kind,
                        pkt.hdr.bth.psn,
                        pkt.hdr.aeth.map(|a| a.syndrome),
                        pkt.payload.to_vec(),
                    ));
                }
            }
        }
        out
    }
}

fn req(op: Opcode, psn: u32) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, 0, Psn::new(psn)));
    h.bth.ack_req = true;
    h
}

fn read(psn: u32, va: u64, rkey: u32, dma_len: u32) -> HeaderRepr {
    let mut h = req(Opcode::RC_READ_REQUEST, psn);
    h.reth = Some(RethRepr { va, rkey, dma_len });
    h
}

struct Bystander {
    dev: Device,
    cq: Cq,
    qp: Qp,
    src: Mr,
    dst_addr: u64,
    dst_rkey: u32,
}

impl Bystander {
    /// `n` signaled 8-byte WRITE round trips; returns the slowest.
    fn round_trips(&self, n: u64) -> Duration {
        let mut worst = Duration::ZERO;
        let sge = [self.src.sge(0, 8)];
        for i in 0..n {
            let t = Instant::now();
            let wr = SendWr::new(
                i,
                WrOpcode::RdmaWrite {
                    remote_addr: self.dst_addr,
                    rkey: self.dst_rkey,
                },
            )
            .sg(&sge)
            .flags(SendFlags::SIGNALED);
            self.qp.post_send(&wr).unwrap();
            let wc = self.cq.wait(1, Duration::from_secs(5));
            assert_eq!(wc.len(), 1, "bystander WRITE {i} did not complete");
            assert_eq!(wc[0].status, WcStatus::Success, "bystander WRITE {i}");
            worst = worst.max(t.elapsed());
        }
        worst
    }
}

#[test]
fn a_hostile_peer_reads_no_secret_and_revokes_nothing() {
    let _g = serial();
    let v = Victim::new();
    let (public, secret) = (&v.public, &v.secret);
    let qp = v.qp();
    let (by, vqp2, _landing) = v.bystander(BYSTANDER);
    let before = by.round_trips(100);

    let mut a = Attacker::new(qp.qp_num());
    let mut seen = Vec::new();
    // A genuine READ of 2 KiB of the advertised region.
    a.send(read(EPSN, public.iova(), public.rkey(), 2048), &[]);
    let out = a.collect(Duration::from_millis(100));
    assert_eq!(out.len(), 2, "{out:?}");
    seen.extend(out);

    // Key and address search through duplicates: READs behind the expected PSN naming the
    // secret region, at PSNs where no READ ran and at the genuine READ's own PSNs.
    for k in 1..=64u32 {
        let psn = if k % 2 == 0 { EPSN - k } else { EPSN + (k % 2) };
        a.send(read(psn, secret.iova(), secret.rkey(), 4096), &[]);
    }
    // The genuine READ's key asking for more than it read.
    a.send(read(EPSN, public.iova(), public.rkey(), 8192), &[]);
    let out = a.collect(Duration::from_millis(200));
    assert!(
        out.is_empty(),
        "forged duplicate READs were answered: {} packets",
        out.len()
    );
    seen.extend(out);

    // Far-ahead PSNs draw nothing; a SEND with Invalidate naming a region's key is refused.
    for ahead in [2000u32, 1 << 20] {
        a.send(read(EPSN + ahead, secret.iova(), secret.rkey(), 64), &[]);
    }
    assert!(a.collect(Duration::from_millis(100)).is_empty());
    let mut inv = req(Opcode::RC_SEND_ONLY_INV, EPSN + 2);
    inv.ieth = Some(public.rkey());
    qp.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: &[secret.sge(0, 64)],
    })
    .unwrap();
    a.send(inv, &[0u8; 16]);
    let out = a.collect(Duration::from_millis(100));
    assert!(
        out.iter()
            .any(|o| matches!(o.2, Some(Syndrome::Nak(NakCode::InvalidRequest)))),
        "{out:?}"
    );
    seen.extend(out);
    public.write(0, &[PUBLIC]).unwrap();
    assert_eq!(
        public.to_vec().unwrap(),
        vec![PUBLIC; 8192],
        "public region revoked"
    );

    for (kind, psn, _, payload) in &seen {
        assert!(
            !payload.contains(&SECRET),
            "secret bytes in a {kind:?} at {psn:?}"
        );
    }
    // The secret region lost nothing but the 16 bytes the refused SEND may have placed in
    // the receive buffer the victim itself posted there (the receive completes in error).
    assert!(secret.to_vec().unwrap()[64..].iter().all(|b| *b == SECRET));
    let c = qp.counters().resp;
    assert!(c.duplicates_dropped >= 65, "{c:?}");
    assert_eq!(c.far_ahead_dropped, 2, "{c:?}");

    // The bystander never noticed.
    let after = by.round_trips(100);
    let bound = Duration::from_millis(200);
    assert!(
        before < bound && after < bound,
        "bystander round trips: worst {before:?} before, {after:?} after"
    );
    assert_eq!(vqp2.counters().comp.retransmits, 0);
    drop(by.dev);
}

/// The victim device with an advertised and a secret region, and QPs connected to the
/// attacker on demand (a NAK is fatal to a QP, so each probe that draws one gets its own).
struct Victim {
    dev: Device,
    pd: Pd,
    cq: Cq,
    public: Mr,
    secret: Mr,
    /// A secret region in another PD than the attacked QPs'.
    other: Mr,
}

fn qp_attr(dest: u32, rq: u32, sq: u32) -> QpAttr {
    QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: all(),
        dest_qp_num: dest,
        rq_psn: rq,
        sq_psn: sq,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    }
}

impl Victim {
    fn new() -> Victim {
        let dev = device(VICTIM);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256, None).unwrap();
        let public = pd.reg_buffer(vec![PUBLIC; 8192], all()).unwrap();
        let secret = pd.reg_buffer(vec![SECRET; 8192], all()).unwrap();
        let other = dev
            .alloc_pd()
            .unwrap()
            .reg_buffer(vec![SECRET; 8192], all())
            .unwrap();
        Victim {
            dev,
            pd,
            cq,
            public,
            secret,
            other,
        }
    }

    /// A QP connected to the attacker, expecting PSN `EPSN`.
    fn qp(&self) -> Qp {
        let qp = self.pd.create_qp(&QpInitAttr::new(&self.cq)).unwrap();
        qp.connect(IpAddr::from(ATTACKER), &qp_attr(ATTACKER_QPN, EPSN, 1))
            .unwrap();
        qp
    }

    /// A bystander device connected to a new QP of the victim's.
    fn bystander(&self, ip: [u8; 4]) -> (Bystander, Qp, Mr) {
        let bdev = device(ip);
        let bpd = bdev.alloc_pd().unwrap();
        let bcq = bdev.create_cq(64, None).unwrap();
        let bqp = bpd.create_qp(&QpInitAttr::new(&bcq)).unwrap();
        let vqp = self.pd.create_qp(&QpInitAttr::new(&self.cq)).unwrap();
        vqp.connect(bdev.addr(), &qp_attr(bqp.qp_num(), 500, 700))
            .unwrap();
        bqp.connect(self.dev.addr(), &qp_attr(vqp.qp_num(), 700, 500))
            .unwrap();
        let landing = self.pd.reg_buffer(vec![0u8; 64], all()).unwrap();
        let by = Bystander {
            src: bpd.reg_buffer(vec![1u8; 8], Access::LOCAL_WRITE).unwrap(),
            dst_addr: landing.iova(),
            dst_rkey: landing.rkey(),
            dev: bdev,
            cq: bcq,
            qp: bqp,
        };
        (by, vqp, landing)
    }

    fn untouched(&self) {
        assert_eq!(
            self.public.to_vec().unwrap(),
            vec![PUBLIC; 8192],
            "public region"
        );
        assert_eq!(
            self.secret.to_vec().unwrap(),
            vec![SECRET; 8192],
            "secret region"
        );
        assert_eq!(
            self.other.to_vec().unwrap(),
            vec![SECRET; 8192],
            "secret region of the other PD"
        );
    }
}

fn write(psn: u32, va: u64, rkey: u32, len: u32) -> HeaderRepr {
    let mut h = req(Opcode::RC_WRITE_ONLY, psn);
    h.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: len,
    });
    h
}

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Junk of every kind, from strangers and from the peer's host: random bytes, packets with a
/// bad ICRC, truncated packets, packets for unknown QPNs, zero-length and 64 KB datagrams,
/// and well-formed requests from another IP or from the peer's IP on another port once the peer
/// has latched its own. Nothing is placed, the
/// counters account for it, the process's memory does not grow, and a bystander's round
/// trips keep succeeding while it lasts.
#[test]
fn junk_floods_change_nothing_and_cost_no_memory() {
    let _g = serial();
    let v = Victim::new();
    let qp = v.qp();
    let (by, _vqp, _landing) = v.bystander([127, 0, 6, 11]);
    let mut peer = Attacker::new(qp.qp_num());
    // The real peer's first request latches its port: from then on the co-tenant on the
    // peer's host (same IP, another port) is a stranger too.
    peer.send(read(EPSN, v.public.iova(), v.public.rkey(), 16), &[]);
    assert_eq!(peer.collect(Duration::from_millis(200)).len(), 1);
    let peer = peer;
    let stranger = Attacker::at([127, 0, 6, 4], PORT, qp.qp_num());
    let co_tenant = Attacker::at(ATTACKER, PORT + 1, qp.qp_num());
    let unknown = Attacker::at([127, 0, 6, 4], PORT + 2, qp.qp_num() ^ 0x5a5a);
    let raw = std::net::UdpSocket::bind(SocketAddr::from(([127, 0, 6, 5], 0))).unwrap();
    let victim_addr = SocketAddr::from((VICTIM, PORT));
    let far = peer.packet(
        write(EPSN + 100_000, v.public.iova(), v.public.rkey(), 64),
        &[0xee; 64],
    );
    // BTH + RETH.
    const HDR: usize = 28;
    let good = peer.packet(
        write(EPSN, v.public.iova(), v.public.rkey(), 64),
        &[0xee; 64],
    );
    let c = v.dev.counters();
    use std::sync::atomic::Ordering::Relaxed;
    let (bad0, unknown0, wrong0) = (
        c.rx_bad.load(Relaxed),
        c.rx_unknown_qp.load(Relaxed),
        c.rx_wrong_peer.load(Relaxed),
    );
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let blob = vec![0xa5u8; 65_000];
    let flood = |rounds: usize, rnd: &mut dyn FnMut() -> u64| {
        for i in 0..rounds {
            match i % 7 {
                0 => {
                    let n = (rnd() % 1500) as usize;
                    let junk: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
                    let _ = raw.send_to(&junk, victim_addr);
                }
                1 => {
                    // A bit flipped in the payload or the ICRC (the BTH has bits the ICRC
                    // masks, whose flips are not corruption). The request is far ahead, so a
                    // flip the IPv4-identification solving happens to explain (one in 2^16)
                    // places nothing either.
                    let mut b = far.clone();
                    let k = HDR + (rnd() as usize) % (b.len() - HDR);
                    b[k] ^= 1 << (rnd() % 8);
                    peer.send_raw(&b);
                }
                2 => {
                    let k = (rnd() as usize) % good.len();
                    peer.send_raw(&good[..k.max(1)]);
                }
                3 => unknown.send(
                    write(EPSN, v.public.iova(), v.public.rkey(), 64),
                    &[0xee; 64],
                ),
                4 => stranger.send(
                    write(EPSN, v.public.iova(), v.public.rkey(), 64),
                    &[0xee; 64],
                ),
                5 => co_tenant.send(
                    write(EPSN + 1, v.public.iova(), v.public.rkey(), 64),
                    &[0xee; 64],
                ),
                _ if i % 70 == 6 => {
                    let _ = raw.send_to(&blob, victim_addr);
                }
                _ => {
                    let _ = raw.send_to(&[], victim_addr);
                }
            }
        }
    };
    flood(2_000, &mut rnd);
    std::thread::sleep(Duration::from_millis(200));
    let rss0 = vm_rss_kib();
    let worst = std::thread::scope(|s| {
        let h = s.spawn(|| by.round_trips(200));
        flood(20_000, &mut rnd);
        h.join().unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    let grown = vm_rss_kib().saturating_sub(rss0);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB under junk");
    assert!(
        worst < Duration::from_secs(1),
        "bystander's worst round trip {worst:?}"
    );
    v.untouched();
    assert!(
        c.rx_bad.load(Relaxed) > bad0 + 5_000,
        "bad packets not counted"
    );
    assert!(c.rx_unknown_qp.load(Relaxed) > unknown0 + 2_000);
    assert!(c.rx_wrong_peer.load(Relaxed) > wrong0 + 2_000, "{c:?}");
    let qc = qp.counters();
    assert_eq!(qc.resp.seq_naks_sent + qc.resp.naks_sent, 0, "{qc:?}");
    // The real peer is still served.
    let mut peer = peer;
    peer.send(read(EPSN + 1, v.public.iova(), v.public.rkey(), 16), &[]);
    let out = peer.collect(Duration::from_millis(200));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].3, vec![PUBLIC; 16]);
}

fn atomic(op: Opcode, psn: u32, va: u64, rkey: u32, swap_add: u64, compare: u64) -> HeaderRepr {
    let mut h = req(op, psn);
    h.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add,
        compare,
    });
    h
}

/// An atomic executes once whatever is replayed: retransmissions of an executed atomic are
/// answered from the replay cache with the original value, and a "duplicate" at a PSN where
/// no atomic ran is dropped.
#[test]
fn atomics_execute_once_whatever_is_replayed() {
    let _g = serial();
    let v = Victim::new();
    let qp = v.qp();
    let mut a = Attacker::new(qp.qp_num());
    let (va, key) = (v.public.iova() + 64, v.public.rkey());
    let start = u64::from_ne_bytes([PUBLIC; 8]);
    let faa = atomic(Opcode::RC_FETCH_ADD, EPSN, va, key, 5, 0);
    let cas = atomic(Opcode::RC_COMPARE_SWAP, EPSN + 1, va, key, 42, start + 5);
    a.send(faa, &[]);
    a.send(cas, &[]);
    for _ in 0..10 {
        a.send(faa, &[]);
        a.send(cas, &[]);
    }
    a.send(
        atomic(Opcode::RC_FETCH_ADD, EPSN - 7, va, key, 1000, 0),
        &[],
    );
    a.send(
        atomic(Opcode::RC_COMPARE_SWAP, EPSN - 8, va, key, 7, 42),
        &[],
    );
    let out = a.collect(Duration::from_millis(300));
    let acks: Vec<_> = out.iter().filter(|o| o.0 == OpKind::AtomicAck).collect();
    assert_eq!(acks.len(), 22, "{out:?}");
    let mut buf = [0u8; 8];
    v.public.read(64, &mut buf).unwrap();
    assert_eq!(
        u64::from_ne_bytes(buf),
        42,
        "executed more or less than once"
    );
    let c = qp.counters().resp;
    assert_eq!(c.atomic_replays, 20, "{c:?}");
    assert_eq!(c.duplicates_dropped, 2, "{c:?}");

    // Sixteen more atomics push the first two out of the replay cache (16 entries): a replay
    // of the first is then dropped, not executed again.
    for i in 0..16 {
        a.send(
            atomic(Opcode::RC_FETCH_ADD, EPSN + 2 + i, va, key, 1, 0),
            &[],
        );
    }
    a.send(faa, &[]);
    let out = a.collect(Duration::from_millis(300));
    let acks = out.iter().filter(|o| o.0 == OpKind::AtomicAck).count();
    assert_eq!(acks, 16, "{out:?}");
    v.public.read(64, &mut buf).unwrap();
    assert_eq!(
        u64::from_ne_bytes(buf),
        42 + 16,
        "a replay older than the cache executed"
    );
    let c = qp.counters().resp;
    assert_eq!(c.duplicates_dropped, 3, "{c:?}");
}

/// A key that died stays dead on the wire: after deregistration, re-registration, a type 1
/// window's rebind, and a type 2 window's invalidation by SEND with Invalidate, a WRITE with
/// the old key is refused with Remote Access Error and places nothing; the new key works.
#[test]
fn dead_keys_stay_dead() {
    let _g = serial();
    let v = Victim::new();
    // Probe `key` at `va` with a fresh QP: the syndrome of the answer.
    let probe = |va: u64, key: u32| -> Option<Syndrome> {
        let qp = v.qp();
        let mut a = Attacker::new(qp.qp_num());
        a.send(write(EPSN, va, key, 8), &[0x77; 8]);
        let out = a.collect(Duration::from_millis(150));
        drop(qp);
        out.first().and_then(|o| o.2)
    };
    let dead = Some(Syndrome::Nak(NakCode::RemoteAccessError));
    let ok = |s: Option<Syndrome>| matches!(s, Some(Syndrome::Ack { .. }));

    // Deregistration.
    let gone = v.pd.reg_buffer(vec![0u8; 64], all()).unwrap();
    let (gva, gkey) = (gone.iova(), gone.rkey());
    assert!(ok(probe(gva, gkey)));
    drop(gone);
    assert_eq!(probe(gva, gkey), dead, "deregistered key");

    // Re-registration onto new memory (a rereg that keeps the memory keeps the key, as rxe's
    // and mlx5's do; an invalidated region gets a new one: `mem_lookup`).
    let mut m = v.pd.reg_buffer(vec![0u8; 64], all()).unwrap();
    let old = m.rkey();
    m.rereg(MrRereg {
        translation: Some((MemSource::owned(vec![0u8; 64]), None)),
        ..MrRereg::default()
    })
    .unwrap();
    assert_ne!(m.rkey(), old);
    assert_eq!(probe(m.iova(), old), dead, "key before re-registration");
    assert!(ok(probe(m.iova(), m.rkey())));

    // Type 1 window rebound.
    let host =
        v.pd.reg_buffer(vec![0u8; 4096], all() | Access::MW_BIND)
            .unwrap();
    let w1 = v.pd.alloc_mw(MwType::Type1).unwrap();
    let q = v.qp();
    let k1 = w1
        .bind(&q, &host, host.iova(), 64, Access::REMOTE_WRITE)
        .unwrap();
    assert!(ok(probe(host.iova(), k1)));
    let k2 = w1
        .bind(&q, &host, host.iova() + 64, 64, Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(probe(host.iova(), k1), dead, "type 1 key before the rebind");
    assert!(ok(probe(host.iova() + 64, k2)));

    // Type 2 window, invalidated by the peer's SEND with Invalidate through its QP.
    let qp = v.qp();
    let w2 = v.pd.alloc_mw(MwType::Type2).unwrap();
    let new_key = (w2.rkey() & !0xff) | ((w2.rkey() + 1) & 0xff);
    let bind = SendWr::new(
        1,
        WrOpcode::BindMw {
            mw_rkey: w2.rkey(),
            new_rkey: new_key,
            mr_lkey: host.lkey(),
            addr: host.iova() + 128,
            length: 64,
            access: Access::REMOTE_WRITE,
        },
    )
    .flags(SendFlags::SIGNALED);
    qp.post_send(&bind).unwrap();
    let wc = v.cq.wait(1, Duration::from_secs(5));
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);
    w2.bound_by_wr(Some(&host), new_key);
    qp.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &[host.sge(1024, 64)],
    })
    .unwrap();
    let mut a = Attacker::new(qp.qp_num());
    a.send(write(EPSN, host.iova() + 128, new_key, 8), &[1; 8]);
    let mut inv = req(Opcode::RC_SEND_ONLY_INV, EPSN + 1);
    inv.ieth = Some(new_key);
    a.send(inv, &[2; 8]);
    let out = a.collect(Duration::from_millis(150));
    assert!(
        out.iter()
            .all(|o| matches!(o.2, Some(Syndrome::Ack { .. }))),
        "{out:?}"
    );
    let wc = v.cq.wait(1, Duration::from_secs(5));
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].status, wc[0].invalidated_rkey),
        (WcStatus::Success, Some(new_key))
    );
    a.send(write(EPSN + 2, host.iova() + 128, new_key, 8), &[3; 8]);
    let out = a.collect(Duration::from_millis(150));
    assert_eq!(
        out.first().and_then(|o| o.2),
        dead,
        "type 2 key after SEND with Invalidate"
    );
    let mut b = [0u8; 8];
    host.read(128, &mut b).unwrap();
    assert_eq!(b, [1; 8], "bytes placed through a dead key");

    // LOCAL_INV of a region (no window bound to it) by the victim's own QP.
    drop(a);
    let li = v.pd.reg_buffer(vec![0u8; 64], all()).unwrap();
    let q = v.qp();
    let inv = SendWr::new(9, WrOpcode::LocalInv { rkey: li.lkey() }).flags(SendFlags::SIGNALED);
    q.post_send(&inv).unwrap();
    let wc = v.cq.wait(1, Duration::from_secs(5));
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, WcStatus::Success));
    assert_eq!(probe(li.iova(), li.rkey()), dead, "key after LOCAL_INV");
    let back = li.dereg().map_err(|(_, e)| e).unwrap();
    let back = back.downcast::<Vec<u8>>().ok().unwrap();
    assert!(
        back.iter().all(|&x| x == 0),
        "bytes placed through a key after LOCAL_INV"
    );
}

/// Key guessing in sequence, at the expected PSN: whatever a guess hits (no region, a region
/// of another PD, a region out of bounds or without the right) the answer is the same Remote
/// Access Error NAK, nothing is placed or read, and the QP is dead after it, so every guess
/// costs the peer a connection.
#[test]
fn key_guesses_draw_one_uniform_nak_each() {
    let _g = serial();
    let v = Victim::new();
    let read_only =
        v.pd.reg_buffer(vec![PUBLIC; 64], Access::REMOTE_READ)
            .unwrap();
    let mut rnd = 0x2545_f491_4f6c_dd1du64;
    let mut guess = move || {
        rnd ^= rnd << 13;
        rnd ^= rnd >> 7;
        rnd ^= rnd << 17;
        rnd as u32
    };
    let mut probes: Vec<(&str, u64, u32, bool)> = Vec::new();
    for _ in 0..8 {
        probes.push(("guessed key", v.secret.iova(), guess(), true));
        probes.push(("guessed key", v.secret.iova(), guess(), false));
    }
    probes.extend([
        ("another PD's key", v.other.iova(), v.other.rkey(), true),
        ("another PD's key", v.other.iova(), v.other.rkey(), false),
        (
            "out of bounds",
            v.public.iova() + 8192,
            v.public.rkey(),
            true,
        ),
        (
            "out of bounds",
            v.public.iova() + 8190,
            v.public.rkey(),
            false,
        ),
        ("no right", read_only.iova(), read_only.rkey(), true),
        ("wrapping address", u64::MAX - 7, v.public.rkey(), false),
    ]);
    let mut seen = Vec::new();
    for (what, va, key, is_write) in probes {
        let qp = v.qp();
        let mut a = Attacker::new(qp.qp_num());
        let h = if is_write {
            write(EPSN, va, key, 64)
        } else {
            read(EPSN, va, key, 64)
        };
        a.send(h, if is_write { &[0xee; 64] } else { &[] });
        // The next guess on the same QP: not answered, the QP is in the error state.
        a.send(read(EPSN + 1, v.public.iova(), v.public.rkey(), 64), &[]);
        let out = a.collect(Duration::from_millis(60));
        assert_eq!(
            out.iter().map(|o| o.2).collect::<Vec<_>>(),
            vec![Some(Syndrome::Nak(NakCode::RemoteAccessError))],
            "{what} ({}): {out:?}",
            if is_write { "WRITE" } else { "READ" }
        );
        assert_eq!(qp.query().0, QpState::Err, "{what}");
        assert_eq!(qp.counters().resp.naks_sent, 1);
        seen.extend(out);
    }
    assert!(seen.iter().all(|o| o.3.is_empty()));
    v.untouched();
    assert_eq!(read_only.to_vec().unwrap(), vec![PUBLIC; 64]);
}

/// The hostile peer as the responder of the victim's READ: responses too long, too short, at
/// PSNs not outstanding, of the wrong kind, and ACKs and NAKs for nothing outstanding are
/// ignored, the bytes around the READ's buffer are never written, and the READ completes
/// with the one response that fits.
#[test]
fn forged_read_responses_place_nothing_outside_the_read() {
    let _g = serial();
    let v = Victim::new();
    let qp = v.qp();
    let mut a = Attacker::new(qp.qp_num());
    let sge = [v.public.sge(1024, 64)];
    let wr = SendWr::new(
        7,
        WrOpcode::RdmaRead {
            remote_addr: 0x10_0000,
            rkey: 0x1234,
        },
    )
    .sg(&sge);
    qp.post_send(&wr).unwrap();
    // The READ request (and perhaps its retransmissions).
    let out = a.collect(Duration::from_millis(50));
    assert!(
        !out.is_empty()
            && out
                .iter()
                .all(|o| o.0 == OpKind::ReadRequest && o.1 == out[0].1),
        "{out:?}"
    );
    let p = out[0].1.value();
    let resp = |op: Opcode, psn: u32| {
        let mut h = HeaderRepr::new(BthRepr::new(op, 0, Psn::new(psn)));
        if op != Opcode::RC_READ_RESPONSE_MIDDLE {
            h.aeth = Some(softrdma::wire::AethRepr {
                syndrome: Syndrome::Ack { credits: 0x1f },
                msn: 1,
            });
        }
        h
    };
    let nak = |psn: u32, syndrome| {
        let mut h = HeaderRepr::new(BthRepr::new(Opcode::RC_ACK, 0, Psn::new(psn)));
        h.aeth = Some(softrdma::wire::AethRepr { syndrome, msn: 1 });
        h
    };
    let forged = [
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p), 1024),
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p), 32),
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p), 68),
        (resp(Opcode::RC_READ_RESPONSE_FIRST, p), 1024),
        (resp(Opcode::RC_READ_RESPONSE_MIDDLE, p + 1), 1024),
        (resp(Opcode::RC_READ_RESPONSE_LAST, p + 1), 64),
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p + 1), 64),
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p.wrapping_sub(1)), 64),
        (resp(Opcode::RC_READ_RESPONSE_ONLY, p + 1000), 64),
        (nak(p + 1, Syndrome::Nak(NakCode::RemoteAccessError)), 0),
        (nak(p + 5, Syndrome::RnrNak { timer: 31 }), 0),
        (nak(p.wrapping_sub(3), Syndrome::Ack { credits: 0 }), 0),
    ];
    for (h, len) in forged {
        a.send(h, &vec![SECRET; len]);
    }
    // An atomic ACK at the READ's PSN is the wrong kind of response.
    let mut h = resp(Opcode::RC_ATOMIC_ACK, p);
    h.atomic_ack_eth = Some(softrdma::wire::AtomicAckEthRepr { orig: 0x5e5e });
    a.send(h, &[]);
    std::thread::sleep(Duration::from_millis(30));
    let mut wc = [EMPTY_WC; 4];
    assert_eq!(
        v.cq.poll(&mut wc),
        0,
        "a forged response completed the READ"
    );
    let c = qp.counters().comp;
    assert!(c.responses_ignored >= 10, "{c:?}");
    v.untouched();
    // The response that fits.
    a.send(resp(Opcode::RC_READ_RESPONSE_ONLY, p), &[0x33; 64]);
    let wc = v.cq.wait(1, Duration::from_secs(2));
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (7, WcStatus::Success, 64)
    );
    let mut want = vec![PUBLIC; 8192];
    want[1024..1088].fill(0x33);
    assert_eq!(v.public.to_vec().unwrap(), want);
    assert_eq!(qp.query().0, QpState::Rts);
}

/// READ-depth and starvation DoS: the hostile peer keeps its responder busy at the
/// negotiated depth with 16 MiB READs, repeats them as duplicates as fast as it can (each
/// duplicate is served again, within twice the depth) and never reads its socket, for about
/// a second, while a bystander does WRITE round trips to the same device: their p99 stays
/// bounded and none fails; afterwards the peer's connection still answers.
#[test]
fn read_storms_at_depth_leave_the_bystander_responsive() {
    const READ: usize = 16 << 20;
    let _g = serial();
    let v = Victim::new();
    let big = v.pd.reg_buffer(vec![PUBLIC; READ], all()).unwrap();
    let qp = v.qp();
    let (by, vqp2, _landing) = v.bystander([127, 0, 6, 12]);
    by.round_trips(20);
    let a = Attacker::new(qp.qp_num());
    // PSNs per READ at a 1024-byte MTU.
    let per = READ as u32 / 1024;
    let reads = |a: &Attacker| {
        for r in 0..4 {
            a.send(
                read(EPSN + r * per, big.iova(), big.rkey(), READ as u32),
                &[],
            );
        }
    };
    let mut rtts = Vec::new();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let mut rtts = Vec::new();
            while t0.elapsed() < Duration::from_millis(1000) {
                rtts.push(by.round_trips(1));
            }
            rtts
        });
        reads(&a);
        while t0.elapsed() < Duration::from_millis(1000) {
            reads(&a);
            std::thread::sleep(Duration::from_millis(2));
        }
        rtts = h.join().unwrap();
    });
    rtts.sort();
    let p99 = rtts[rtts.len() * 99 / 100];
    let max = *rtts.last().unwrap();
    let c = qp.counters();
    eprintln!(
        "{} bystander round trips under READ storms: p50 {:?} p99 {p99:?} max {max:?}; \
         attacker's QP {c:?}",
        rtts.len(),
        rtts[rtts.len() / 2]
    );
    assert!(rtts.len() >= 50, "only {} round trips", rtts.len());
    // A few ms unloaded; scheduling on a loaded 2-core machine adds tens of ms. One 16 MiB
    // stream built in one pass (the engine before its READ budget) holds the device for
    // longer than these bounds each time, and the storm queues them back to back.
    assert!(
        p99 < Duration::from_millis(60) && max < Duration::from_millis(500),
        "bystander p99 {p99:?} max {max:?}"
    );
    assert_eq!(vqp2.counters().comp.retransmits, 0);
    assert_eq!(c.resp.naks_sent, 0, "{c:?}");
    assert!(c.resp.duplicates > 100, "{c:?}");
    // The storm ends; the peer's own connection is still served (after its backlog).
    // The storm ends; the peer's own connection is still served. Up to twice the depth of
    // 16 MiB streams are still queued: the peer waits for them to end (a new READ while its
    // originals are still being answered would exceed the depth, a fatal Invalid Request).
    drop(a);
    let mut a = Attacker::new(qp.qp_num());
    let end = Instant::now() + Duration::from_secs(10);
    while !a.collect(Duration::from_millis(100)).is_empty() {
        assert!(Instant::now() < end, "the READ responses never end");
    }
    a.send(
        read(EPSN + 4 * per, v.public.iova(), v.public.rkey(), 64),
        &[],
    );
    let out = a.collect(Duration::from_millis(500));
    assert!(
        out.iter()
            .any(|o| o.1 == Psn::new(EPSN + 4 * per) && o.3 == vec![PUBLIC; 64]),
        "no answer to a READ after the storm: {:?} {:?}",
        out.iter()
            .map(|o| (o.0, o.1, o.2))
            .take(8)
            .collect::<Vec<_>>(),
        qp.counters()
    );
    v.untouched();
}
