//! Registration coherence: the application unmaps, moves or discards registered raw memory.
//! The process never crashes; accesses through the region's key fail with `Invalidated`
//! (watcher on) or `Fault` (watcher off); other regions are unaffected; a region with the
//! `Follow` policy follows its memory through `mremap`.
//!
//! Every step that could block (an unmap waiting for the watcher) runs under a timeout.
//!
//! The tests run one at a time ([`serial`]): they unmap memory on purpose, and a test running
//! alongside could map new memory at a freed address that a region of another test still
//! names (which the contract of `MemSource::raw` excludes).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use softrdma::mem::*;

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
const ALL: Access = Access(RW.0 | Access::REMOTE_ATOMIC.0 | Access::MW_BIND.0);
const LIMIT: Duration = Duration::from_secs(10);

fn table(watch: WatchMode) -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        watch,
        ..MemConfig::default()
    })
    .unwrap()
}

/// Run `f` on another thread; fail the test if it does not finish within `LIMIT`.
fn bounded<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT)
        .unwrap_or_else(|_| panic!("{what} did not finish within {LIMIT:?}"))
}

/// A fresh anonymous mapping of `len` bytes (its address as an integer, so it can cross threads).
fn map(len: usize) -> usize {
    // SAFETY: a new private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

fn unmap(addr: usize, len: usize) {
    bounded("munmap", move || {
        // SAFETY: unmaps a mapping the test created and no Rust reference points into.
        assert_eq!(unsafe { libc::munmap(addr as *mut libc::c_void, len) }, 0);
    });
}

/// Unmap, then at once reserve the hole with an inaccessible mapping, so that no later
/// allocation of the process (a thread's signal stack, say) reuses the address while a test
/// checks that accesses to it fault.
fn unmap_fenced(addr: usize, len: usize) {
    bounded("munmap + fence", move || {
        // SAFETY: unmaps a mapping the test created, then maps an inaccessible placeholder
        // at the same (now free) addresses, refusing to replace anything mapped meanwhile.
        unsafe {
            assert_eq!(libc::munmap(addr as *mut libc::c_void, len), 0);
            let p = libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            assert_eq!(p as usize, addr, "the freed address was reused at once");
        }
    });
}

/// Move `len` bytes at `from` to a new address with `mremap`; returns the new address.
fn remap(from: usize, len: usize) -> usize {
    // A placeholder mapping reserves a target far from `from`.
    let target = map(len * 2);
    bounded("mremap", move || {
        // SAFETY: moves a mapping the test owns onto a placeholder the test owns.
        let p = unsafe {
            libc::mremap(
                from as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                target as *mut libc::c_void,
            )
        };
        assert_eq!(p as usize, target, "mremap failed");
        p as usize
    })
}

fn raw(addr: usize, len: usize) -> MemSource {
    // SAFETY: the tests keep every mapping they register alive until they unmap it on purpose,
    // which is exactly what these tests exercise, and never map other memory there meanwhile.
    unsafe { MemSource::raw(addr as *mut u8, len) }
}

fn peek(addr: usize) -> u8 {
    // SAFETY: `addr` is inside a live mapping of the test.
    unsafe { core::ptr::read_volatile(addr as *const u8) }
}

/// Hold for the whole test (see the module documentation).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn setup(watch: WatchMode) -> (MemoryTable, u32, AccessCtx) {
    let t = table(watch);
    let pd = t.alloc_pd().unwrap();
    (t, pd, AccessCtx { pd, qpn: 1 })
}

