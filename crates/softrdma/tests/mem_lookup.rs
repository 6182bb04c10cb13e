//! The lookup the transport calls: every error, bounds at the top of the address space,
//! zero length, every combination of access flags, the four kinds of memory, rereg; and
//! lending bytes to the transmit path (zero-copy sends): what can be lent, the errors, and
//! that deregistration, suspension, a new backing and invalidation wait for outstanding loans
//! before they let go of the memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use softrdma::mem::*;

const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::REMOTE_WRITE;
const RR: Access = Access::REMOTE_READ;
const RA: Access = Access::REMOTE_ATOMIC;
const ALL: Access = Access(LW.0 | RW.0 | RR.0 | RA.0);

fn table() -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap()
}

fn ctx(pd: u32) -> AccessCtx {
    AccessCtx { pd, qpn: 7 }
}

#[test]
fn owned_buffer_round_trip_and_handed_back() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 100]), ALL, None)
        .unwrap();
    assert_eq!(mr.lkey, mr.rkey);
    assert_eq!(
        mr.iova, mr.addr as u64,
        "default IOVA is the virtual address"
    );
    t.write(ctx(pd), mr.rkey, mr.iova + 10, b"hello", RW)
        .unwrap();
    let mut out = [0u8; 5];
    t.read(ctx(pd), mr.lkey, mr.iova + 10, &mut out, Access::NONE)
        .unwrap();
    assert_eq!(&out, b"hello");
    assert_eq!(t.stats().regions, 1);
    let back: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(&back[10..15], b"hello");
    assert_eq!(t.stats().regions, 0);
    t.dealloc_pd(pd).unwrap();
}

#[test]
fn boxed_slice_and_mmap_are_owned_buffers() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let b = t
        .reg_mr(
            pd,
            MemSource::owned(vec![1u8; 9].into_boxed_slice()),
            LW,
            Some(0x1000),
        )
        .unwrap();
    assert_eq!(b.iova, 0x1000);
    let mut out = [0u8; 9];
    t.read(ctx(pd), b.lkey, 0x1000, &mut out, Access::NONE)
        .unwrap();
    assert_eq!(out, [1u8; 9]);
    let m = memmap2::MmapMut::map_anon(8192).unwrap();
    let r = t.reg_mr(pd, MemSource::owned(m), ALL, None).unwrap();
    t.write(ctx(pd), r.lkey, r.iova + 8190, &[7, 8], LW)
        .unwrap();
    let m: memmap2::MmapMut = t.dereg_mr(r.lkey).unwrap().downcast().unwrap();
    assert_eq!(&m[8190..], &[7, 8]);
    let _: Box<[u8]> = t.dereg_mr(b.lkey).unwrap().downcast().unwrap();
}

#[test]
fn raw_file_and_device_memory() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    // Raw, at an unaligned address with an odd length (byte granularity).
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives the registration (deregistered below) and is not touched meanwhile.
    let raw = unsafe { MemSource::raw(buf.as_mut_ptr().add(3), 1001) };
    let r = t.reg_mr(pd, raw, ALL, None).unwrap();
    assert_eq!(r.addr, buf.as_ptr() as usize + 3);
    t.write(ctx(pd), r.lkey, r.iova + 1000, &[9], RW).unwrap();
    assert_eq!(
        t.check(ctx(pd), r.lkey, r.iova + 1000, 2, RW),
        Err(AccessError::OutOfBounds {
            key: r.lkey,
            iova: r.iova + 1000,
            len: 2
        })
    );
    assert!(t.dereg_mr(r.lkey).unwrap().is_none());
    assert_eq!(buf[1003], 9);

    // File-backed: a memfd range at an unaligned offset; the engine maps its own view.
    let f = memfd(16384);
    let fr = t
        .reg_mr(pd, MemSource::file(f, 5000, 3000), ALL, Some(0))
        .unwrap();
    t.write(ctx(pd), fr.rkey, 10, b"file", RW).unwrap();
    let f: std::fs::File = t.dereg_mr(fr.lkey).unwrap().downcast().unwrap();
    let mut got = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut got, 5010).unwrap();
    assert_eq!(&got, b"file");

    // Device memory from the arena; the application can map it through a dup of its memfd.
    let d = t
        .reg_mr(pd, MemSource::device(10_000, PageSize::Base), ALL, None)
        .unwrap();
    assert!(t.stats().device_bytes >= 10_000);
    t.write(ctx(pd), d.rkey, d.iova + 9999, &[5], RW).unwrap();
    let fd = t.device_memory_fd(d.lkey).unwrap();
    let mut one = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&fd, &mut one, 9999).unwrap();
    assert_eq!(one, [5]);
    t.dereg_mr(d.lkey).unwrap();
    assert_eq!(t.stats().device_bytes, 0);
    // Huge pages: served when reserved, otherwise a clean error that leaves nothing behind.
    match t.reg_mr(pd, MemSource::device(1 << 21, PageSize::Huge2M), ALL, None) {
        Ok(h) => {
            t.dereg_mr(h.lkey).unwrap();
        }
        Err(e) => assert!(matches!(e.error, MemError::Os { .. }), "{e}"),
    }
    assert_eq!(t.stats().device_bytes, 0);
    assert_eq!(t.stats().regions, 0);
}

