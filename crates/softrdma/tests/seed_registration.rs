//! Seed 000's registration requirements, over the wire on the real engine:
//!
//! - "RDMA registers and uses the memory the user specifies. That is why byte granularity and
//!   multiple redundant registrations are explicitly specified." — a 13-byte region at an odd
//!   address admits exactly its bytes; overlapping and identical registrations of the same
//!   memory are independent keys onto the same bytes, with their own rights and lifetimes.
//! - "for cluster applications like MPI there is no distinction between buffers used for
//!   inbound messages and outbound messages" — one region is at once the target of the
//!   peer's WRITEs and the source of the owner's WRITEs and SENDs.

use std::net::IpAddr;
use std::time::Duration;

use softrdma::verbs::*;

struct Dev {
    dev: Device,
    pd: Pd,
}

fn dev(ip: [u8; 4], port: u16) -> Dev {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = port;
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    Dev { dev, pd }
}

/// A connected pair (`a`'s QP, its CQ, `b`'s QP, its CQ).
fn pair(a: &Dev, b: &Dev) -> (Qp, Cq, Qp, Cq) {
    let (ca, cb) = (
        a.dev.create_cq(256, None).unwrap(),
        b.dev.create_cq(256, None).unwrap(),
    );
    let mut init = QpInitAttr::new(&ca);
    init.cap.max_send_wr = 128;
    init.cap.max_recv_wr = 128;
    let qa = a.pd.create_qp(&init).unwrap();
    let mut init = QpInitAttr::new(&cb);
    init.cap.max_send_wr = 128;
    init.cap.max_recv_wr = 128;
    let qb = b.pd.create_qp(&init).unwrap();
    let (pa, pb) = (random_psn(), random_psn());
    let mut attr = QpAttr {
        path_mtu: Mtu::Mtu1024,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        rnr_retry: 7,
        ..QpAttr::default()
    };
    attr.dest_qp_num = qb.qp_num();
    attr.sq_psn = pa;
    attr.rq_psn = pb;
    qa.connect(b.dev.addr(), &attr).unwrap();
    attr.dest_qp_num = qa.qp_num();
    attr.sq_psn = pb;
    attr.rq_psn = pa;
    qb.connect(a.dev.addr(), &attr).unwrap();
    (qa, ca, qb, cb)
}

fn one(cq: &Cq) -> WorkCompletion {
    let v = cq.wait(1, Duration::from_secs(10));
    assert_eq!(v.len(), 1, "no completion within 10 s");
    v[0]
}

/// From `p` (a fresh QP pair each time: an access error ends the connection), one RDMA
/// operation on `v`'s memory; its status, and the bytes a READ brought back.
fn rdma(v: &Dev, p: &Dev, op: WrOpcode, src: &[u8]) -> (WcStatus, Vec<u8>) {
    let (_qv, _cv, qp, cp) = pair(v, p);
    let local = p.pd.reg_buffer(src.to_vec(), Access::LOCAL_WRITE).unwrap();
    let sge = [local.sge(0, src.len() as u32)];
    qp.post_send(&SendWr::new(1, op).sg(&sge).flags(SendFlags::SIGNALED))
        .unwrap();
    let wc = one(&cp);
    (wc.status, local.to_vec().unwrap())
}

fn write(addr: u64, rkey: u32) -> WrOpcode {
    WrOpcode::RdmaWrite {
        remote_addr: addr,
        rkey,
    }
}