#[test]
fn munmap_invalidates_and_leaves_other_regions_alone() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 4 * page_size();
    let (a, b) = (map(len), map(len));
    let ma = t.reg_mr(pd, raw(a, len), ALL, None).unwrap();
    let mb = t.reg_mr(pd, raw(b, len), ALL, None).unwrap();
    assert!(matches!(t.watch_status(), WatchStatus::Active { .. }));
    let rc = t.region_coherence(ma.lkey).unwrap();
    assert!(rc.watched);
    assert_eq!((rc.state, rc.cause), (RegionState::Active, None));
    t.suspend_mr(ma.lkey).unwrap();
    assert_eq!(
        t.region_coherence(ma.lkey).unwrap().state,
        RegionState::Suspended
    );
    t.resume_mr(ma.lkey, None).unwrap();
    t.write(c, ma.rkey, ma.iova, &[7; 64], RW).unwrap();
    unmap(a, len);
    let rc = t.region_coherence(ma.lkey).unwrap();
    assert_eq!(
        (rc.state, rc.cause),
        (RegionState::Invalidated, Some(InvalidationCause::Unmapped))
    );
    // The unmapping thread waited for the watcher: the region is invalidated by now.
    let inv = AccessError::Invalidated(ma.rkey);
    assert_eq!(t.write(c, ma.rkey, ma.iova, &[1; 64], RW), Err(inv));
    assert_eq!(t.read(c, ma.rkey, ma.iova, &mut [0; 64], RW), Err(inv));
    let op = AtomicOp::FetchAdd { add: 1 };
    assert_eq!(t.atomic(c, ma.rkey, ma.iova, op), Err(inv));
    assert_eq!(
        t.take_invalidations(),
        vec![Invalidation {
            lkey: ma.lkey,
            cause: InvalidationCause::Unmapped
        }]
    );
    // The other region works.
    t.write(c, mb.rkey, mb.iova, &[9; 64], RW).unwrap();
    assert_eq!(peek(b + 63), 9);
    assert_eq!(t.atomic(c, mb.rkey, mb.iova, op), Ok(0x0909_0909_0909_0909));
    let s = t.stats();
    assert_eq!((s.watch_invalidations, s.watched_regions), (1, 1));
    t.dereg_mr(ma.lkey).unwrap();
    t.dereg_mr(mb.lkey).unwrap();
    assert_eq!(t.stats().watched_regions, 0);
    unmap(b, len);
}

#[test]
fn partial_munmap_invalidates() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let ps = page_size();
    let a = map(4 * ps);
    // Byte-granular region from the middle of page 0 to the middle of page 3.
    let m = t.reg_mr(pd, raw(a + 100, 3 * ps), RW, None).unwrap();
    unmap(a + 2 * ps, ps);
    assert_eq!(
        t.write(c, m.rkey, m.iova, &[1], RW),
        Err(AccessError::Invalidated(m.rkey))
    );
    t.dereg_mr(m.lkey).unwrap();
    unmap(a, 2 * ps);
    unmap(a + 3 * ps, ps);
}

#[test]
fn without_the_watcher_checked_copies_fail_with_fault() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::Off);
    assert_eq!(t.watch_status(), WatchStatus::Off);
    assert!(t.checked_copy());
    let len = 2 * page_size();
    let (a, b) = (map(len), map(len));
    let ma = t.reg_mr(pd, raw(a, len), ALL, None).unwrap();
    let mb = t.reg_mr(pd, raw(b, len), ALL, None).unwrap();
    unmap_fenced(a, len);
    let fault = AccessError::Fault(ma.rkey);
    for _ in 0..3 {
        assert_eq!(t.write(c, ma.rkey, ma.iova, &[1; 64], RW), Err(fault));
        assert_eq!(
            t.read(c, ma.rkey, ma.iova + 8, &mut [0; 4096], RW),
            Err(fault)
        );
        let op = AtomicOp::CompareSwap {
            compare: 0,
            swap: 1,
        };
        assert_eq!(t.atomic(c, ma.rkey, ma.iova, op), Err(fault));
    }
    // Reported once, counted every time.
    assert_eq!(
        t.take_invalidations(),
        vec![Invalidation {
            lkey: ma.lkey,
            cause: InvalidationCause::Faulted
        }]
    );
    assert_eq!(t.stats().access_faults, 9);
    t.write(c, mb.rkey, mb.iova, &[9; 64], RW).unwrap();
    assert_eq!(peek(b), 9);
    t.dereg_mr(ma.lkey).unwrap();
    t.dereg_mr(mb.lkey).unwrap();
    unmap(b, len);
    unmap(a, len);
}

