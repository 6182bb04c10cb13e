//! Memory windows, types 1 and 2: bind, range and rights, rebind, invalidation, QP binding.

use softrdma::mem::*;

const LW: Access = Access::LOCAL_WRITE;
const RW: Access = Access::REMOTE_WRITE;
const RR: Access = Access::REMOTE_READ;
const RA: Access = Access::REMOTE_ATOMIC;

struct Fix {
    t: MemoryTable,
    pd: u32,
    mr: MrInfo,
}

fn fix(mr_access: Access) -> Fix {
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 4096]),
            mr_access,
            Some(0x10_000),
        )
        .unwrap();
    Fix { t, pd, mr }
}

fn qp(pd: u32, qpn: u32) -> AccessCtx {
    AccessCtx { pd, qpn }
}

#[test]
fn type1_bind_range_rights_rebind() {
    let Fix { t, pd, mr } = fix(LW | Access::MW_BIND);
    let c = qp(pd, 1);
    let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(t.stats().windows, 1);
    // Unbound: the key names nothing usable.
    assert_eq!(
        t.check(c, mw, 0x10_000, 1, RR),
        Err(AccessError::InvalidKey(mw))
    );
    let rkey = t
        .bind_mw_type1(c, mw, mr.lkey, 0x10_100, 0x100, RR | RW)
        .unwrap();
    assert_ne!(rkey, mw, "bind changes the R_Key");
    // The slot stays (the low 16 bits of the index with the default table), the salt and tag
    // are drawn anew.
    assert_eq!(key_index(rkey) & 0xffff, key_index(mw) & 0xffff);
    assert_eq!(
        t.check(c, mw, 0x10_100, 1, RR),
        Err(AccessError::InvalidKey(mw))
    );
    // Inside the window's range and rights: any QP of the PD.
    t.write(qp(pd, 99), rkey, 0x10_1ff, &[4], RW).unwrap();
    let mut out = [0u8; 1];
    t.read(c, rkey, 0x10_1ff, &mut out, RR).unwrap();
    assert_eq!(out, [4]);
    // Outside the window (though inside the region), and rights it does not grant.
    assert_eq!(
        t.check(c, rkey, 0x10_0ff, 1, RR),
        Err(AccessError::OutOfBounds {
            key: rkey,
            iova: 0x10_0ff,
            len: 1
        })
    );
    assert_eq!(
        t.check(c, rkey, 0x10_1ff, 2, RR),
        Err(AccessError::OutOfBounds {
            key: rkey,
            iova: 0x10_1ff,
            len: 2
        })
    );
    assert_eq!(
        t.atomic(c, rkey, 0x10_100, AtomicOp::FetchAdd { add: 1 }),
        Err(AccessError::AccessDenied {
            key: rkey,
            needed: RA.0
        })
    );
    // A window key is not an L_Key.
    assert_eq!(
        t.check(c, rkey, 0x10_100, 1, Access::NONE),
        Err(AccessError::InvalidOperation(rkey))
    );
    // Another PD.
    let pd2 = t.alloc_pd().unwrap();
    assert_eq!(
        t.check(qp(pd2, 1), rkey, 0x10_100, 1, RR),
        Err(AccessError::WrongPd(rkey))
    );
    // The region cannot go while the window is bound.
    let e = t.dereg_mr(mr.lkey).unwrap_err();
    assert_eq!(
        e,
        MemError::RegionBusy {
            key: mr.lkey,
            windows: 1
        }
    );
    assert!(e.to_string().contains("busy"), "{e}");
    assert!(matches!(
        t.rereg_mr(mr.lkey, Rereg::default()),
        Err(RegError {
            error: MemError::RegionBusy { .. },
            ..
        })
    ));
    // Rebind (zero-based this time): new R_Key, the old one fails.
    let rkey2 = t
        .bind_mw_type1(c, rkey, mr.lkey, 0x10_800, 16, RR | Access::ZERO_BASED)
        .unwrap();
    assert_ne!(rkey2, rkey);
    assert_eq!(
        t.check(c, rkey, 0x10_100, 1, RR),
        Err(AccessError::InvalidKey(rkey))
    );
    assert_eq!(t.check(c, rkey2, 15, 1, RR), Ok(()));
    assert_eq!(
        t.check(c, rkey2, 16, 1, RR),
        Err(AccessError::OutOfBounds {
            key: rkey2,
            iova: 16,
            len: 1
        })
    );
    t.write(qp(pd, 1), mr.lkey, 0x10_80f, &[8], LW).unwrap();
    t.read(c, rkey2, 15, &mut out, RR).unwrap();
    assert_eq!(out, [8]);
    let info = t.query_mw(rkey2).unwrap();
    assert_eq!(info.bound.unwrap().mr_lkey, mr.lkey);
    // Type 1 windows are not invalidated by LOCAL_INV, nor by a peer.
    for by in [Invalidator::Local, Invalidator::Remote] {
        assert_eq!(
            t.invalidate(c, rkey2, by),
            Err(AccessError::InvalidOperation(rkey2))
        );
    }
    // Nor is a region under a bound window, by anyone.
    for by in [Invalidator::Local, Invalidator::Remote] {
        assert_eq!(
            t.invalidate(c, mr.lkey, by),
            Err(AccessError::InvalidOperation(mr.lkey))
        );
    }
    // A zero-length bind unbinds; then the region can go.
    let rkey3 = t.bind_mw_type1(c, rkey2, mr.lkey, 0, 0, RR).unwrap();
    assert_eq!(
        t.check(c, rkey2, 15, 1, RR),
        Err(AccessError::InvalidKey(rkey2))
    );
    assert_eq!(
        t.check(c, rkey3, 0, 0, RR),
        Err(AccessError::InvalidKey(rkey3))
    );
    t.dereg_mr(mr.lkey).unwrap();
    t.dealloc_mw(rkey3).unwrap();
    assert_eq!(t.stats().windows, 0);
    t.dealloc_pd(pd).unwrap();
}