#[test]
fn byte_granular_overlapping_and_redundant_registrations_on_the_wire() {
    let v = dev([127, 0, 5, 1], 24921);
    let p = dev([127, 0, 5, 2], 24921);
    // The application's own 64 bytes; it registers the 13 at offset 3 twice (two independent
    // registrations of the same bytes, both writable), and all 64 read-only.
    let mut mem = Box::new([0xeeu8; 64]);
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` outlives every registration below (deregistered or dropped before it) and
    // is not touched by the test while the device may write it.
    let (r13, r64, twin) = unsafe {
        (
            v.pd.reg_mr(
                MemSource::raw(base.add(3), 13),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                None,
            )
            .unwrap(),
            v.pd.reg_mr(MemSource::raw(base, 64), Access::REMOTE_READ, None)
                .unwrap(),
            v.pd.reg_mr(
                MemSource::raw(base.add(3), 13),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                None,
            )
            .unwrap(),
        )
    };
    assert_ne!(
        r13.rkey(),
        twin.rkey(),
        "redundant registrations have their own keys"
    );
    assert_eq!(
        r13.iova(),
        base as u64 + 3,
        "byte granular: the region starts where asked"
    );

    // Exactly the 13 bytes: a WRITE of all of them succeeds.
    let (st, _) = rdma(&v, &p, write(r13.iova(), r13.rkey()), &[1u8; 13]);
    assert_eq!(st, WcStatus::Success);
    // One byte too many, one byte before, one byte after: refused, nothing placed.
    for (addr, len) in [(r13.iova(), 14), (r13.iova() - 1, 1), (r13.iova() + 13, 1)] {
        let (st, _) = rdma(&v, &p, write(addr, r13.rkey()), &vec![9u8; len]);
        assert_eq!(st, WcStatus::RemAccessErr, "WRITE {len} at {addr:#x}");
    }
    // The overlapping read-only registration reads the same bytes, and cannot write them.
    let (st, got) = rdma(
        &v,
        &p,
        WrOpcode::RdmaRead {
            remote_addr: r64.iova(),
            rkey: r64.rkey(),
        },
        &[0u8; 64],
    );
    assert_eq!(st, WcStatus::Success);
    let mut want = [0xeeu8; 64];
    want[3..16].fill(1);
    assert_eq!(got, want, "the READ through the overlapping region");
    let (st, _) = rdma(&v, &p, write(r64.iova(), r64.rkey()), &[9u8; 4]);
    assert_eq!(
        st,
        WcStatus::RemAccessErr,
        "a read-only overlapping registration"
    );

    // The twin works on its own, and outlives the first registration.
    let (st, _) = rdma(&v, &p, write(twin.iova() + 5, twin.rkey()), &[2u8; 8]);
    assert_eq!(st, WcStatus::Success);
    let key13 = r13.rkey();
    r13.dereg().map_err(|(_, e)| e).unwrap();
    let (st, _) = rdma(&v, &p, write(twin.iova(), key13), &[3u8; 1]);
    assert_eq!(st, WcStatus::RemAccessErr, "the deregistered key");
    let (st, _) = rdma(&v, &p, write(twin.iova(), twin.rkey()), &[4u8; 1]);
    assert_eq!(
        st,
        WcStatus::Success,
        "the twin after the other's deregistration"
    );
    drop((twin, r64));
    want[3] = 4;
    want[8..16].fill(2);
    assert_eq!(*mem, want, "exactly the bytes written, nothing around them");
}

#[test]
fn one_region_is_inbound_and_outbound_at_once() {
    const HALF: usize = 1 << 20;
    let v = dev([127, 0, 5, 3], 24922);
    let p = dev([127, 0, 5, 4], 24922);
    let (qv, cv, qp, cp) = pair(&v, &p);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // Each side's one region: its first half is written by the peer, its second half is the
    // source of the side's own WRITEs and SENDs to the peer.
    let fill = |k: u8| -> Vec<u8> {
        let mut b = vec![0u8; 2 * HALF];
        b[HALF..]
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i as u8) ^ k);
        b
    };
    let rv = v.pd.reg_buffer(fill(0x11), rw).unwrap();
    let rp = p.pd.reg_buffer(fill(0x77), rw).unwrap();
    // Receives for the SENDs land in the peer's first half too (its last 4 KiB).
    let inbox = |r: &Mr| [r.sge((HALF - 4096) as u64, 4096)];
    let (iv, ip) = (inbox(&rv), inbox(&rp));
    qv.post_recv(&RecvWr {
        wr_id: 50,
        sg_list: &iv,
    })
    .unwrap();
    qp.post_recv(&RecvWr {
        wr_id: 50,
        sg_list: &ip,
    })
    .unwrap();
    // Both directions at once: 15 WRITEs of 64 KiB each way, then a SEND each way.
    let chunk = 64 << 10;
    for (q, me, peer) in [(&qv, &rv, &rp), (&qp, &rp, &rv)] {
        for i in 0..15u64 {
            let sge = [me.sge(HALF as u64 + i * chunk, chunk as u32)];
            q.post_send(
                &SendWr::new(i, write(peer.iova() + i * chunk, peer.rkey()))
                    .sg(&sge)
                    .flags(SendFlags::NONE),
            )
            .unwrap();
        }
        let sge = [me.sge(HALF as u64, 4096)];
        q.post_send(
            &SendWr::new(99, WrOpcode::Send)
                .sg(&sge)
                .flags(SendFlags::SIGNALED),
        )
        .unwrap();
    }
    for (cq, who) in [(&cv, "victim"), (&cp, "peer")] {
        let mut wcs = cq.wait(2, Duration::from_secs(10));
        wcs.sort_by_key(|w| w.wr_id);
        assert_eq!(wcs.len(), 2, "{who}: {wcs:?}");
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{who}: {wcs:?}"
        );
        assert_eq!(wcs[0].wr_id, 50, "{who}: the receive");
        assert_eq!(wcs[1].wr_id, 99, "{who}: the SEND");
    }
    for (r, k, who) in [(&rv, 0x77u8, "victim"), (&rp, 0x11u8, "peer")] {
        let b = r.to_vec().unwrap();
        let peer = fill(k);
        assert!(
            b[..15 * chunk as usize] == peer[HALF..HALF + 15 * chunk as usize],
            "{who}: the WRITEs into its first half"
        );
        assert!(
            b[HALF - 4096..HALF] == peer[HALF..HALF + 4096],
            "{who}: the SEND"
        );
        assert!(
            b[HALF..] == fill(k ^ 0x11 ^ 0x77)[HALF..],
            "{who}: its own half, unchanged"
        );
    }
}