/// Copies in flight while the memory goes: each either completes or fails; nothing crashes.
fn unmap_during_copies(watch: WatchMode) {
    const LEN: usize = 16 << 20;
    let (t, pd, c) = setup(watch);
    let t = Arc::new(t);
    let a = map(LEN);
    let m = t.reg_mr(pd, raw(a, LEN), RW, None).unwrap();
    let started = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (t, started) = (Arc::clone(&t), Arc::clone(&started));
            std::thread::spawn(move || {
                let mut buf = vec![w as u8 + 1; LEN];
                let deadline = Instant::now() + LIMIT;
                while Instant::now() < deadline {
                    let r = if w == 0 {
                        t.write(c, m.rkey, m.iova, &buf, RW)
                    } else {
                        t.read(c, m.rkey, m.iova, &mut buf, RW)
                    };
                    started.fetch_add(1, Ordering::SeqCst);
                    match r {
                        // `Suspended`: faulted while the watcher had the event unread; retry.
                        Ok(()) | Err(AccessError::Suspended(_)) => {}
                        Err(AccessError::Fault(_) | AccessError::Invalidated(_)) => return r,
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                Ok(())
            })
        })
        .collect();
    let deadline = Instant::now() + LIMIT;
    while started.load(Ordering::SeqCst) < 4 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    unmap_fenced(a, LEN);
    for w in workers {
        let r = w.join().unwrap();
        assert!(r.is_err(), "an access kept succeeding after the unmap");
    }
    t.dereg_mr(m.lkey).unwrap();
    unmap(a, LEN);
}

#[test]
fn unmap_during_copies_watcher_off() {
    let _s = serial();
    unmap_during_copies(WatchMode::Off);
}

#[test]
fn unmap_during_copies_watcher_on() {
    let _s = serial();
    unmap_during_copies(WatchMode::On);
}

#[test]
fn mremap_follow_keeps_iova_and_keys() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 4 * page_size();
    let a = map(len);
    let src = raw(a, len).remap_policy(RemapPolicy::Follow);
    let m = t.reg_mr(pd, src, RW, None).unwrap();
    assert_eq!(
        t.region_coherence(m.lkey).unwrap().remap,
        RemapPolicy::Follow
    );
    t.write(c, m.rkey, m.iova + 10, b"before", RW).unwrap();
    let n = remap(a, len);
    let q = t.query_mr(m.lkey).unwrap();
    assert_eq!(
        (q.addr, q.iova, q.lkey, q.rkey),
        (n, m.iova, m.lkey, m.rkey)
    );
    // The old bytes moved with the mapping, and new accesses reach the new address.
    let mut out = [0u8; 6];
    t.read(c, m.rkey, m.iova + 10, &mut out, RW).unwrap();
    assert_eq!(&out, b"before");
    t.write(c, m.rkey, m.iova + 100, b"after", RW).unwrap();
    assert_eq!(peek(n + 100), b'a');
    assert!(t.take_invalidations().is_empty());
    assert_eq!(t.stats().remaps_followed, 1);
    // Still watched at its new address.
    assert!(t.region_coherence(m.lkey).unwrap().watched);
    unmap(n, len);
    assert_eq!(
        t.write(c, m.rkey, m.iova, &[1], RW),
        Err(AccessError::Invalidated(m.rkey))
    );
    t.dereg_mr(m.lkey).unwrap();
}

#[test]
fn mremap_follow_in_pinned_mode_moves_the_accounting() {
    let _s = serial();
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::Pinned,
        remap_policy: RemapPolicy::Follow,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let c = AccessCtx { pd, qpn: 1 };
    let len = 4 * page_size();
    let a = map(len);
    let m = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    let pinned = t.stats().pinned_bytes;
    assert_eq!(pinned, len as u64);
    let n = remap(a, len);
    assert_eq!(t.query_mr(m.lkey).unwrap().addr, n);
    assert_eq!(t.stats().pinned_bytes, pinned);
    t.write(c, m.rkey, m.iova, &[5; 16], RW).unwrap();
    assert_eq!(peek(n + 15), 5);
    t.dereg_mr(m.lkey).unwrap();
    assert_eq!(t.stats().pinned_bytes, 0);
    unmap(n, len);
}

