//! "Tear all the connections using it down" (seed 001) on the real engine: a raw region is
//! unmapped while a peer's multi-packet WRITE streams into it, a peer's READ streams out of
//! it, a local SEND from it waits for the peer (RNR) and a receive posted into it waits.
//!
//! Every QP using the region must be in the error state at the invalidation itself, not
//! when it next touches the region: the application gets `RegionInvalidated` and one
//! `QpAccessError` per QP, the peers' WRITE and READ complete with `REM_ACCESS_ERR` (not a
//! retry timeout), the local WRs are flushed, and an unrelated QP on the same devices keeps
//! working.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrdma::verbs::*;

/// The WRITE's bytes (the first part of the region).
const WLEN: usize = 64 << 20;
/// The READ's bytes (the rest): long enough to be under way still when the WRITE has begun.
const RLEN: usize = 256 << 20;
const LEN: usize = WLEN + RLEN;

struct Dev {
    dev: Device,
    pd: Pd,
}

fn dev(ip: [u8; 4], port: u16, mode: PollMode) -> Dev {
    let mut cfg = DeviceConfig::new(IpAddr::from(ip));
    cfg.port = port;
    cfg.mode = mode;
    cfg.pin_mode = PinMode::OnDemand;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    Dev { dev, pd }
}

struct Pair {
    /// The victim's end.
    v: Qp,
    vcq: Cq,
    /// The peer's end.
    p: Qp,
    pcq: Cq,
}

fn pair(v: &Dev, p: &Dev) -> Pair {
    let (vcq, pcq) = (
        v.dev.create_cq(64, None).unwrap(),
        p.dev.create_cq(64, None).unwrap(),
    );
    let vq = v.pd.create_qp(&QpInitAttr::new(&vcq)).unwrap();
    let pq = p.pd.create_qp(&QpInitAttr::new(&pcq)).unwrap();
    let (a, b) = (random_psn(), random_psn());
    let mut attr = QpAttr {
        path_mtu: Mtu::Mtu4096,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..QpAttr::default()
    };
    attr.dest_qp_num = pq.qp_num();
    attr.sq_psn = a;
    attr.rq_psn = b;
    vq.connect(p.dev.addr(), &attr).unwrap();
    attr.dest_qp_num = vq.qp_num();
    attr.sq_psn = b;
    attr.rq_psn = a;
    pq.connect(v.dev.addr(), &attr).unwrap();
    Pair {
        v: vq,
        vcq,
        p: pq,
        pcq,
    }
}

fn state(q: &Qp) -> QpState {
    q.query().0
}

/// An anonymous mapping of `len` bytes, filled with `fill`.
fn map(len: usize, fill: u8) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is `len` bytes, readable and writable, and the test's own.
    unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
    p.cast()
}

fn one(cq: &Cq, what: &str) -> WorkCompletion {
    let v = cq.wait(1, Duration::from_secs(10));
    assert_eq!(v.len(), 1, "{what}: no completion within 10 s");
    v[0]
}

/// The two tests take turns (each moves 128 MiB on a small machine).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn munmap_tears_down_every_qp_using_the_region_at_once_blocking() {
    munmap_tears_down_every_qp_using_the_region(24911, PollMode::Blocking);
}

#[test]
fn munmap_tears_down_every_qp_using_the_region_at_once_busy_poll() {
    munmap_tears_down_every_qp_using_the_region(24912, PollMode::BusyPoll);
}

