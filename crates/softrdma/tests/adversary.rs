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
    BthRepr, HeaderRepr, IcrcContext, IpHeader, NakCode, OpKind, Opcode, Packet, Psn, RethRepr,
    Syndrome,
};

const PORT: u16 = 24860;
const VICTIM: [u8; 4] = [127, 0, 6, 2];
const ATTACKER: [u8; 4] = [127, 0, 6, 3];
const BYSTANDER: [u8; 4] = [127, 0, 6, 1];
const EPSN: u32 = 90_000;
const SECRET: u8 = 0x5e;
const PUBLIC: u8 = 0xa0;
const ATTACKER_QPN: u32 = 0x77;

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
        let port =
            UdpPort::bind(SocketAddr::from((ATTACKER, PORT)), PortOptions::default()).unwrap();
        port.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        Attacker {
            port,
            victim: SocketAddr::from((VICTIM, PORT)),
            qpn: victim_qpn,
            rx: RxBatch::new(64, 9000),
        }
    }

    fn send(&self, mut hdr: HeaderRepr, payload: &[u8]) {
        hdr.bth.dest_qp = self.qpn;
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        let ctx = IcrcContext {
            ip: IpHeader::V4 {
                src: Ipv4Addr::from(ATTACKER),
                dst: Ipv4Addr::from(VICTIM),
                id: 0,
                dont_fragment: true,
            },
            src_port: PORT,
            dst_port: PORT,
        };
        let mut buf = vec![0u8; 9000];
        let n = pkt.emit(&ctx, &mut buf).unwrap();
        let mut tx = TxBatch::new(1, n);
        assert!(tx.push(self.victim, &buf[..n], n as u16));
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
    let victim = device(VICTIM);
    let pd = victim.alloc_pd().unwrap();
    let cq = victim.create_cq(64, None).unwrap();
    let public = pd.reg_buffer(vec![PUBLIC; 8192], all()).unwrap();
    let secret = pd.reg_buffer(vec![SECRET; 8192], all()).unwrap();
    let qp = pd.create_qp(&QpInitAttr::new(&cq)).unwrap();
    let attr = |dest: u32, rq: u32, sq: u32| QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: all(),
        dest_qp_num: dest,
        rq_psn: rq,
        sq_psn: sq,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpAttr::default()
    };
    qp.connect(IpAddr::from(ATTACKER), &attr(ATTACKER_QPN, EPSN, 1))
        .unwrap();

    // The bystander's connection to the same device.
    let bdev = device(BYSTANDER);
    let bpd = bdev.alloc_pd().unwrap();
    let bcq = bdev.create_cq(64, None).unwrap();
    let bqp = bpd.create_qp(&QpInitAttr::new(&bcq)).unwrap();
    let vqp2 = pd.create_qp(&QpInitAttr::new(&cq)).unwrap();
    let landing = pd.reg_buffer(vec![0u8; 64], all()).unwrap();
    vqp2.connect(bdev.addr(), &attr(bqp.qp_num(), 500, 700))
        .unwrap();
    bqp.connect(victim.addr(), &attr(vqp2.qp_num(), 700, 500))
        .unwrap();
    let by = Bystander {
        src: bpd.reg_buffer(vec![1u8; 8], Access::LOCAL_WRITE).unwrap(),
        dst_addr: landing.iova(),
        dst_rkey: landing.rkey(),
        dev: bdev,
        cq: bcq,
        qp: bqp,
    };
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