#[test]
fn mremap_invalidate_policy_and_partial_moves_invalidate() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 4 * page_size();
    let (a, b) = (map(len), map(len));
    let inv = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    let part = t
        .reg_mr(pd, raw(b, len).remap_policy(RemapPolicy::Follow), RW, None)
        .unwrap();
    let na = remap(a, len);
    // Only the second half of `b` moves: a region cannot follow half of itself.
    let nb = remap(b + len / 2, len / 2);
    for m in [inv, part] {
        assert_eq!(
            t.write(c, m.rkey, m.iova, &[1], RW),
            Err(AccessError::Invalidated(m.rkey))
        );
    }
    let got = t.take_invalidations();
    for m in [inv, part] {
        assert!(got.contains(&Invalidation {
            lkey: m.lkey,
            cause: InvalidationCause::Remapped
        }));
    }
    t.dereg_mr(inv.lkey).unwrap();
    t.dereg_mr(part.lkey).unwrap();
    unmap(na, len);
    unmap(nb, len / 2);
    unmap(b, len / 2);
}

#[test]
fn set_remap_policy_at_run_time() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = page_size();
    let a = map(len);
    let m = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    assert_eq!(
        t.region_coherence(m.lkey).unwrap().remap,
        RemapPolicy::Invalidate
    );
    t.set_remap_policy(m.lkey, RemapPolicy::Follow).unwrap();
    let n = remap(a, len);
    t.write(c, m.rkey, m.iova, &[3], RW).unwrap();
    assert_eq!(peek(n), 3);
    t.dereg_mr(m.lkey).unwrap();
    unmap(n, len);
}

/// `MADV_DONTNEED` on registered pages: the watcher invalidates the region before the kernel
/// frees the pages. A writer keeps writing through the key; once `madvise` returns, the
/// discarded pages must read as zero (no write landed after the discard) and the key fails.
#[test]
fn madvise_dontneed_invalidates_before_the_pages_are_freed() {
    let _s = serial();
    const LEN: usize = 1 << 20;
    let (t, pd, c) = setup(WatchMode::On);
    let t = Arc::new(t);
    for round in 0..5 {
        let a = map(LEN);
        let m = t.reg_mr(pd, raw(a, LEN), RW, None).unwrap();
        let writes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (t, writes, stop) = (Arc::clone(&t), Arc::clone(&writes), Arc::clone(&stop));
            std::thread::spawn(move || {
                let buf = vec![0xab; 64 << 10];
                let deadline = Instant::now() + LIMIT;
                let mut off = 0u64;
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    match t.write(c, m.rkey, m.iova + off, &buf, RW) {
                        Ok(()) => writes.fetch_add(1, Ordering::SeqCst),
                        Err(AccessError::Invalidated(_)) => return,
                        Err(e) => panic!("unexpected {e}"),
                    };
                    off = (off + buf.len() as u64) % LEN as u64;
                }
            })
        };
        let deadline = Instant::now() + LIMIT;
        while writes.load(Ordering::SeqCst) < 8 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        bounded("madvise", move || {
            // SAFETY: discards pages of a mapping the test owns.
            let rc = unsafe { libc::madvise(a as *mut libc::c_void, LEN, libc::MADV_DONTNEED) };
            assert_eq!(rc, 0);
        });
        assert_eq!(
            t.write(c, m.rkey, m.iova, &[1], RW),
            Err(AccessError::Invalidated(m.rkey))
        );
        stop.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        // Touching the discarded pages faults in zero pages, without waiting for anyone.
        let nonzero = bounded("touch after DONTNEED", move || {
            (0..LEN).step_by(64).filter(|&i| peek(a + i) != 0).count()
        });
        assert_eq!(
            nonzero, 0,
            "round {round}: a write landed after the discard"
        );
        assert!(writes.load(Ordering::SeqCst) >= 8);
        let got = t.take_invalidations();
        assert_eq!(
            got,
            vec![Invalidation {
                lkey: m.lkey,
                cause: InvalidationCause::Discarded
            }]
        );
        // Still mapped: re-registration makes the region valid again, and it is watched.
        let (m, _) = t.rereg_mr(m.lkey, Rereg::default()).unwrap();
        assert!(t.region_coherence(m.lkey).unwrap().watched);
        t.write(c, m.rkey, m.iova, &[2], RW).unwrap();
        assert_eq!(peek(a), 2);
        t.dereg_mr(m.lkey).unwrap();
        unmap(a, LEN);
    }
}