fn memfd(len: u64) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: a NUL-terminated name; the returned fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

#[test]
fn every_lookup_error() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let other = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 64]), LW | RR, Some(0x4000))
        .unwrap();
    let k = mr.lkey;
    let c = ctx(pd);
    assert_eq!(t.check(c, k, 0x4000, 64, RR), Ok(()));
    // Invalid key: unknown index, index 0, stale tag, beyond the table.
    assert_eq!(
        t.check(c, k ^ 0x100, 0x4000, 1, RR),
        Err(AccessError::InvalidKey(k ^ 0x100))
    );
    assert_eq!(
        t.check(c, 0x42, 0x4000, 1, RR),
        Err(AccessError::InvalidKey(0x42))
    );
    assert_eq!(
        t.check(c, k ^ 1, 0x4000, 1, RR),
        Err(AccessError::InvalidKey(k ^ 1))
    );
    assert_eq!(
        t.check(c, u32::MAX, 0, 1, RR),
        Err(AccessError::InvalidKey(u32::MAX))
    );
    // Wrong PD.
    assert_eq!(
        t.check(ctx(other), k, 0x4000, 1, RR),
        Err(AccessError::WrongPd(k))
    );
    // Out of bounds: below, above, straddling, huge length.
    for (iova, len) in [
        (0x3fff, 1),
        (0x4040, 1),
        (0x403f, 2),
        (0x4000, u64::MAX),
        (u64::MAX, 1),
    ] {
        assert_eq!(
            t.check(c, k, iova, len, RR),
            Err(AccessError::OutOfBounds { key: k, iova, len })
        );
    }
    // Access denied.
    assert_eq!(
        t.check(c, k, 0x4000, 1, RW),
        Err(AccessError::AccessDenied {
            key: k,
            needed: RW.0
        })
    );
    assert_eq!(
        t.atomic(c, k, 0x4000, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::AccessDenied {
            key: k,
            needed: RA.0
        })
    );
    // Suspended, then invalidated.
    t.suspend_mr(k).unwrap();
    assert_eq!(t.check(c, k, 0x4000, 1, RR), Err(AccessError::Suspended(k)));
    // A request that would fail anyway reports its real error, not "retry".
    assert_eq!(
        t.check(c, k, 0x4040, 1, RR),
        Err(AccessError::OutOfBounds {
            key: k,
            iova: 0x4040,
            len: 1
        })
    );
    t.resume_mr(k, None).unwrap();
    assert_eq!(
        t.invalidate(ctx(other), k, Invalidator::Local),
        Err(AccessError::WrongPd(k))
    );
    // A peer's SEND with Invalidate never reaches a region (its R_Key is its L_Key too).
    assert_eq!(
        t.invalidate(c, k, Invalidator::Remote),
        Err(AccessError::InvalidOperation(k))
    );
    assert_eq!(t.check(c, k, 0x4000, 1, RR), Ok(()));
    t.invalidate(c, k, Invalidator::Local).unwrap();
    assert_eq!(
        t.check(c, k, 0x4000, 1, RR),
        Err(AccessError::Invalidated(k))
    );
    let mut out = [0u8; 1];
    assert_eq!(
        t.read(c, k, 0x4000, &mut out, RR),
        Err(AccessError::Invalidated(k))
    );
    // Re-registration makes the region valid again under a new key; the invalidated key
    // stays dead.
    let (info, _) = t.rereg_mr(k, Rereg::default()).unwrap();
    assert_ne!(info.lkey, k);
    assert_eq!(info.lkey, info.rkey);
    assert_eq!(
        t.check(c, k, 0x4000, 1, RR),
        Err(AccessError::InvalidKey(k))
    );
    let k2 = info.lkey;
    assert_eq!(t.check(c, k2, 0x4000, 1, RR), Ok(()));
    // Deregistered: the key is gone.
    t.dereg_mr(k2).unwrap();
    assert_eq!(
        t.check(c, k2, 0x4000, 1, RR),
        Err(AccessError::InvalidKey(k2))
    );
    assert!(matches!(t.dereg_mr(k2), Err(MemError::InvalidKey(_))));
}