fn munmap_tears_down_every_qp_using_the_region(port: u16, mode: PollMode) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let v = dev([127, 0, 4, 1], port, mode);
    let p = dev([127, 0, 4, 2], port, mode);

    // The victim's raw region: the WRITE lands in its first half, the READ reads its second.
    let base = map(LEN, 0);
    // SAFETY: the second half of the mapping made above.
    unsafe { std::ptr::write_bytes(base.add(WLEN), 0x5a, RLEN) };
    // SAFETY: the test keeps the mapping until it unmaps it on purpose, and maps nothing
    // else there afterwards.
    let src = unsafe { MemSource::raw(base, LEN) };
    let r =
        v.pd.reg_mr(
            src,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            None,
        )
        .unwrap();
    // An unrelated region and its QP.
    let other =
        v.pd.reg_buffer(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();

    let (wr_pair, rd_pair, send_pair, recv_pair, bystander) = (
        pair(&v, &p),
        pair(&v, &p),
        pair(&v, &p),
        pair(&v, &p),
        pair(&v, &p),
    );
    let wsrc =
        p.pd.reg_buffer(vec![0xc3u8; WLEN], Access::LOCAL_WRITE)
            .unwrap();
    let rdst =
        p.pd.reg_buffer(vec![0u8; RLEN], Access::LOCAL_WRITE)
            .unwrap();
    let ping = p.pd.reg_buffer(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    let ping_once = |id: u64| {
        let sge = [ping.sge(0, 64)];
        let wr = SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: other.iova(),
                rkey: other.rkey(),
            },
        )
        .sg(&sge);
        bystander.p.post_send(&wr).unwrap();
        one(&bystander.pcq, "bystander WRITE")
    };
    assert_eq!(ping_once(1).status, WcStatus::Success);

    // A SEND from the region that waits: the peer has no receive posted (RNR, retried
    // forever), and a receive posted into the region.
    let sge = [r.sge(0, 4096)];
    send_pair
        .v
        .post_send(&SendWr::new(10, WrOpcode::Send).sg(&sge))
        .unwrap();
    let sge = [r.sge(4096, 4096)];
    recv_pair
        .v
        .post_recv(&RecvWr {
            wr_id: 11,
            sg_list: &sge,
        })
        .unwrap();

    // The peer's READ of the second half and WRITE into the first half, both one message.
    let sge = [rdst.sge(0, RLEN as u32)];
    let wr = SendWr::new(
        20,
        WrOpcode::RdmaRead {
            remote_addr: r.iova() + WLEN as u64,
            rkey: r.rkey(),
        },
    )
    .sg(&sge);
    rd_pair.p.post_send(&wr).unwrap();
    let sge = [wsrc.sge(0, (WLEN - 8192) as u32)];
    let wr = SendWr::new(
        21,
        WrOpcode::RdmaWrite {
            remote_addr: r.iova() + 8192,
            rkey: r.rkey(),
        },
    )
    .sg(&sge);
    wr_pair.p.post_send(&wr).unwrap();

    let coh = v.dev.mem().region_coherence(r.lkey()).unwrap();
    assert!(
        coh.watched && coh.checked_copy,
        "the region is not watched ({:?}, {coh:?})",
        v.dev.mem().watch_status()
    );
    // Unmap once both messages are under way: the WRITE's first bytes are in the region and
    // the READ's first bytes at the peer.
    let t0 = Instant::now();
    let mut first = [0u8; 1];
    loop {
        // SAFETY: the region's mapping is still there; a racy byte read of memory the engine
        // writes is what this polls for.
        let written = unsafe { std::ptr::read_volatile(base.add(8192)) } != 0;
        rdst.read(0, &mut first).unwrap();
        if written && first[0] != 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the WRITE and the READ did not start within 10 s"
        );
        std::thread::yield_now();
    }
    // SAFETY: the test's own mapping; nothing but the registration refers to it.
    assert_eq!(unsafe { libc::munmap(base.cast(), LEN) }, 0);

    // The events: the region, then each QP that used it.
    let users = [&wr_pair, &rd_pair, &send_pair, &recv_pair].map(|x| x.v.qp_num());
    let mut region = Vec::new();
    let mut torn = Vec::new();
    let t1 = Instant::now();
    let unmapped = (r.lkey(), InvalidationCause::Unmapped);
    while (torn.len() < users.len() || !region.contains(&unmapped))
        && t1.elapsed() < Duration::from_secs(5)
    {
        match v.dev.get_async_event(Duration::from_millis(100)) {
            Some(AsyncEvent::RegionInvalidated { lkey, cause }) => region.push((lkey, cause)),
            Some(AsyncEvent::QpAccessError { qp_num, lkey }) => {
                assert_eq!(lkey, r.lkey());
                torn.push(qp_num);
            }
            Some(AsyncEvent::QpFatal { .. }) | None => {}
        }
    }
    // Unmapped from the watcher; an access that met the vanished pages before the watcher
    // read its event may report the region first (Faulted).
    assert!(
        region.contains(&unmapped)
            && region.iter().all(|&(k, c)| k == r.lkey()
                && matches!(c, InvalidationCause::Unmapped | InvalidationCause::Faulted)),
        "RegionInvalidated events: {region:?}"
    );
    eprintln!(
        "events after {:?}: regions {region:?}, QPs {torn:?} of WRITE {} READ {} SEND {} recv {}; mem {:?}",
        t1.elapsed(),
        users[0],
        users[1],
        users[2],
        users[3],
        v.dev.mem_stats()
    );
    torn.sort();
    let mut want = users.to_vec();
    want.sort();
    assert_eq!(
        torn, want,
        "QPs torn down (the WRITE's, the READ's, the SEND's, the receive's)"
    );
    // At once: all four are in the error state already, whatever traffic comes next.
    for (q, what) in [
        (&wr_pair.v, "WRITE target"),
        (&rd_pair.v, "READ source"),
        (&send_pair.v, "SEND source"),
        (&recv_pair.v, "receive buffer"),
    ] {
        assert_eq!(state(q), QpState::Err, "the QP of the {what}");
    }
    assert_eq!(
        v.dev
            .counters()
            .access_violations
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );

    // The peers' messages end with an access error, not a retry timeout.
    let w = one(&wr_pair.pcq, "peer WRITE");
    assert_eq!((w.wr_id, w.status), (21, WcStatus::RemAccessErr), "{w:?}");
    let w = one(&rd_pair.pcq, "peer READ");
    assert_eq!((w.wr_id, w.status), (20, WcStatus::RemAccessErr), "{w:?}");
    // The local WRs are flushed.
    // The SEND, retried after RNR NAKs, may have met the vanished memory itself first.
    let w = one(&send_pair.vcq, "local SEND");
    assert!(
        w.wr_id == 10 && matches!(w.status, WcStatus::WrFlushErr | WcStatus::LocProtErr),
        "{w:?}"
    );
    let w = one(&recv_pair.vcq, "local receive");
    assert_eq!((w.wr_id, w.status), (11, WcStatus::WrFlushErr), "{w:?}");

    // The bystander is untouched.
    assert_eq!(state(&bystander.v), QpState::Rts);
    for id in 2..12 {
        assert_eq!(
            ping_once(id).status,
            WcStatus::Success,
            "bystander WRITE {id}"
        );
    }
    while let Some(ev) = v.dev.get_async_event(Duration::ZERO) {
        assert!(
            matches!(ev, AsyncEvent::RegionInvalidated { lkey, .. } if lkey == r.lkey()),
            "unexpected event {ev:?}"
        );
    }
}