/// A fault the watcher has no event for (the application protected the memory) waits a few
/// milliseconds for one, since the kernel queues an unmap's event only after the mapping
/// changed; but only the first fault of a region does. Before, every access waited, so a peer
/// could stall the receive path 5 ms per packet (20 accesses took over 100 ms here).
#[test]
fn only_the_first_fault_of_a_region_waits_for_the_watcher() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 2 * page_size();
    let a = map(len);
    let m = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    t.write(c, m.rkey, m.iova, &[1; 8], RW).unwrap();
    // SAFETY: protects a mapping the test owns; no uffd event is queued for it.
    assert_eq!(
        unsafe { libc::mprotect(a as *mut libc::c_void, len, libc::PROT_NONE) },
        0
    );
    let fault = Err(AccessError::Fault(m.rkey));
    let t0 = Instant::now();
    assert_eq!(t.write(c, m.rkey, m.iova, &[2; 8], RW), fault);
    let first = t0.elapsed();
    let t1 = Instant::now();
    for _ in 0..20 {
        assert_eq!(t.write(c, m.rkey, m.iova, &[3; 8], RW), fault);
        assert_eq!(t.read(c, m.rkey, m.iova, &mut [0; 8], RW), fault);
    }
    let rest = t1.elapsed();
    println!("first fault {first:?}, 40 more {rest:?}");
    assert!(
        rest < Duration::from_millis(40),
        "40 faults of a region that already faulted took {rest:?}"
    );
    // SAFETY: as above, readable again for the unmap.
    assert_eq!(
        unsafe {
            libc::mprotect(
                a as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        },
        0
    );
    t.dereg_mr(m.lkey).unwrap();
    unmap(a, len);
}

#[test]
fn faults_in_watched_ranges_never_wait() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 64 * page_size();
    let a = map(len);
    // Registered before any page is populated.
    let m = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    bounded("first-touch faults", move || {
        for i in (0..len).step_by(page_size()) {
            // SAFETY: inside a live mapping of the test.
            unsafe { core::ptr::write_volatile((a + i) as *mut u8, 1) };
        }
    });
    let t = Arc::new(t);
    let t2 = Arc::clone(&t);
    let lkey = bounded("access after DONTNEED", move || {
        // SAFETY: discards pages of a mapping the test owns.
        assert_eq!(
            unsafe { libc::madvise(a as *mut libc::c_void, len, libc::MADV_DONTNEED) },
            0
        );
        let (m, _) = t2.rereg_mr(m.lkey, Rereg::default()).unwrap();
        t2.write(c, m.rkey, m.iova + 4096 * 3, &[8; 100], RW)
            .unwrap();
        m.lkey
    });
    assert_eq!(peek(a + 4096 * 3 + 99), 8);
    t.dereg_mr(lkey).unwrap();
    unmap(a, len);
}

#[test]
fn windows_on_an_unmapped_region_fail() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 2 * page_size();
    let a = map(len);
    let m = t.reg_mr(pd, raw(a, len), ALL, None).unwrap();
    let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
    let rkey = t
        .bind_mw_type1(c, mw, m.lkey, m.iova, 64, Access::REMOTE_WRITE)
        .unwrap();
    t.write(c, rkey, m.iova, &[1; 8], Access::REMOTE_WRITE)
        .unwrap();
    unmap(a, len);
    assert_eq!(
        t.write(c, rkey, m.iova, &[1; 8], Access::REMOTE_WRITE),
        Err(AccessError::Invalidated(rkey))
    );
    t.dealloc_mw(rkey).unwrap();
    t.dereg_mr(m.lkey).unwrap();
}

