//! Lending registered bytes to the transmit path (zero-copy sends): what can be lent, the
//! errors, and that deregistration, suspension, a new backing and invalidation wait for
//! outstanding loans before they let go of the memory.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use softrdma::mem::*;

const LW: Access = Access::LOCAL_WRITE;

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
    let lend = || {
        t.lend(ctx(pd), mr.lkey, mr.iova, 4096, Access::NONE)
            .unwrap()
            .unwrap()
    };

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
    t.rereg_mr(mr.lkey, Rereg::default()).unwrap();
    let l = lend();
    let (_, old) = waits_for(l, || {
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
    let l = lend();
    assert_eq!(crc_of(&l), crc(&[3u8; 4096]));
    let back = waits_for(l, || t.dereg_mr(mr.lkey).unwrap());
    let back: Vec<u8> = back.downcast().unwrap();
    assert_eq!(back, vec![3u8; 4096]);
}