#[test]
fn bind_checks_parent() {
    let Fix { t, pd, mr } = fix(LW | RR);
    let c = qp(pd, 1);
    let mw = t.alloc_mw(pd, MwType::Type1).unwrap();
    // No MW_BIND on the parent.
    assert_eq!(
        t.bind_mw_type1(c, mw, mr.lkey, 0x10_000, 8, RR),
        Err(AccessError::AccessDenied {
            key: mr.lkey,
            needed: Access::MW_BIND.0
        })
    );
    // Remote write through a window needs LOCAL_WRITE on the parent.
    let ro = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 64]),
            RR | Access::MW_BIND,
            Some(0),
        )
        .unwrap();
    assert_eq!(
        t.bind_mw_type1(c, mw, ro.lkey, 0, 8, RW),
        Err(AccessError::AccessDenied {
            key: ro.lkey,
            needed: LW.0
        })
    );
    assert!(t.bind_mw_type1(c, mw, ro.lkey, 0, 8, RR).is_ok());
    let mw = t
        .query_mw(t.alloc_mw(pd, MwType::Type1).unwrap())
        .unwrap()
        .rkey;
    // Range outside the parent, and wrapping.
    assert_eq!(
        t.bind_mw_type1(c, mw, ro.lkey, 60, 8, RR),
        Err(AccessError::OutOfBounds {
            key: ro.lkey,
            iova: 60,
            len: 8
        })
    );
    assert_eq!(
        t.bind_mw_type1(c, mw, ro.lkey, u64::MAX, 2, RR),
        Err(AccessError::OutOfBounds {
            key: ro.lkey,
            iova: u64::MAX,
            len: 2
        })
    );
    // Bad rights for a window, wrong PD, unknown parent, a type 2 window through the type 1 verb.
    assert_eq!(
        t.bind_mw_type1(c, mw, ro.lkey, 0, 8, Access::MW_BIND),
        Err(AccessError::InvalidOperation(mw))
    );
    let pd2 = t.alloc_pd().unwrap();
    assert_eq!(
        t.bind_mw_type1(qp(pd2, 1), mw, ro.lkey, 0, 8, RR),
        Err(AccessError::WrongPd(mw))
    );
    assert_eq!(
        t.bind_mw_type1(c, mw, ro.lkey ^ 0x100, 0, 8, RR),
        Err(AccessError::InvalidKey(ro.lkey ^ 0x100))
    );
    let mw2 = t.alloc_mw(pd, MwType::Type2).unwrap();
    assert_eq!(
        t.bind_mw_type1(c, mw2, ro.lkey, 0, 8, RR),
        Err(AccessError::InvalidOperation(mw2))
    );
    // Parent invalidated or suspended.
    let other = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 64]),
            LW | Access::MW_BIND,
            Some(0),
        )
        .unwrap();
    t.suspend_mr(other.lkey).unwrap();
    assert_eq!(
        t.bind_mw_type1(c, mw, other.lkey, 0, 8, RR),
        Err(AccessError::Suspended(other.lkey))
    );
    t.resume_mr(other.lkey, None).unwrap();
    t.invalidate_mr(other.lkey).unwrap();
    assert_eq!(
        t.bind_mw_type1(c, mw, other.lkey, 0, 8, RR),
        Err(AccessError::Invalidated(other.lkey))
    );
    let _ = mr;
}