#[test]
fn owned_memory_is_neither_watched_nor_checked() {
    let _s = serial();
    let (t, pd, _) = setup(WatchMode::On);
    let o = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 4096]), RW, None)
        .unwrap();
    let rc = t.region_coherence(o.lkey).unwrap();
    assert!(!rc.watched && !rc.checked_copy);
    // No raw registration yet: the watcher has not started.
    assert_eq!(t.watch_status(), WatchStatus::Idle);
    let a = map(4096);
    let r = t.reg_mr(pd, raw(a, 4096), RW, None).unwrap();
    let rc = t.region_coherence(r.lkey).unwrap();
    assert!(rc.watched && rc.checked_copy);
    let plain = MemoryTable::new(MemConfig {
        raw_copy: RawCopy::Plain,
        ..MemConfig::default()
    })
    .unwrap();
    assert!(!plain.checked_copy());
    t.dereg_mr(r.lkey).unwrap();
    t.dereg_mr(o.lkey).unwrap();
    unmap(a, 4096);
}

#[test]
fn overlapping_regions_keep_their_pages_watched() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let len = 2 * page_size();
    let a = map(len);
    let m1 = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    let m2 = t.reg_mr(pd, raw(a + 10, 100), RW, None).unwrap();
    t.dereg_mr(m1.lkey).unwrap();
    unmap(a, len);
    assert_eq!(
        t.write(c, m2.rkey, m2.iova, &[1], RW),
        Err(AccessError::Invalidated(m2.rkey))
    );
    t.dereg_mr(m2.lkey).unwrap();
}

#[test]
fn deregistered_memory_is_no_longer_watched() {
    let _s = serial();
    let (t, pd, _) = setup(WatchMode::On);
    let len = page_size();
    let a = map(len);
    let m = t.reg_mr(pd, raw(a, len), RW, None).unwrap();
    t.dereg_mr(m.lkey).unwrap();
    let before = t.stats().coherence_events;
    unmap(a, len);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(t.stats().coherence_events, before);
}

#[test]
fn max_watched_bounds_the_watcher() {
    let _s = serial();
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        max_watched: 1,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let (a, b) = (map(4096), map(4096));
    let m1 = t.reg_mr(pd, raw(a, 4096), RW, None).unwrap();
    let m2 = t.reg_mr(pd, raw(b, 4096), RW, None).unwrap();
    let s = t.stats();
    assert_eq!((s.watched_regions, s.unwatched_regions), (1, 1));
    assert!(!t.region_coherence(m2.lkey).unwrap().watched);
    // The unwatched region is still protected by checked copies.
    unmap_fenced(b, 4096);
    let c = AccessCtx { pd, qpn: 1 };
    assert_eq!(
        t.write(c, m2.rkey, m2.iova, &[1], RW),
        Err(AccessError::Fault(m2.rkey))
    );
    t.dereg_mr(m1.lkey).unwrap();
    t.dereg_mr(m2.lkey).unwrap();
    unmap(a, 4096);
    unmap(b, 4096);
}

#[test]
fn the_notify_callback_sees_invalidations() {
    let _s = serial();
    let (t, pd, _) = setup(WatchMode::On);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = Arc::clone(&seen);
    t.set_invalidation_notify(Some(Arc::new(move |i| s2.lock().unwrap().push(i))));
    let a = map(4096);
    let m = t.reg_mr(pd, raw(a, 4096), RW, None).unwrap();
    unmap(a, 4096);
    // The callback runs on the watcher thread after the unmapping thread is released.
    let deadline = Instant::now() + LIMIT;
    while seen.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Invalidation {
            lkey: m.lkey,
            cause: InvalidationCause::Unmapped
        }]
    );
    t.dereg_mr(m.lkey).unwrap();
}

