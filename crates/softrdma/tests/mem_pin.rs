//! The pinning resource manager: pages counted once across overlapping and redundant
//! registrations, exact release, limits (quota, RLIMIT_MEMLOCK in an unprivileged child,
//! CAP_IPC_LOCK as root), refusals that change nothing. Checked against the kernel's own
//! count (`VmLck` of /proc/self/status).
//!
//! Behaviour as root (how tests and CI run): with `CAP_IPC_LOCK` the kernel lets `mlock`
//! exceed `RLIMIT_MEMLOCK`, and so does the device (as the kernel's own check does); only the
//! device quota (`MemConfig::pin_quota`) then bounds pinning. The unprivileged case is tested
//! in a child process that drops `CAP_IPC_LOCK` and lowers `RLIMIT_MEMLOCK`.

use std::sync::Mutex;

use softrdma::mem::*;

/// VmLck is process-wide: tests of this binary that pin run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const PAGE: usize = 4096;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn pinned_table(quota: Option<u64>) -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: PinMode::Pinned,
        pin_quota: quota,
        ..MemConfig::default()
    })
    .unwrap()
}

fn vmlck() -> u64 {
    vm_locked_bytes().expect("VmLck")
}

/// Register `[off, off+len)` of `base` as raw memory.
fn reg(
    t: &MemoryTable,
    pd: u32,
    base: *mut u8,
    off: usize,
    len: usize,
) -> Result<MrInfo, RegError> {
    // SAFETY: callers keep the mapping at `base` alive until every region is deregistered.
    let src = unsafe { MemSource::raw(base.wrapping_add(off), len) };
    t.reg_mr(pd, src, Access::LOCAL_WRITE, None)
}

#[test]
fn overlapping_and_redundant_count_once() {
    let _g = serial();
    assert_eq!(PAGE, page_size());
    let base_lck = vmlck();
    let t = pinned_table(None);
    let pd = t.alloc_pd().unwrap();
    let mut m = memmap2::MmapMut::map_anon(16 * PAGE).unwrap();
    let b = m.as_mut_ptr();
    let a = reg(&t, pd, b, 0, PAGE).unwrap();
    let r = reg(&t, pd, b, 0, PAGE).unwrap(); // redundant
    let s = reg(&t, pd, b, 100, 100).unwrap(); // inside page 0, byte granular
    assert_eq!(t.stats().pinned_bytes, PAGE as u64);
    assert_eq!(vmlck() - base_lck, PAGE as u64);
    let o = reg(&t, pd, b, PAGE - 1, PAGE + 2).unwrap(); // pages 0..=2
    assert_eq!(t.stats().pinned_bytes, 3 * PAGE as u64);
    assert_eq!(vmlck() - base_lck, 3 * PAGE as u64);
    let z = reg(&t, pd, b, 5 * PAGE, 0).unwrap(); // zero length pins nothing
    assert_eq!(t.stats().pinned_bytes, 3 * PAGE as u64);
    t.dereg_mr(a.lkey).unwrap();
    t.dereg_mr(o.lkey).unwrap();
    assert_eq!(
        t.stats().pinned_bytes,
        PAGE as u64,
        "page 0 still held by two regions"
    );
    assert_eq!(vmlck() - base_lck, PAGE as u64);
    t.dereg_mr(r.lkey).unwrap();
    t.dereg_mr(s.lkey).unwrap();
    t.dereg_mr(z.lkey).unwrap();
    assert_eq!(t.stats().pinned_bytes, 0);
    assert_eq!(vmlck(), base_lck);
    // Owned, file and device memory are pinned and released the same way.
    let o = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 3 * PAGE]),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    let d = t
        .reg_mr(
            pd,
            MemSource::device(2 * PAGE, PageSize::Base),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    assert!(t.stats().pinned_bytes >= 5 * PAGE as u64);
    assert_eq!(vmlck() - base_lck, t.stats().pinned_bytes);
    // ON_DEMAND regions are not pinned even on a pinned device.
    let od = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 8 * PAGE]),
            Access::LOCAL_WRITE | Access::ON_DEMAND,
            None,
        )
        .unwrap();
    assert_eq!(vmlck() - base_lck, t.stats().pinned_bytes);
    for k in [o.lkey, d.lkey, od.lkey] {
        t.dereg_mr(k).unwrap();
    }
    assert_eq!(t.stats().pinned_bytes, 0);
    assert_eq!(vmlck(), base_lck);
    drop(m);
}