#[test]
fn type2_bound_to_one_qp_and_invalidated() {
    let Fix { t, pd, mr } = fix(LW | Access::MW_BIND);
    let (q1, q2) = (qp(pd, 11), qp(pd, 22));
    let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
    // ibv_inc_rkey: new R_Key differs in the low 8 bits only.
    let inc = |k: u32| (k & !0xff) | ((k + 1) & 0xff);
    let r1 = inc(mw);
    assert_eq!(
        t.bind_mw(
            q1,
            softrdma::mem::MwBind {
                mw_key: mw,
                new_rkey: 0x1234_5600 | (r1 & 0xff),
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 64,
                access: RW
            }
        ),
        Err(AccessError::InvalidOperation(mw))
    );
    t.bind_mw(
        q1,
        softrdma::mem::MwBind {
            mw_key: mw,
            new_rkey: r1,
            mr_lkey: mr.lkey,
            iova: 0x10_000,
            len: 64,
            access: RW | RR | RA,
        },
    )
    .unwrap();
    assert_eq!(
        t.check(q1, mw, 0x10_000, 1, RW),
        Err(AccessError::InvalidKey(mw))
    );
    t.write(q1, r1, 0x10_000, &[1, 2, 3], RW).unwrap();
    assert_eq!(
        t.atomic(q1, r1, 0x10_008, AtomicOp::FetchAdd { add: 2 }),
        Ok(0)
    );
    // Refused on another QP.
    assert_eq!(
        t.write(q2, r1, 0x10_000, &[9], RW),
        Err(AccessError::WrongQp(r1))
    );
    assert_eq!(
        t.check(q2, r1, 0x10_000, 1, RR),
        Err(AccessError::WrongQp(r1))
    );
    assert_eq!(
        t.invalidate(q2, r1, Invalidator::Remote),
        Err(AccessError::WrongQp(r1))
    );
    // Out of its range.
    assert_eq!(
        t.check(q1, r1, 0x10_040, 1, RR),
        Err(AccessError::OutOfBounds {
            key: r1,
            iova: 0x10_040,
            len: 1
        })
    );
    // Bound windows cannot be bound again before invalidation.
    assert_eq!(
        t.bind_mw(
            q1,
            softrdma::mem::MwBind {
                mw_key: r1,
                new_rkey: inc(r1),
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 8,
                access: RR
            }
        ),
        Err(AccessError::InvalidOperation(r1))
    );
    assert!(matches!(
        t.dereg_mr(mr.lkey),
        Err(MemError::RegionBusy { windows: 1, .. })
    ));
    // LOCAL_INV (or SEND with Invalidate) through the bound QP.
    t.invalidate(q1, r1, Invalidator::Remote).unwrap();
    assert_eq!(
        t.check(q1, r1, 0x10_000, 1, RW),
        Err(AccessError::Invalidated(r1))
    );
    assert_eq!(
        t.invalidate(q1, r1, Invalidator::Local),
        Err(AccessError::Invalidated(r1))
    );
    // Rebind, now on QP 22 with a new key; the old key is now simply invalid.
    let r2 = inc(r1);
    t.bind_mw(
        q2,
        softrdma::mem::MwBind {
            mw_key: r1,
            new_rkey: r2,
            mr_lkey: mr.lkey,
            iova: 0x10_100,
            len: 8,
            access: RR,
        },
    )
    .unwrap();
    assert_eq!(
        t.check(q1, r1, 0x10_000, 1, RW),
        Err(AccessError::InvalidKey(r1))
    );
    assert_eq!(
        t.check(q1, r2, 0x10_100, 1, RR),
        Err(AccessError::WrongQp(r2))
    );
    assert_eq!(t.check(q2, r2, 0x10_100, 8, RR), Ok(()));
    assert_eq!(t.query_mw(r2).unwrap().bound.unwrap().qpn, Some(22));
    // Parent suspended: window accesses are suspended too.
    t.suspend_mr(mr.lkey).unwrap();
    assert_eq!(
        t.check(q2, r2, 0x10_100, 8, RR),
        Err(AccessError::Suspended(r2))
    );
    t.resume_mr(mr.lkey, None).unwrap();
    // Deallocating the window releases the region.
    t.dealloc_mw(r2).unwrap();
    let buf: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(&buf[..3], &[1, 2, 3]);
    assert_eq!(buf[8], 2);
}