#[test]
fn atomics_misaligned_and_exact() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let c = ctx(pd);
    let mem = memmap2::MmapMut::map_anon(4096).unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(mem), ALL, Some(0x1000))
        .unwrap();
    assert_eq!(
        t.atomic(c, mr.rkey, 0x1004, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::Misaligned(0x1004))
    );
    assert_eq!(
        t.atomic(c, mr.rkey, 0x1ffc, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::OutOfBounds {
            key: mr.rkey,
            iova: 0x1ffc,
            len: 8
        })
    );
    assert_eq!(
        t.atomic(c, mr.rkey, 0x1ff8, AtomicOp::FetchAdd { add: 5 }),
        Ok(0)
    );
    assert_eq!(
        t.atomic(
            c,
            mr.rkey,
            0x1ff8,
            AtomicOp::CompareSwap {
                compare: 4,
                swap: 9
            }
        ),
        Ok(5)
    );
    assert_eq!(
        t.atomic(
            c,
            mr.rkey,
            0x1ff8,
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 9
            }
        ),
        Ok(5)
    );
    assert_eq!(
        t.atomic(c, mr.rkey, 0x1ff8, AtomicOp::FetchAdd { add: 0 }),
        Ok(9)
    );
    // Host address not 8-aligned although the IOVA is: refused, never a torn atomic.
    let mem = memmap2::MmapMut::map_anon(4096).unwrap();
    let m2 = t.reg_mr(pd, MemSource::owned(mem), ALL, None).unwrap();
    // SAFETY: the mapping is owned by the region m2 and stays mapped until it is deregistered.
    let odd = t
        .reg_mr(
            pd,
            unsafe { MemSource::raw((m2.addr + 3) as *mut u8, 64) },
            ALL,
            Some(0),
        )
        .unwrap();
    assert_eq!(
        t.atomic(c, odd.rkey, 8, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::Misaligned(8))
    );
    // Concurrent fetch-adds from two threads on one address are atomic.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    t.atomic(c, m2.rkey, m2.iova + 64, AtomicOp::FetchAdd { add: 1 })
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(
        t.atomic(c, m2.rkey, m2.iova + 64, AtomicOp::FetchAdd { add: 0 }),
        Ok(40_000)
    );
}

#[test]
fn top_of_address_space_and_zero_length() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let c = ctx(pd);
    let top = u64::MAX - 4095;
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 4096]), ALL, Some(top))
        .unwrap();
    let k = mr.rkey;
    assert_eq!(t.write(c, k, u64::MAX, &[1], RW), Ok(()));
    assert_eq!(t.check(c, k, top, 4096, RW), Ok(()));
    assert_eq!(
        t.check(c, k, u64::MAX, 2, RW),
        Err(AccessError::OutOfBounds {
            key: k,
            iova: u64::MAX,
            len: 2
        })
    );
    assert_eq!(
        t.check(c, k, top, u64::MAX, RW),
        Err(AccessError::OutOfBounds {
            key: k,
            iova: top,
            len: u64::MAX
        })
    );
    assert_eq!(
        t.check(c, k, u64::MAX, u64::MAX, RW),
        Err(AccessError::OutOfBounds {
            key: k,
            iova: u64::MAX,
            len: u64::MAX
        })
    );
    assert_eq!(
        t.atomic(c, k, u64::MAX - 7, AtomicOp::FetchAdd { add: 1 }),
        Ok(1 << 56)
    );
    // Zero length: valid anywhere in [start, end], including one past the last byte.
    assert_eq!(t.check(c, k, top, 0, RW), Ok(()));
    assert_eq!(t.write(c, k, u64::MAX, &[], RW), Ok(()));
    assert_eq!(
        t.check(c, k, top - 1, 0, RW),
        Err(AccessError::OutOfBounds {
            key: k,
            iova: top - 1,
            len: 0
        })
    );
    // A region that would wrap is refused, and the buffer comes back.
    let e = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 4096]), ALL, Some(top + 1))
        .unwrap_err();
    assert!(matches!(e.error, MemError::InvalidRange { .. }), "{e}");
    assert_eq!(e.offered.unwrap().len(), 4096);
    // Zero-length regions are allowed (as verbs allow), and hold only zero-length accesses.
    let z = t
        .reg_mr(pd, MemSource::owned(Vec::new()), ALL, Some(500))
        .unwrap();
    assert_eq!(t.check(c, z.rkey, 500, 0, RR), Ok(()));
    assert_eq!(
        t.check(c, z.rkey, 500, 1, RR),
        Err(AccessError::OutOfBounds {
            key: z.rkey,
            iova: 500,
            len: 1
        })
    );
    // SAFETY: zero bytes at a null pointer are never touched.
    let zr = t
        .reg_mr(
            pd,
            unsafe { MemSource::raw(core::ptr::null_mut(), 0) },
            ALL,
            Some(u64::MAX),
        )
        .unwrap();
    assert_eq!(t.check(c, zr.rkey, u64::MAX, 0, RR), Ok(()));
}