/// Two devices (two contexts) pinning the same pages: the lock is the process's, so the pages
/// stay locked until the last registration of either device goes, in either order. Before,
/// each device counted its own pins and the first deregistration unlocked pages the other
/// device still relied on (VmLck dropped to the base while device B's region was registered).
#[test]
fn two_devices_pinning_the_same_pages_share_the_lock() {
    let _g = serial();
    let base_lck = vmlck();
    let base_proc = process_pinned_bytes();
    let mut m = memmap2::MmapMut::map_anon(8 * PAGE).unwrap();
    let b = m.as_mut_ptr();
    for first_a in [true, false] {
        let (ta, tb) = (pinned_table(None), pinned_table(None));
        let (pa, pb) = (ta.alloc_pd().unwrap(), tb.alloc_pd().unwrap());
        // A pins pages 0..4, B pages 2..8: 8 pages in all, 2..4 by both.
        let ra = reg(&ta, pa, b, 0, 4 * PAGE).unwrap();
        let rb = reg(&tb, pb, b, 2 * PAGE, 6 * PAGE).unwrap();
        let pages = |n: usize| (n * PAGE) as u64;
        assert_eq!(ta.stats().pinned_bytes, pages(4));
        assert_eq!(tb.stats().pinned_bytes, pages(6));
        assert_eq!(vmlck() - base_lck, pages(8));
        assert_eq!(process_pinned_bytes() - base_proc, pages(8));
        // The first deregistration unlocks only the pages no other registration holds.
        let (first, second, left) = if first_a {
            (
                (&ta, ra.lkey),
                (&tb, rb.lkey),
                6, // B's pages 2..8
            )
        } else {
            (
                (&tb, rb.lkey),
                (&ta, ra.lkey),
                4, // A's pages 0..4
            )
        };
        first.0.dereg_mr(first.1).unwrap();
        assert_eq!(first.0.stats().pinned_bytes, 0);
        assert_eq!(
            vmlck() - base_lck,
            pages(left),
            "after the first device's deregistration (A first: {first_a})"
        );
        assert_eq!(process_pinned_bytes() - base_proc, pages(left));
        second.0.dereg_mr(second.1).unwrap();
        assert_eq!(second.0.stats().pinned_bytes, 0);
        assert_eq!(vmlck(), base_lck);
        assert_eq!(process_pinned_bytes(), base_proc);
    }
    drop(m);
}

#[test]
fn on_demand_device_pins_nothing() {
    let _g = serial();
    let base_lck = vmlck();
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 64 * PAGE]),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    assert_eq!((t.stats().pinned_bytes, vmlck()), (0, base_lck));
    t.dereg_mr(mr.lkey).unwrap();
}

#[test]
fn quota_refusal_changes_nothing() {
    let _g = serial();
    let base_lck = vmlck();
    let t = pinned_table(Some(8 * PAGE as u64));
    let pd = t.alloc_pd().unwrap();
    let mut m = memmap2::MmapMut::map_anon(32 * PAGE).unwrap();
    let b = m.as_mut_ptr();
    let a = reg(&t, pd, b, 0, 6 * PAGE).unwrap();
    let before = t.stats();
    let e = reg(&t, pd, b, 10 * PAGE, 4 * PAGE).unwrap_err();
    assert_eq!(
        e.error,
        MemError::PinLimit {
            asked: 4 * PAGE as u64,
            needed: 4 * PAGE as u64,
            free: 2 * PAGE as u64,
            limit: 8 * PAGE as u64,
            kind: PinLimitKind::Quota
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("16384") && msg.contains("8192") && msg.contains("quota"),
        "{msg}"
    );
    assert_eq!(e.offered.as_ref().map(MemSource::len), Some(4 * PAGE));
    let after = t.stats();
    assert_eq!(
        (after.regions, after.pinned_bytes),
        (before.regions, before.pinned_bytes)
    );
    assert_eq!(after.pin_refusals, before.pin_refusals + 1);
    assert_eq!(vmlck() - base_lck, 6 * PAGE as u64);
    // Pages already pinned cost nothing: an overlapping registration needing 2 new pages fits.
    let o = reg(&t, pd, b, 4 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(t.stats().pinned_bytes, 8 * PAGE as u64);
    // Refused rereg/resume leave the region as it was.
    let e = t
        .rereg_mr(
            a.lkey,
            Rereg {
                translation: Some((MemSource::owned(vec![0u8; PAGE]), None)),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e.error, MemError::PinLimit { .. }));
    assert_eq!(t.query_mr(a.lkey).unwrap().length, 6 * PAGE as u64);
    t.dereg_mr(a.lkey).unwrap();
    t.dereg_mr(o.lkey).unwrap();
    assert_eq!((t.stats().pinned_bytes, vmlck()), (0, base_lck));
    drop(m);
}

#[test]
fn as_root_cap_ipc_lock_bypasses_rlimit() {
    let _g = serial();
    let base_lck = vmlck();
    let t = pinned_table(None);
    let pd = t.alloc_pd().unwrap();
    // A small soft limit for the length of the test (the hard one stays), whatever the
    // process was started with: an unlimited one would leave nothing to check.
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with valid pointers; this binary's pinning tests run one
    // at a time (`serial`), and the limit is restored below.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut old), 0);
        let small = libc::rlimit {
            rlim_cur: old.rlim_max.min(64 << 10),
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &small), 0);
    }
    let lim = t.pin_limits();
    assert_eq!(lim.cap_ipc_lock, has_cap_ipc_lock());
    let rl = lim
        .rlimit_memlock
        .expect("a finite RLIMIT_MEMLOCK was just set");
    assert!(rl <= 64 << 10, "{rl}");
    let len = rl as usize + 4 * PAGE;
    let r = t.reg_mr(
        pd,
        MemSource::owned(vec![0u8; len]),
        Access::LOCAL_WRITE,
        None,
    );
    if lim.cap_ipc_lock {
        let mr = r.expect("CAP_IPC_LOCK bypasses RLIMIT_MEMLOCK");
        t.dereg_mr(mr.lkey).unwrap();
    } else {
        assert!(matches!(
            r.unwrap_err().error,
            MemError::PinLimit {
                kind: PinLimitKind::Rlimit,
                ..
            }
        ));
    }
    // SAFETY: as above; restores the limit the process had.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &old), 0);
    }
    assert_eq!(vmlck(), base_lck);
}

