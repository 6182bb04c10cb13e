//! Suspend/resume with concurrent accessors: suspend waits for accesses in flight, no access
//! starts while suspended, and resume with a new backing sends later accesses there.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softrdma::mem::*;

const RW: Access = Access::REMOTE_WRITE;

fn table() -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap()
}

fn peek(p: *const u8) -> u8 {
    // SAFETY: `p` points into a mapping the test keeps alive; volatile because another thread
    // may be writing it.
    unsafe { core::ptr::read_volatile(p) }
}

#[test]
fn suspend_waits_for_the_access_in_flight() {
    const LEN: usize = 128 << 20;
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let c = AccessCtx { pd, qpn: 1 };
    let mut mem = memmap2::MmapMut::map_anon(LEN).unwrap();
    let base = mem.as_mut_ptr();
    // SAFETY: `mem` outlives the region (deregistered at the end of the test).
    let mr = t
        .reg_mr(
            pd,
            unsafe { MemSource::raw(base, LEN) },
            Access::LOCAL_WRITE | RW,
            None,
        )
        .unwrap();
    let src = vec![0xabu8; LEN];
    let mut caught_in_flight = false;
    for round in 0..3u8 {
        let done = AtomicBool::new(false);
        let fill = vec![round.wrapping_add(1); LEN];
        let data = if round == 0 { &src } else { &fill };
        let expect = data[0];
        std::thread::scope(|s| {
            s.spawn(|| {
                t.write(c, mr.rkey, mr.iova, data, RW).unwrap();
                done.store(true, Ordering::SeqCst);
            });
            let deadline = Instant::now() + Duration::from_secs(5);
            while peek(base) != expect && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            let in_flight = !done.load(Ordering::SeqCst);
            t.suspend_mr(mr.lkey).unwrap();
            // Returned only after the copy ended: its last byte is there, the writer is done
            // (or about to set its flag), and new accesses are refused.
            // SAFETY: the last byte of the mapping.
            assert_eq!(peek(unsafe { base.add(LEN - 1) }), expect);
            assert_eq!(
                t.write(c, mr.rkey, mr.iova, &[0], RW),
                Err(AccessError::Suspended(mr.rkey))
            );
            caught_in_flight |= in_flight;
        });
        t.resume_mr(mr.lkey, None).unwrap();
        if caught_in_flight {
            break;
        }
    }
    assert!(
        caught_in_flight,
        "never caught a write in flight (machine too fast?)"
    );
    t.dereg_mr(mr.lkey).unwrap();
    drop(mem);
}

#[test]
fn concurrent_accessors_suspend_resume_with_new_backing() {
    const LEN: usize = 4096;
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mut old = memmap2::MmapMut::map_anon(LEN).unwrap();
    let mut new = memmap2::MmapMut::map_anon(LEN).unwrap();
    let (old_p, new_p) = (old.as_mut_ptr(), new.as_mut_ptr());
    // SAFETY: `old` outlives its use by the region (replaced by `new` on resume, handed back
    // as nothing since raw), and `new` outlives the region.
    let mr = t
        .reg_mr(
            pd,
            unsafe { MemSource::raw(old_p, LEN) },
            Access::LOCAL_WRITE | RW,
            Some(0x7000_0000),
        )
        .unwrap();
    // 0 running, 1 surely suspended, 2 resuming or resumed.
    let phase = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let (oks, suspended, violations) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let ok_after_resume = AtomicU64::new(0);
    std::thread::scope(|s| {
        for th in 0..2u64 {
            let (phase, stop, oks, suspended, violations, ok_after_resume) = (
                &phase,
                &stop,
                &oks,
                &suspended,
                &violations,
                &ok_after_resume,
            );
            let t = &t;
            s.spawn(move || {
                let c = AccessCtx { pd, qpn: th as u32 };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && n < 50_000_000 {
                    n += 1;
                    let p0 = phase.load(Ordering::SeqCst);
                    let v = (n as u8).max(1);
                    let r = t.write(c, mr.rkey, 0x7000_0000 + th * 2048, &[v; 2048], RW);
                    let p1 = phase.load(Ordering::SeqCst);
                    match r {
                        Ok(()) => {
                            oks.fetch_add(1, Ordering::Relaxed);
                            if p0 == 1 && p1 == 1 {
                                violations.fetch_add(1, Ordering::Relaxed);
                            }
                            if p0 == 2 {
                                ok_after_resume.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(AccessError::Suspended(k)) if k == mr.rkey => {
                            suspended.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while oks.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        t.suspend_mr(mr.lkey).unwrap();
        phase.store(1, Ordering::SeqCst);
        let snapshot = old.to_vec();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(&old[..], &snapshot[..], "memory changed while suspended");
        // Migrate: copy the contents, then resume on the new memory (same IOVA, same keys).
        new.copy_from_slice(&snapshot);
        phase.store(2, Ordering::SeqCst);
        // SAFETY: `new` outlives the region.
        let back = t
            .resume_mr(mr.lkey, Some(unsafe { MemSource::raw(new_p, LEN) }))
            .unwrap();
        assert!(back.is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        while ok_after_resume.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(
            &old[..],
            &snapshot[..],
            "a write reached the old backing after resume"
        );
    });
    assert_eq!(
        violations.load(Ordering::Relaxed),
        0,
        "an access ran while suspended"
    );
    assert!(
        suspended.load(Ordering::Relaxed) > 0,
        "accessors never saw the suspension"
    );
    assert!(ok_after_resume.load(Ordering::Relaxed) >= 1000);
    let info = t.query_mr(mr.lkey).unwrap();
    assert_eq!((info.iova, info.addr), (0x7000_0000, new_p as usize));
    let mut out = [0u8; 1];
    t.read(
        AccessCtx { pd, qpn: 0 },
        mr.lkey,
        0x7000_0000,
        &mut out,
        Access::NONE,
    )
    .unwrap();
    assert_eq!(out[0], new[0]);
    assert_ne!(new[..], [0u8; LEN][..], "no write reached the new backing");
    t.dereg_mr(mr.lkey).unwrap();
}

#[test]
fn resume_rules() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![1u8; 64]),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    assert!(matches!(
        t.resume_mr(mr.lkey, None),
        Err(RegError {
            error: MemError::InvalidState { .. },
            ..
        })
    ));
    t.suspend_mr(mr.lkey).unwrap();
    t.suspend_mr(mr.lkey).unwrap();
    // A new backing must have the region's length; refused sources come back.
    let e = t
        .resume_mr(mr.lkey, Some(MemSource::owned(vec![0u8; 65])))
        .unwrap_err();
    assert_eq!(e.offered.unwrap().len(), 65);
    let old: Vec<u8> = t
        .resume_mr(mr.lkey, Some(MemSource::owned(vec![2u8; 64])))
        .unwrap()
        .downcast()
        .unwrap();
    assert_eq!(old, vec![1u8; 64]);
    let now: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(now, vec![2u8; 64]);
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![1u8; 64]),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    t.invalidate_mr(mr.lkey).unwrap();
    assert!(matches!(
        t.suspend_mr(mr.lkey),
        Err(MemError::InvalidState { .. })
    ));
}