#[test]
fn every_combination_of_access_flags() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let c = ctx(pd);
    let rights = [LW, RW, RR, RA, Access::MW_BIND];
    for have_bits in 0u32..32 {
        let have = rights
            .iter()
            .enumerate()
            .filter(|(i, _)| have_bits & (1 << i) != 0)
            .fold(Access::NONE, |a, (_, r)| a | *r);
        let res = t.reg_mr(pd, MemSource::owned(vec![0u8; 16]), have, Some(0));
        let legal = have.0 & (RW.0 | RA.0) == 0 || have.contains(LW);
        let Ok(mr) = res else {
            assert!(!legal, "legal flags {have:?} refused");
            assert!(matches!(
                res.unwrap_err().error,
                MemError::InvalidAccess { .. }
            ));
            continue;
        };
        assert!(legal, "illegal flags {have:?} accepted");
        for need_bits in 0u32..16 {
            let need = rights[..4]
                .iter()
                .enumerate()
                .filter(|(i, _)| need_bits & (1 << i) != 0)
                .fold(Access::NONE, |a, (_, r)| a | *r);
            let expect = if have.contains(need) {
                Ok(())
            } else {
                Err(AccessError::AccessDenied {
                    key: mr.lkey,
                    needed: need.0,
                })
            };
            assert_eq!(
                t.check(c, mr.lkey, 0, 8, need),
                expect,
                "have {have:?} need {need:?}"
            );
        }
        let atomic = t.atomic(c, mr.rkey, 0, AtomicOp::FetchAdd { add: 1 });
        assert_eq!(atomic.is_ok(), have.contains(RA));
        t.dereg_mr(mr.lkey).unwrap();
    }
    // Optional flags are accepted and ignored; unknown ones refused.
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 16]),
            RR | Access::RELAXED_ORDERING,
            None,
        )
        .unwrap();
    assert_eq!(mr.access, RR);
    assert!(
        t.reg_mr(pd, MemSource::owned(vec![0u8; 16]), Access(1 << 12), None)
            .is_err()
    );
}

#[test]
fn zero_based_region() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 32]),
            LW | RW | Access::ZERO_BASED,
            Some(0x9999),
        )
        .unwrap();
    assert_eq!(mr.iova, 0);
    t.write(ctx(pd), mr.rkey, 31, &[1], RW).unwrap();
    assert!(t.check(ctx(pd), mr.rkey, 32, 1, RW).is_err());
}

#[test]
fn redundant_registrations_are_independent() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mut buf = vec![0u8; 256];
    let p = buf.as_mut_ptr();
    // SAFETY: `buf` outlives every registration below and is not touched until they are gone.
    let a = t
        .reg_mr(pd, unsafe { MemSource::raw(p, 256) }, LW | RR, None)
        .unwrap();
    // SAFETY: as above.
    let b = t
        .reg_mr(pd, unsafe { MemSource::raw(p, 256) }, ALL, None)
        .unwrap();
    // SAFETY: as above.
    let c2 = t
        .reg_mr(
            pd,
            unsafe { MemSource::raw(p.wrapping_add(100), 10) },
            LW,
            None,
        )
        .unwrap();
    assert!(a.lkey != b.lkey && b.lkey != c2.lkey && a.lkey != c2.lkey);
    assert!(t.check(ctx(pd), a.rkey, a.iova, 1, RW).is_err());
    assert!(t.check(ctx(pd), b.rkey, b.iova, 1, RW).is_ok());
    t.invalidate_mr(b.lkey).unwrap();
    assert!(t.check(ctx(pd), a.rkey, a.iova, 1, RR).is_ok());
    t.write(ctx(pd), c2.lkey, c2.iova, &[3], LW).unwrap();
    for k in [a.lkey, b.lkey, c2.lkey] {
        t.dereg_mr(k).unwrap();
    }
    assert_eq!(buf[100], 3);
}

#[test]
fn rereg_changes_range_access_and_pd() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let pd2 = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![1u8; 16]), LW, None)
        .unwrap();
    // Access.
    let (i, r) = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                access: Some(LW | RW),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(r.is_none());
    assert_eq!(i.access, LW | RW);
    // The same memory keeps its key (as rxe and mlx5 keep theirs), with the new rights.
    assert_eq!((i.lkey, i.rkey), (mr.lkey, mr.rkey));
    assert!(t.check(ctx(pd), i.rkey, mr.iova, 16, RW).is_ok());
    // Rights taken away are gone for that key at once.
    let (i, _) = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                access: Some(LW),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(i.rkey, mr.rkey);
    assert!(matches!(
        t.check(ctx(pd), mr.rkey, mr.iova, 16, RW),
        Err(AccessError::AccessDenied { .. })
    ));
    let (i, _) = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                access: Some(LW | RW),
                ..Default::default()
            },
        )
        .unwrap();
    let mr = i;
    // Bad access leaves it unchanged.
    assert!(
        t.rereg_mr(
            mr.lkey,
            Rereg {
                access: Some(RW),
                ..Default::default()
            }
        )
        .is_err()
    );
    assert_eq!(t.query_mr(mr.lkey).unwrap().access, LW | RW);
    // PD.
    assert!(matches!(t.dealloc_pd(pd), Err(MemError::PdBusy { .. })));
    let (mr, _) = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                pd: Some(pd2),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        t.check(ctx(pd), mr.rkey, mr.iova, 1, RW),
        Err(AccessError::WrongPd(mr.rkey))
    );
    t.dealloc_pd(pd).unwrap();
    // Translation: new memory and IOVA; the old buffer is handed back; a new key.
    let (i, old) = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                translation: Some((MemSource::owned(vec![2u8; 64]), Some(0x100))),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((i.iova, i.length), (0x100, 64));
    assert_ne!(i.lkey, mr.lkey);
    assert_eq!(old.downcast::<Vec<u8>>().unwrap(), vec![1u8; 16]);
    let mr = i;
    let mut out = [0u8; 1];
    t.read(ctx(pd2), mr.lkey, 0x13f, &mut out, Access::NONE)
        .unwrap();
    assert_eq!(out, [2]);
    // Unknown PD refused, source handed back.
    let e = t
        .rereg_mr(
            mr.lkey,
            Rereg {
                pd: Some(999),
                translation: Some((MemSource::owned(vec![0u8; 3]), None)),
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.error, MemError::InvalidPd(999));
    assert_eq!(e.offered.unwrap().len(), 3);
    let back: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(back.len(), 64);
    t.dealloc_pd(pd2).unwrap();
    assert_eq!(t.stats().pds, 0);
}