const CHILD_ENV: &str = "SOFTRDMA_MEM_UNPRIVILEGED_CHILD";
const CHILD_LIMIT: u64 = 64 * 1024;

/// Drop CAP_IPC_LOCK from every set and lower RLIMIT_MEMLOCK, for this process only.
fn become_unprivileged() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_IPC_LOCK: u32 = 14;
    let mut hdr = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget writes two `Data` (version 3 layout) through valid pointers.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget");
    let bit = !(1u32 << CAP_IPC_LOCK);
    data[0].effective &= bit;
    data[0].permitted &= bit;
    data[0].inheritable &= bit;
    // SAFETY: capset reads the header and two `Data`; dropping a capability is always allowed.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &hdr as *const Header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset");
    let lim = libc::rlimit {
        rlim_cur: CHILD_LIMIT,
        rlim_max: CHILD_LIMIT,
    };
    // SAFETY: setrlimit reads one `rlimit`; lowering a limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);
}

#[test]
fn unprivileged_child_refused_at_rlimit() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return unprivileged_body();
    }
    let _g = serial();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "unprivileged_child_refused_at_rlimit",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("child: refused as expected"),
        "child did not run its checks:\n{text}"
    );
}

fn unprivileged_body() {
    become_unprivileged();
    assert!(!has_cap_ipc_lock());
    assert_eq!(rlimit_memlock(), Some(CHILD_LIMIT));
    let t = pinned_table(None);
    let pd = t.alloc_pd().unwrap();
    let lim = t.pin_limits();
    assert!(!lim.cap_ipc_lock && lim.rlimit_memlock == Some(CHILD_LIMIT));
    let mut m = memmap2::MmapMut::map_anon(64 * PAGE).unwrap();
    let b = m.as_mut_ptr();
    let base_lck = vmlck();
    let a = reg(&t, pd, b, 0, 8 * PAGE).unwrap();
    // Overlapping and redundant registrations still fit: they pin nothing new.
    let a2 = reg(&t, pd, b, 0, 8 * PAGE).unwrap();
    let a3 = reg(&t, pd, b, 3, 8 * PAGE - 3).unwrap();
    assert_eq!(vmlck() - base_lck, 8 * PAGE as u64);
    // Beyond the limit: refused with how much was asked and how much is free.
    let e = reg(&t, pd, b, 16 * PAGE, 16 * PAGE).unwrap_err();
    let want = MemError::PinLimit {
        asked: 65536,
        needed: 65536,
        free: 32768,
        limit: CHILD_LIMIT,
        kind: PinLimitKind::Rlimit,
    };
    assert_eq!(e.error, want);
    let msg = e.to_string();
    assert!(
        msg.contains("65536") && msg.contains("32768") && msg.contains("RLIMIT_MEMLOCK"),
        "{msg}"
    );
    println!("child: {msg}");
    assert_eq!(
        vmlck() - base_lck,
        8 * PAGE as u64,
        "a refusal pinned nothing"
    );
    assert_eq!(t.stats().pinned_bytes, 8 * PAGE as u64);
    assert_eq!(t.stats().regions, 3);
    // Memory the application locked itself also counts: the kernel refuses, the device reports.
    // SAFETY: locking pages of our own live mapping.
    assert_eq!(unsafe { libc::mlock(b.add(40 * PAGE).cast(), 4 * PAGE) }, 0);
    let e = reg(&t, pd, b, 16 * PAGE, 6 * PAGE).unwrap_err();
    assert!(
        matches!(
            e.error,
            MemError::PinLimit {
                free: 16384,
                kind: PinLimitKind::Rlimit,
                ..
            }
        ),
        "{}",
        e.error
    );
    assert_eq!(
        vmlck() - base_lck,
        12 * PAGE as u64,
        "a refusal pinned nothing"
    );
    // Exactly up to the limit is accepted.
    let full = reg(&t, pd, b, 16 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(vmlck() - base_lck, CHILD_LIMIT);
    for k in [a.lkey, a2.lkey, full.lkey, a3.lkey] {
        t.dereg_mr(k).unwrap();
    }
    assert_eq!(t.stats().pinned_bytes, 0);
    assert_eq!(
        vmlck() - base_lck,
        4 * PAGE as u64,
        "only the application's own lock remains"
    );
    assert_eq!(t.stats().pin_refusals, 2);
    // SAFETY: unlocking the pages locked above.
    assert_eq!(
        unsafe { libc::munlock(b.add(40 * PAGE).cast(), 4 * PAGE) },
        0
    );
    // The limit is the process's: a second device shares what the first pinned, and is
    // refused what would take the process past the limit although it alone would fit.
    let t2 = pinned_table(None);
    let pd2 = t2.alloc_pd().unwrap();
    let x = reg(&t, pd, b, 0, 12 * PAGE).unwrap();
    let y = reg(&t2, pd2, b, 4 * PAGE, 8 * PAGE).unwrap();
    assert_eq!(vmlck() - base_lck, 12 * PAGE as u64);
    assert_eq!(process_pinned_bytes(), 12 * PAGE as u64);
    let e = reg(&t2, pd2, b, 32 * PAGE, 8 * PAGE).unwrap_err();
    assert!(
        matches!(
            e.error,
            MemError::PinLimit {
                needed: 32768,
                free: 16384,
                kind: PinLimitKind::Rlimit,
                ..
            }
        ),
        "{}",
        e.error
    );
    t.dereg_mr(x.lkey).unwrap();
    assert_eq!(
        vmlck() - base_lck,
        8 * PAGE as u64,
        "device 2's pages stay locked"
    );
    t2.dereg_mr(y.lkey).unwrap();
    assert_eq!(vmlck(), base_lck);
    assert_eq!(process_pinned_bytes(), 0);
    println!("child: refused as expected");
    drop(m);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Random register/deregister sequences over 24 pages: the device's count and the
        /// kernel's VmLck both equal the number of distinct pages under live registrations,
        /// and return to exactly zero after deregistering the rest in random order.
        #[test]
        fn pinned_bytes_track_distinct_pages(ops in proptest::collection::vec((0usize..24 * PAGE, 0usize..6 * PAGE, 0u8..3), 1..30),
                                             order in any::<u64>()) {
            let _g = serial();
            let base_lck = vmlck();
            let t = pinned_table(None);
            let pd = t.alloc_pd().unwrap();
            let mut m = memmap2::MmapMut::map_anon(32 * PAGE).unwrap();
            let b = m.as_mut_ptr();
            let mut live: Vec<(u32, usize, usize)> = Vec::new();
            let distinct = |live: &Vec<(u32, usize, usize)>| {
                let mut pages = std::collections::BTreeSet::new();
                for &(_, off, len) in live {
                    if len > 0 { pages.extend(off / PAGE..=(off + len - 1) / PAGE); }
                }
                pages.len() as u64 * PAGE as u64
            };
            for (off, len, op) in ops {
                if op == 0 && !live.is_empty() {
                    let (k, _, _) = live.swap_remove(off % live.len());
                    t.dereg_mr(k).unwrap();
                } else {
                    let mr = reg(&t, pd, b, off, len).unwrap();
                    live.push((mr.lkey, off, len));
                }
                prop_assert_eq!(t.stats().pinned_bytes, distinct(&live));
                prop_assert_eq!(vmlck() - base_lck, distinct(&live));
            }
            let mut rot = order;
            while !live.is_empty() {
                let (k, _, _) = live.swap_remove((rot % live.len() as u64) as usize);
                rot = rot.rotate_left(7) ^ 0x9e37_79b9;
                t.dereg_mr(k).unwrap();
            }
            prop_assert_eq!(t.stats().pinned_bytes, 0);
            prop_assert_eq!(vmlck(), base_lck);
            drop(m);
        }
    }
}