#[test]
fn type2_refused_on_unbound_or_foreign() {
    let Fix { t, pd, mr } = fix(LW | Access::MW_BIND);
    let q = qp(pd, 5);
    let mw = t.alloc_mw(pd, MwType::Type2).unwrap();
    // Never bound: invalid key; LOCAL_INV of it: invalid key.
    assert_eq!(
        t.check(q, mw, 0x10_000, 1, RR),
        Err(AccessError::InvalidKey(mw))
    );
    assert_eq!(
        t.invalidate(q, mw, Invalidator::Local),
        Err(AccessError::InvalidKey(mw))
    );
    // Type 2 bind needs the window's PD.
    let pd2 = t.alloc_pd().unwrap();
    assert_eq!(
        t.bind_mw(
            qp(pd2, 5),
            softrdma::mem::MwBind {
                mw_key: mw,
                new_rkey: mw ^ 1,
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 8,
                access: RR
            }
        ),
        Err(AccessError::WrongPd(mw))
    );
    // A type 1 window is bound by a work request (ibv_bind_mw) only with a key drawn for it
    // (`draw_type1_key`, its own slot); a key of another slot is refused.
    let t1 = t.alloc_mw(pd, MwType::Type1).unwrap();
    assert_eq!(
        t.bind_mw(
            q,
            softrdma::mem::MwBind {
                mw_key: t1,
                new_rkey: mr.lkey,
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 8,
                access: RR
            }
        ),
        Err(AccessError::InvalidOperation(t1))
    );
    let k = t.draw_type1_key(t1).unwrap();
    assert_ne!(k, t1);
    assert_eq!(
        t.bind_mw(
            q,
            softrdma::mem::MwBind {
                mw_key: t1,
                new_rkey: k,
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 8,
                access: RR
            }
        ),
        Ok(())
    );
    assert!(t.check(q, k, 0x10_000, 8, RR).is_ok());
    assert_eq!(
        t.check(q, t1, 0x10_000, 1, RR),
        Err(AccessError::InvalidKey(t1))
    );
    // Rebound in place with the next key; a zero length unbinds.
    let k2 = t.draw_type1_key(k).unwrap();
    assert_eq!(
        t.bind_mw(
            q,
            softrdma::mem::MwBind {
                mw_key: k,
                new_rkey: k2,
                mr_lkey: mr.lkey,
                iova: 0x10_008,
                len: 8,
                access: RR
            }
        ),
        Ok(())
    );
    assert_eq!(
        t.check(q, k, 0x10_000, 1, RR),
        Err(AccessError::InvalidKey(k))
    );
    let k3 = t.draw_type1_key(k2).unwrap();
    assert_eq!(
        t.bind_mw(
            q,
            softrdma::mem::MwBind {
                mw_key: k2,
                new_rkey: k3,
                mr_lkey: 0,
                iova: 0,
                len: 0,
                access: RR
            }
        ),
        Ok(())
    );
    assert!(t.check(q, k3, 0x10_008, 1, RR).is_err());
    assert_eq!(t.draw_type1_key(mw), Err(AccessError::InvalidOperation(mw)));
    // A region key cannot be bound as a window.
    assert_eq!(
        t.bind_mw(
            q,
            softrdma::mem::MwBind {
                mw_key: mr.lkey,
                new_rkey: mr.lkey ^ 1,
                mr_lkey: mr.lkey,
                iova: 0x10_000,
                len: 8,
                access: RR
            }
        ),
        Err(AccessError::InvalidKey(mr.lkey))
    );
}