#[test]
fn tables_are_bounded() {
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        max_keys: 3,
        max_pds: 1,
        max_device_bytes: 8192,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    assert!(matches!(t.alloc_pd(), Err(MemError::TableFull { .. })));
    let a = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 1]), LW, None)
        .unwrap();
    let _w = t.alloc_mw(pd, MwType::Type1).unwrap();
    let _b = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 1]), LW, None)
        .unwrap();
    let e = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 1]), LW, None)
        .unwrap_err();
    assert!(
        matches!(e.error, MemError::TableFull { limit: 3, .. }),
        "{e}"
    );
    t.dereg_mr(a.lkey).unwrap();
    let e = t
        .reg_mr(pd, MemSource::device(8193, PageSize::Base), LW, None)
        .unwrap_err();
    assert!(matches!(e.error, MemError::TableFull { .. }), "{e}");
    assert_eq!(t.stats().device_bytes, 0);
    assert!(
        t.reg_mr(pd, MemSource::device(8192, PageSize::Base), LW, None)
            .is_ok()
    );
    assert!(
        MemoryTable::new(MemConfig {
            max_keys: 1 << 24,
            ..MemConfig::default()
        })
        .is_err()
    );
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Against a model: any (iova, len, need) on a region at any IOVA is accepted exactly
        /// when it is inside and permitted, and a write then lands at the right offset.
        #[test]
        fn lookup_matches_model(base in prop_oneof![any::<u64>(), (u64::MAX - 300)..=u64::MAX, 0u64..300],
                                size in 0usize..200,
                                iova in prop_oneof![any::<u64>(), (u64::MAX - 300)..=u64::MAX, 0u64..600],
                                len in prop_oneof![0u64..300, any::<u64>()],
                                have in 0u32..16, need in 0u32..16) {
            let t = table();
            let pd = t.alloc_pd().unwrap();
            let have = Access(have);
            let r = t.reg_mr(pd, MemSource::owned(vec![0u8; size]), have, Some(base));
            let fits = size == 0 || (base as u128 + size as u128) <= 1u128 << 64;
            let legal = have.0 & (RW.0 | RA.0) == 0 || have.contains(LW);
            prop_assert_eq!(r.is_ok(), fits && legal);
            let Ok(mr) = r else { return Ok(()) };
            let inside = iova >= base && (iova as u128 + len as u128) <= base as u128 + size as u128;
            let got = t.check(ctx(pd), mr.rkey, iova, len, Access(need));
            let expect = if !have.contains(Access(need)) {
                Err(AccessError::AccessDenied { key: mr.rkey, needed: need })
            } else if !inside {
                Err(AccessError::OutOfBounds { key: mr.rkey, iova, len })
            } else { Ok(()) };
            prop_assert_eq!(got, expect);
            if expect.is_ok() && len > 0 && len < 300 {
                let data: Vec<u8> = (0..len as u8).map(|x| x.wrapping_add(1)).collect();
                t.write(ctx(pd), mr.rkey, iova, &data, Access(need)).unwrap();
                let back: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
                let off = (iova - base) as usize;
                prop_assert_eq!(&back[off..off + len as usize], &data[..]);
            }
        }
    }
}

// Lending (zero-copy sends).

fn crc_of(l: &Lent) -> u32 {
    let mut h = crc32fast::Hasher::new();
    l.crc_update(&mut h);
    h.finalize()
}

fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[test]
fn lends_memory_the_engine_keeps_and_not_raw_memory() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let mr = t
        .reg_mr(pd, MemSource::owned(data.clone()), LW, None)
        .unwrap();
    let l = t
        .lend(ctx(pd), mr.lkey, mr.iova + 3, 5000, Access::NONE)
        .unwrap()
        .expect("an owned buffer is lent");
    assert_eq!(l.len(), 5000);
    assert_eq!(crc_of(&l), crc(&data[3..5003]));
    assert_eq!(l.iovec().iov_len, 5000);
    drop(l);

    // Device memory and files: lent too.
    let d = t
        .reg_mr(pd, MemSource::device(8192, PageSize::Base), LW, None)
        .unwrap();
    t.write(ctx(pd), d.lkey, d.iova + 100, b"device", Access::NONE)
        .unwrap();
    let l = t
        .lend(ctx(pd), d.lkey, d.iova + 100, 6, Access::NONE)
        .unwrap()
        .expect("device memory is lent");
    assert_eq!(crc_of(&l), crc(b"device"));
    drop(l);

    // Raw memory, copied with kernel checks by default, is never lent.
    let mut buf = vec![7u8; 4096];
    // SAFETY: `buf` outlives the registration (deregistered below) and is not touched meanwhile.
    let raw = unsafe { MemSource::raw(buf.as_mut_ptr(), buf.len()) };
    let r = t.reg_mr(pd, raw, LW, None).unwrap();
    assert!(
        t.lend(ctx(pd), r.lkey, r.iova, 4096, Access::NONE)
            .unwrap()
            .is_none()
    );
    t.dereg_mr(r.lkey).unwrap();
    t.dereg_mr(d.lkey).unwrap();
    let back: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(back, data);
    drop(buf);
}

#[test]
fn lend_errors_are_those_of_read() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let other = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![0u8; 100]), LW, None)
        .unwrap();
    let lend = |c, key, iova, len| t.lend(c, key, iova, len, Access::NONE).map(|l| l.is_some());
    assert_eq!(
        lend(ctx(pd), mr.lkey, mr.iova + 90, 11),
        Err(AccessError::OutOfBounds {
            key: mr.lkey,
            iova: mr.iova + 90,
            len: 11
        })
    );
    assert_eq!(
        lend(ctx(other), mr.lkey, mr.iova, 10),
        Err(AccessError::WrongPd(mr.lkey))
    );
    assert_eq!(
        lend(ctx(pd), mr.lkey ^ 0x100, mr.iova, 10),
        Err(AccessError::InvalidKey(mr.lkey ^ 0x100))
    );
    assert_eq!(
        t.lend(ctx(pd), mr.lkey, mr.iova, 10, Access::REMOTE_READ)
            .map(|l| l.is_some()),
        Err(AccessError::AccessDenied {
            key: mr.lkey,
            needed: Access::REMOTE_READ.0
        })
    );
    t.suspend_mr(mr.lkey).unwrap();
    assert_eq!(
        lend(ctx(pd), mr.lkey, mr.iova, 10),
        Err(AccessError::Suspended(mr.lkey))
    );
    t.resume_mr(mr.lkey, None).unwrap();
    assert_eq!(lend(ctx(pd), mr.lkey, mr.iova, 10), Ok(true));
    t.dereg_mr(mr.lkey).unwrap();
    assert_eq!(
        lend(ctx(pd), mr.lkey, mr.iova, 10),
        Err(AccessError::InvalidKey(mr.lkey))
    );
}

/// Run `op` on another thread while `l` is outstanding: it must not finish until `l` is
/// dropped. Returns what `op` returned.
fn waits_for<R: Send>(l: Lent, op: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let r = op();
            done.store(true, Ordering::Release);
            r
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::Acquire),
            "the operation finished while bytes were still lent"
        );
        drop(l);
        let r = h.join().unwrap();
        assert!(done.load(Ordering::Acquire));
        r
    })
}

#[test]
fn changes_wait_for_outstanding_loans() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(pd, MemSource::owned(vec![1u8; 4096]), LW, None)
        .unwrap();
    let lend_key = |key: u32| {
        t.lend(ctx(pd), key, mr.iova, 4096, Access::NONE)
            .unwrap()
            .unwrap()
    };
    let lend = || lend_key(mr.lkey);

    // Suspension: returns once the loan is back; new loans are refused meanwhile.
    waits_for(lend(), || t.suspend_mr(mr.lkey).unwrap());
    assert!(t.lend(ctx(pd), mr.lkey, mr.iova, 1, Access::NONE).is_err());

    // Resumed on a new backing (no loan can be outstanding: suspension waited for them and
    // refuses new ones); the old buffer comes back whole.
    let old = t.resume_mr(mr.lkey, Some(MemSource::owned(vec![2u8; 4096])));
    let old: Vec<u8> = old.unwrap().downcast().unwrap();
    assert_eq!(old, vec![1u8; 4096]);

    // Invalidation.
    waits_for(lend(), || t.invalidate_mr(mr.lkey).unwrap());

    // Re-registration with a new buffer hands the old one back after the loan.
    let info = t.query_mr(mr.lkey).unwrap();
    let (mr, _) = t.rereg_mr(mr.lkey, Rereg::default()).unwrap();
    let l = lend_key(mr.lkey);
    let (mr, old) = waits_for(l, || {
        t.rereg_mr(
            mr.lkey,
            Rereg {
                translation: Some((MemSource::owned(vec![3u8; 4096]), Some(info.iova))),
                ..Rereg::default()
            },
        )
        .unwrap()
    });
    let old: Vec<u8> = old.downcast().unwrap();
    assert_eq!(old, vec![2u8; 4096]);

    // Deregistration.
    let l = lend_key(mr.lkey);
    assert_eq!(crc_of(&l), crc(&[3u8; 4096]));
    let back = waits_for(l, || t.dereg_mr(mr.lkey).unwrap());
    let back: Vec<u8> = back.downcast().unwrap();
    assert_eq!(back, vec![3u8; 4096]);
}