#[test]
fn dropping_the_table_stops_the_watcher() {
    let _s = serial();
    let a = map(4096);
    bounded("drop", move || {
        let (t, pd, _) = setup(WatchMode::On);
        let _m = t.reg_mr(pd, raw(a, 4096), RW, None).unwrap();
        drop(t);
    });
    // Nobody reads events any more and the descriptor is closed: the unmap must not wait.
    unmap(a, 4096);
}

#[test]
fn atomics_on_raw_regions() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let a = map(4096);
    let m = t.reg_mr(pd, raw(a, 4096), ALL, None).unwrap();
    let fa = AtomicOp::FetchAdd { add: 5 };
    assert_eq!(t.atomic(c, m.rkey, m.iova + 8, fa), Ok(0));
    let cs = AtomicOp::CompareSwap {
        compare: 5,
        swap: 42,
    };
    assert_eq!(t.atomic(c, m.rkey, m.iova + 8, cs), Ok(5));
    assert_eq!(t.atomic(c, m.rkey, m.iova + 8, fa), Ok(42));
    t.dereg_mr(m.lkey).unwrap();
    unmap(a, 4096);
}

/// The watcher needs no privilege: run `watcher_child` as user `nobody` through `setpriv`
/// (when we are root; otherwise this test is the unprivileged run itself).
#[test]
fn the_watcher_works_without_privileges() {
    let _s = serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        watcher_child_body();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args([
            "--exact",
            "watcher_child",
            "--include-ignored",
            "--nocapture",
        ])
        .output();
    let out = out.unwrap_or_else(|e| {
        panic!("cannot run setpriv ({e}): install the Debian package util-linux")
    });
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "unprivileged run failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by the_watcher_works_without_privileges as an unprivileged user"]
fn watcher_child() {
    let _s = serial();
    watcher_child_body();
}

fn watcher_child_body() {
    let (t, pd, c) = setup(WatchMode::On);
    let a = map(4096);
    let m = t.reg_mr(pd, raw(a, 4096), RW, None).unwrap();
    assert!(
        matches!(t.watch_status(), WatchStatus::Active { .. }),
        "{:?}",
        t.watch_status()
    );
    unmap(a, 4096);
    assert_eq!(
        t.write(c, m.rkey, m.iova, &[1], RW),
        Err(AccessError::Invalidated(m.rkey))
    );
}

/// Accesses racing moves of a followed region reach it before or after each move, or are told
/// to retry (`Suspended`, which the transport answers with RNR NAK); never a fault. A copy
/// that faults on the moved-away memory finds the move's event still unread: the watcher
/// cannot apply it while the faulting access holds the region.
#[test]
fn accesses_racing_followed_moves_never_fault() {
    let _s = serial();
    let (t, pd, c) = setup(WatchMode::On);
    let t = Arc::new(t);
    let len = 4 * page_size();
    let mut a = map(len);
    let m = t
        .reg_mr(pd, raw(a, len).remap_policy(RemapPolicy::Follow), RW, None)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (t2, stop2) = (Arc::clone(&t), Arc::clone(&stop));
    let hammer = std::thread::spawn(move || {
        let (mut ok, mut retry) = (0u64, 0u64);
        while !stop2.load(Ordering::Relaxed) {
            match t2.write(c, m.rkey, m.iova + 64, &[7; 64], RW) {
                Ok(()) => ok += 1,
                Err(AccessError::Suspended(_)) => retry += 1,
                Err(e) => return Err(e),
            }
        }
        Ok((ok, retry))
    });
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut moves = 0u64;
    while moves < 200 && Instant::now() < deadline && !hammer.is_finished() {
        a = remap(a, len);
        moves += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let r = hammer.join().unwrap();
    println!("{moves} moves; hammer: {r:?}");
    let (ok, _retry) = r.expect("no access faults while its region moves");
    assert!(ok > 0);
    assert_eq!(t.stats().remaps_followed, moves);
    assert!(t.take_invalidations().is_empty());
    assert_eq!(t.query_mr(m.lkey).unwrap().addr, a);
    t.dereg_mr(m.lkey).unwrap();
    unmap(a, len);
}