/// A peer's atomic on raw memory the application made read-only (or unmapped) after
/// registering it is refused with `Fault`, and changes nothing; it never raises a signal. The
/// old code probed only readability and then ran the CPU atomic: SIGSEGV, the whole process
/// gone.
#[test]
fn atomics_on_read_only_or_unmapped_raw_memory_fault() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let len = 4096;
    // SAFETY: a fresh private anonymous mapping owned by this test.
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
    // SAFETY: the mapping stays until the end of the test (the region is deregistered first);
    // its protection changes are what the test is about.
    let src = unsafe { MemSource::raw(p.cast(), len) };
    let mr = t.reg_mr(pd, src, LW | RA, None).unwrap();
    let c = ctx(pd);
    let faa = AtomicOp::FetchAdd { add: 5 };
    assert_eq!(t.atomic(c, mr.rkey, mr.iova + 8, faa), Ok(0));
    assert_eq!(t.atomic(c, mr.rkey, mr.iova + 8, faa), Ok(5));
    // SAFETY: changes the protection of the test's own mapping.
    assert_eq!(unsafe { libc::mprotect(p, len, libc::PROT_READ) }, 0);
    for op in [
        faa,
        AtomicOp::CompareSwap {
            compare: 10,
            swap: 1,
        },
        AtomicOp::CompareSwap {
            compare: 99,
            swap: 1,
        },
    ] {
        assert_eq!(
            t.atomic(c, mr.rkey, mr.iova + 8, op),
            Err(AccessError::Fault(mr.rkey)),
            "{op:?} on read-only memory"
        );
    }
    // SAFETY: reads 8 bytes of the (readable) mapping.
    let v = unsafe { core::ptr::read_volatile(p.cast::<u8>().add(8).cast::<u64>()) };
    assert_eq!(v, 10, "a refused atomic changed the memory");
    // SAFETY: unmaps the test's own mapping; the region is deregistered below.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    let r = t.atomic(c, mr.rkey, mr.iova + 16, faa);
    assert!(
        matches!(
            r,
            Err(AccessError::Fault(_) | AccessError::Invalidated(_) | AccessError::Suspended(_))
        ),
        "{r:?}"
    );
    let _ = t.dereg_mr(mr.lkey);
}

/// A file-backed region whose file the application truncates: every later access fails with
/// `Fault` instead of raising SIGBUS in the engine (the old code copied with `memcpy` from its
/// mapping). A file sealed against shrinking keeps plain copies and zero-copy lending. Device
/// memory's memfd cannot be resized by the application at all.
#[test]
fn truncated_files_fault_and_device_memory_is_sealed() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let c = ctx(pd);
    let f = memfd(16384);
    let keep = f.try_clone().unwrap();
    let fr = t
        .reg_mr(pd, MemSource::file(f, 4096, 8192), ALL, Some(0))
        .unwrap();
    t.write(c, fr.rkey, 8000, b"file", RW).unwrap();
    assert!(
        t.lend(c, fr.lkey, 0, 64, Access::NONE).unwrap().is_none(),
        "a truncatable file was lent"
    );
    keep.set_len(0).unwrap();
    let mut out = [0u8; 4];
    assert_eq!(
        t.read(c, fr.rkey, 8000, &mut out, RR),
        Err(AccessError::Fault(fr.rkey))
    );
    assert_eq!(
        t.write(c, fr.rkey, 100, b"x", RW),
        Err(AccessError::Fault(fr.rkey))
    );
    assert_eq!(
        t.atomic(c, fr.rkey, 64, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::Fault(fr.rkey))
    );
    t.dereg_mr(fr.lkey).unwrap();

    // Sealed against shrinking: plain copies, lent to the transmit path.
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: a NUL-terminated name; the returned fd is owned by the File below.
    let fd =
        unsafe { libc::memfd_create(c"s".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0);
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let sf = unsafe { std::fs::File::from_raw_fd(fd) };
    sf.set_len(8192).unwrap();
    // SAFETY: fcntl on the test's own descriptor.
    assert_eq!(
        unsafe { libc::fcntl(sf.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) },
        0
    );
    let sr = t
        .reg_mr(pd, MemSource::file(sf, 0, 8192), ALL, Some(0))
        .unwrap();
    assert!(t.lend(c, sr.lkey, 0, 64, Access::NONE).unwrap().is_some());
    t.dereg_mr(sr.lkey).unwrap();

    let d = t
        .reg_mr(pd, MemSource::device(8192, PageSize::Base), ALL, None)
        .unwrap();
    let dfd = t.device_memory_fd(d.lkey).unwrap();
    assert!(dfd.set_len(0).is_err(), "device memory could be truncated");
    assert!(
        dfd.set_len(1 << 20).is_err(),
        "device memory could be grown"
    );
    t.write(c, d.rkey, d.iova + 8191, &[1], RW).unwrap();
    t.dereg_mr(d.lkey).unwrap();
}

/// `warm` (the receive path's hint for the next receive buffer) touches nothing and reports
/// nothing: not for a bad key, a range out of bounds, another PD, nor raw memory the
/// application unmapped; a real access to that memory still faults and is counted.
#[test]
fn warming_a_buffer_is_a_silent_hint() {
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        watch: WatchMode::Off,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let other = t.alloc_pd().unwrap();
    let len = 2 * 4096;
    // SAFETY: a fresh anonymous mapping, ours alone.
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
    // SAFETY: the mapping is unmapped below while registered: exactly what raw regions allow.
    let raw = unsafe { MemSource::raw(p.cast(), len) };
    let r = t.reg_mr(pd, raw, ALL, None).unwrap();
    let faults = t.stats().access_faults;
    t.warm(ctx(pd), r.lkey, r.iova, 256);
    t.warm(ctx(pd), r.lkey ^ 0x100, r.iova, 256);
    t.warm(ctx(pd), r.lkey, r.iova + len as u64 - 8, 256);
    t.warm(ctx(other), r.lkey, r.iova, 256);
    // SAFETY: our own mapping.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    t.warm(ctx(pd), r.lkey, r.iova, 256);
    t.warm(ctx(pd), r.lkey, r.iova + 4096, 4096);
    assert_eq!(t.stats().access_faults, faults, "a hint is no access");
    assert!(t.write(ctx(pd), r.lkey, r.iova, &[1], LW).is_err());
    assert!(
        t.stats().access_faults > faults,
        "a real access to it faults"
    );
    t.dereg_mr(r.lkey).unwrap();
}

/// `lend_or_stage` (one lookup for a small payload by key, the transmit path's common case)
/// answers as `lend` where that lends, and as `stage` where it does not (raw memory, a window),
/// with `lend`'s errors.
#[test]
fn lend_or_stage_is_a_lend_or_else_a_staged_copy() {
    let t = table();
    let pd = t.alloc_pd().unwrap();
    let other = t.alloc_pd().unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 253) as u8).collect();
    let owned = t
        .reg_mr(pd, MemSource::owned(data.clone()), LW, None)
        .unwrap();
    let l = t
        .lend_or_stage(ctx(pd), owned.lkey, owned.iova + 5, 64, Access::NONE)
        .unwrap()
        .unwrap();
    // Lent where it lies: the bytes are the region's own.
    let region_ptr = owned.addr + 5;
    assert_eq!(l.iovec().iov_base as usize, region_ptr);
    assert_eq!(crc_of(&l), crc(&data[5..69]));
    drop(l);

    let mut buf = data.clone();
    // SAFETY: `buf` outlives the registration (deregistered below) and is not touched meanwhile.
    let raw = unsafe { MemSource::raw(buf.as_mut_ptr(), buf.len()) };
    let r = t.reg_mr(pd, raw, LW, None).unwrap();
    let l = t
        .lend_or_stage(ctx(pd), r.lkey, r.iova + 100, 8, Access::NONE)
        .unwrap()
        .expect("raw memory is staged");
    assert_ne!(l.iovec().iov_base as usize, buf.as_ptr() as usize + 100);
    assert_eq!(crc_of(&l), crc(&data[100..108]));
    drop(l);
    assert!(
        t.lend_or_stage(ctx(pd), r.lkey, r.iova, 0, Access::NONE)
            .unwrap()
            .is_none(),
        "nothing to stage"
    );
    assert!(
        t.lend_or_stage(ctx(pd), r.lkey, r.iova, 4096, Access::NONE)
            .unwrap()
            .is_some_and(|l| l.len() == 4096)
    );

    // The errors of `lend`.
    let both = |c, key, iova, len| {
        (
            t.lend_or_stage(c, key, iova, len, Access::NONE)
                .map(|l| l.is_some()),
            t.lend(c, key, iova, len, Access::NONE).map(|_| true),
        )
    };
    for (c, key, iova, len) in [
        (ctx(pd), r.lkey, r.iova + 4090, 7),
        (ctx(other), r.lkey, r.iova, 8),
        (ctx(pd), r.lkey ^ 0x100, r.iova, 8),
        (ctx(pd), owned.lkey, owned.iova + 4090, 7),
    ] {
        let (a, b) = both(c, key, iova, len);
        assert!(a.is_err(), "{a:?}");
        assert_eq!(a.unwrap_err(), b.unwrap_err());
    }
    t.dereg_mr(r.lkey).unwrap();
    t.dereg_mr(owned.lkey).unwrap();
    drop(buf);
}
