//! The memory table against a model: arbitrary sequences of registrations (owned buffers, raw
//! read-write and read-only memory), re-registrations, deregistrations, invalidations,
//! suspend/resume, windows of both types (alloc, bind, invalidate, dealloc) and accesses
//! through [`MemoryAccess`] (check, read, write, lend, atomics) with any key, PD, QP, range and
//! rights. The model is a map of the keys handed out to what they name (PD, range, rights,
//! state, bytes); every verdict (the error kind included) and every byte read must agree with
//! it, and so must the buffer deregistration hands back.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softrdma::mem::{
    Access, AccessCtx, AccessError, AtomicOp, Invalidator, MemConfig, MemSource, MemoryAccess,
    MemoryTable, MwType, PinMode, Rereg, WatchMode, key_index,
};
use softrdma_fuzz::{ATOMIC_READONLY_RAW, skip};

const MAX_KEYS: u32 = 12;

/// The slot a key names (the low bits of its index; the rest is salt).
fn slot(key: u32) -> u32 {
    key_index(key) & ((1 << (32 - MAX_KEYS.leading_zeros())) - 1)
}

/// Whether `key` names no slot of the table.
fn bad_slot(key: u32) -> bool {
    slot(key) == 0 || slot(key) > MAX_KEYS
}
const RIGHTS: u32 = 1 | 2 | 4 | 8 | 16;
const REMOTE: u32 = 2 | 4 | 8;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Kind {
    Owned,
    Raw,
    RawReadOnly,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum IovaSel {
    Host,
    At(u32),
    Top(u8),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeyPick {
    Obj(u8),
    Retagged(u8, u8),
    Random(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum VaSel {
    Start,
    Off(u16),
    End,
    Before(u8),
    Any(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum AccessOp {
    Check,
    Read,
    Write(u8),
    Lend,
    CompareSwap(u64, u64),
    FetchAdd(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Reg {
        pd: u8,
        kind: Kind,
        len: u16,
        access: u16,
        iova: IovaSel,
    },
    Dereg(u8),
    Rereg {
        obj: u8,
        pd: Option<u8>,
        access: Option<u16>,
        translation: Option<(Kind, u16, IovaSel)>,
    },
    Invalidate(u8),
    RemoteInvalidate {
        key: KeyPick,
        pd: u8,
        qpn: bool,
    },
    Suspend(u8),
    Resume(u8),
    AllocMw {
        pd: u8,
        type2: bool,
    },
    DeallocMw(u8),
    Bind {
        mw: KeyPick,
        mr: KeyPick,
        pd: u8,
        qpn: bool,
        va: VaSel,
        len: u16,
        access: u8,
        tag: u8,
    },
    Access {
        key: KeyPick,
        pd: u8,
        qpn: bool,
        op: AccessOp,
        va: VaSel,
        len: u16,
        need: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Valid,
    Suspended,
    Invalidated,
}

#[derive(Clone, Debug)]
struct MrModel {
    pd: u32,
    access: u32,
    iova: u64,
    addr: usize,
    data: Vec<u8>,
    status: Status,
    windows: u32,
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
struct BindModel {
    parent: usize,
    start: u64,
    len: u64,
    parent_iova: u64,
    access: u32,
    qpn: Option<u32>,
}

#[derive(Clone, Debug)]
struct MwModel {
    pd: u32,
    ty: MwType,
    binding: Option<BindModel>,
    invalidated: bool,
}

#[derive(Clone, Debug)]
enum Obj {
    Mr(MrModel),
    Mw(MwModel),
    Gone,
}

/// A mapping the harness made for raw memory (unmapped at the end, after the table).
struct Mapping(*mut u8, usize);

struct World {
    mem: MemoryTable,
    pds: [u32; 3],
    /// Every key handed out, with what it names now.
    objs: Vec<(u32, Obj)>,
    maps: Vec<Mapping>,
    checked: bool,
}

fn map(len: usize, read_only: bool) -> Mapping {
    let n = len.max(1);
    // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    if read_only {
        // SAFETY: the mapping just made, whole.
        assert_eq!(unsafe { libc::mprotect(p, n, libc::PROT_READ) }, 0);
    }
    Mapping(p.cast(), n)
}

fn valid_mr_access(a: u32) -> Option<u32> {
    if a & !(0x3ff | Access::OPTIONAL_RANGE) != 0 {
        return None;
    }
    let a = a & 0x3ff;
    if a & (2 | 8) != 0 && a & 1 == 0 {
        return None;
    }
    Some(a)
}

fn grants(have: u32, need: u32) -> bool {
    have & need & RIGHTS == need & RIGHTS
}

fn offset_in(start: u64, size: u64, iova: u64, len: u64) -> Option<u64> {
    let off = iova.checked_sub(start)?;
    if off > size || len > size - off {
        return None;
    }
    Some(off)
}

fn range_fits(iova: u64, len: u64) -> bool {
    len == 0 || iova.checked_add(len - 1).is_some()
}

fn same<T, U>(a: &Result<T, AccessError>, b: &Result<U, AccessError>) -> bool {
    match (a, b) {
        (Ok(_), Ok(_)) => true,
        (Err(x), Err(y)) => core::mem::discriminant(x) == core::mem::discriminant(y),
        _ => false,
    }
}

impl World {
    fn new() -> World {
        let mem = MemoryTable::new(MemConfig {
            pin_mode: PinMode::OnDemand,
            max_keys: MAX_KEYS,
            max_pds: 4,
            watch: WatchMode::Off,
            ..MemConfig::default()
        })
        .unwrap();
        let pds = [
            mem.alloc_pd().unwrap(),
            mem.alloc_pd().unwrap(),
            mem.alloc_pd().unwrap(),
        ];
        let checked = mem.checked_copy();
        World {
            mem,
            pds,
            objs: Vec::new(),
            maps: Vec::new(),
            checked,
        }
    }

    fn pd(&self, i: u8) -> u32 {
        match usize::from(i) % 4 {
            3 => self.pds[2] + 1000,
            i => self.pds[i],
        }
    }

    fn live_keys(&self) -> usize {
        self.objs
            .iter()
            .filter(|o| !matches!(o.1, Obj::Gone))
            .count()
    }

    fn pick(&self, k: KeyPick) -> u32 {
        match k {
            KeyPick::Obj(i) if !self.objs.is_empty() => {
                self.objs[usize::from(i) % self.objs.len()].0
            }
            KeyPick::Retagged(i, t) if !self.objs.is_empty() => {
                (self.objs[usize::from(i) % self.objs.len()].0 & !0xff) | u32::from(t)
            }
            KeyPick::Random(v) => v,
            _ => 0,
        }
    }

    /// The object a key names now (the newest one handed this exact key).
    fn find(&self, key: u32) -> Option<usize> {
        self.objs
            .iter()
            .rposition(|o| o.0 == key && !matches!(o.1, Obj::Gone))
    }

    fn obj_index(&self, i: u8) -> Option<usize> {
        (!self.objs.is_empty()).then(|| usize::from(i) % self.objs.len())
    }

    fn source(&mut self, kind: Kind, len: usize, fill: u8) -> (MemSource, Vec<u8>) {
        match kind {
            Kind::Owned => {
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                (MemSource::owned(data.clone()), data)
            }
            Kind::Raw | Kind::RawReadOnly => {
                let ro = matches!(kind, Kind::RawReadOnly);
                let m = map(len, ro);
                let p = m.0;
                self.maps.push(m);
                // SAFETY: a mapping of at least `len` bytes the harness unmaps only after the
                // table is dropped.
                (unsafe { MemSource::raw(p, len) }, vec![0u8; len])
            }
        }
    }

    fn iova(sel: IovaSel) -> Option<u64> {
        match sel {
            IovaSel::Host => None,
            IovaSel::At(v) => Some(u64::from(v) << 8),
            IovaSel::Top(b) => Some(u64::MAX - u64::from(b)),
        }
    }

    fn reg(&mut self, pd: u8, kind: Kind, len: u16, access: u16, iova: IovaSel) {
        let len = usize::from(len) % 4097;
        let pd = self.pd(pd);
        let access = u32::from(access) | (u32::from(access & 0x8000) << 15);
        let iova = Self::iova(iova);
        let (src, data) = self.source(kind, len, len as u8);
        let r = self.mem.reg_mr(pd, src, Access(access), iova);
        let want = valid_mr_access(access).filter(|_| {
            iova.is_none_or(|i| range_fits(i, len as u64))
                && pd != self.pds[2] + 1000
                && self.live_keys() < MAX_KEYS as usize
        });
        match (r, want) {
            (Ok(info), Some(a)) => {
                assert_eq!(info.length, len as u64);
                assert_eq!(info.access.0, a);
                let want_iova = if a & Access::ZERO_BASED.0 != 0 {
                    0
                } else {
                    iova.unwrap_or(info.addr as u64)
                };
                assert_eq!(info.iova, want_iova);
                assert!(
                    self.find(info.lkey).is_none(),
                    "reg_mr handed out a live key"
                );
                self.objs.push((
                    info.lkey,
                    Obj::Mr(MrModel {
                        pd,
                        access: a,
                        iova: info.iova,
                        addr: info.addr,
                        data,
                        status: Status::Valid,
                        windows: 0,
                        kind,
                    }),
                ));
            }
            (Err(_), None) => {}
            (r, w) => panic!("reg_mr: got {:?}, model {w:?}", r.map(|i| i.lkey)),
        }
    }

    fn mr(&mut self, i: usize) -> Option<&mut MrModel> {
        match &mut self.objs[i].1 {
            Obj::Mr(m) => Some(m),
            _ => None,
        }
    }

    fn dereg(&mut self, i: u8) {
        let Some(i) = self.obj_index(i) else { return };
        let key = self.objs[i].0;
        let r = self.mem.dereg_mr(key);
        let want = self.mr(i).map(|m| m.windows == 0);
        match (r, want) {
            (Ok(ret), Some(true)) => {
                let Obj::Mr(m) = core::mem::replace(&mut self.objs[i].1, Obj::Gone) else {
                    unreachable!()
                };
                if matches!(m.kind, Kind::Owned) {
                    let v: Vec<u8> = ret.downcast().expect("an owned Vec comes back");
                    assert!(v == m.data, "deregistration handed back other bytes");
                }
            }
            (Err(_), Some(false) | None) => {}
            (r, w) => panic!("dereg_mr({key:#x}): got {:?}, model {w:?}", r.is_ok()),
        }
    }

    fn rereg(
        &mut self,
        obj: u8,
        pd: Option<u8>,
        access: Option<u16>,
        translation: Option<(Kind, u16, IovaSel)>,
    ) {
        let Some(i) = self.obj_index(obj) else { return };
        let key = self.objs[i].0;
        let pd = pd.map(|p| self.pd(p));
        let access = access.map(|a| u32::from(a) | (u32::from(a & 0x8000) << 15));
        let tr = translation.map(|(k, l, s)| {
            let len = usize::from(l) % 4097;
            let (src, data) = self.source(k, len, l as u8 ^ 0x5a);
            (src, Self::iova(s), data, k)
        });
        let (src, new_data) = match tr {
            Some((s, iova, d, k)) => (Some((s, iova)), Some((d, k))),
            None => (None, None),
        };
        let r = self.mem.rereg_mr(
            key,
            Rereg {
                translation: src,
                pd,
                access: access.map(Access),
            },
        );
        let want = self.mr(i).cloned().and_then(|m| {
            if m.windows > 0 {
                return None;
            }
            let a = valid_mr_access(access.unwrap_or(m.access))?;
            if let (Some((d, _)), Some(Some(iova))) =
                (&new_data, translation.map(|t| Self::iova(t.2)))
                && !range_fits(iova, d.len() as u64)
            {
                return None;
            }
            if pd.is_some_and(|p| p == self.pds[2] + 1000) {
                return None;
            }
            Some(a)
        });
        match (r, want) {
            (Ok((info, _old)), Some(a)) => {
                let m = self.mr(i).unwrap();
                // A valid region whose memory stays keeps its key (as rxe and mlx5 do); a new
                // translation, or an invalidated or suspended region, gets a new one.
                let keeps = new_data.is_none() && m.status == Status::Valid;
                m.access = a;
                if let Some(p) = pd {
                    m.pd = p;
                }
                if let Some((d, k)) = new_data {
                    m.data = d;
                    m.kind = k;
                }
                m.iova = info.iova;
                m.addr = info.addr;
                assert_eq!(info.length, m.data.len() as u64);
                let ctx = AccessCtx { pd: m.pd, qpn: 1 };
                m.status = Status::Valid;
                if keeps {
                    assert_eq!(
                        info.lkey, key,
                        "rereg_mr of the same memory changed the key"
                    );
                } else {
                    // A new key; the old one (invalidated or not) is dead.
                    assert_ne!(info.lkey, key, "rereg_mr kept the key");
                    assert_eq!(
                        self.mem.check(ctx, key, info.iova, 0, Access::NONE),
                        Err(AccessError::InvalidKey(key)),
                        "the key before rereg_mr still answers"
                    );
                }
                self.objs[i].0 = info.lkey;
            }
            (Err(_), None) => {}
            (r, w) => panic!("rereg_mr({key:#x}): got {:?}, model {w:?}", r.is_ok()),
        }
    }

    fn status_op(&mut self, i: u8, op: u8) {
        let Some(i) = self.obj_index(i) else { return };
        let key = self.objs[i].0;
        let (r, next) = match op {
            0 => (
                self.mem.invalidate_mr(key),
                self.mr(i).map(|_| Status::Invalidated),
            ),
            1 => (
                self.mem.suspend_mr(key),
                self.mr(i)
                    .filter(|m| m.status != Status::Invalidated)
                    .map(|_| Status::Suspended),
            ),
            _ => (
                self.mem
                    .resume_mr(key, None)
                    .map(|_| ())
                    .map_err(|e| e.error),
                self.mr(i)
                    .filter(|m| m.status == Status::Suspended)
                    .map(|_| Status::Valid),
            ),
        };
        match (r, next) {
            (Ok(()), Some(s)) => self.mr(i).unwrap().status = s,
            (Err(_), None) => {}
            (r, w) => panic!("status op {op} on {key:#x}: got {r:?}, model {w:?}"),
        }
    }

    fn remote_invalidate(&mut self, key: u32, ctx: AccessCtx) {
        let r = self.mem.invalidate(ctx, key, Invalidator::Remote);
        let i = self.find(key);
        let want: Result<(), AccessError> = match i.map(|i| self.objs[i].1.clone()) {
            _ if bad_slot(key) => Err(AccessError::InvalidKey(key)),
            None => Err(AccessError::InvalidKey(key)),
            Some(Obj::Mr(m)) if m.pd != ctx.pd => Err(AccessError::WrongPd(key)),
            // A peer never invalidates a region.
            Some(Obj::Mr(_)) => Err(AccessError::InvalidOperation(key)),
            Some(Obj::Mw(w)) if w.pd != ctx.pd => Err(AccessError::WrongPd(key)),
            Some(Obj::Mw(w)) if w.ty != MwType::Type2 => Err(AccessError::InvalidOperation(key)),
            Some(Obj::Mw(w)) => match w.binding {
                None if w.invalidated => Err(AccessError::Invalidated(key)),
                None => Err(AccessError::InvalidKey(key)),
                Some(b) if b.qpn != Some(ctx.qpn) => Err(AccessError::WrongQp(key)),
                Some(_) => Ok(()),
            },
            Some(Obj::Gone) => unreachable!(),
        };
        assert!(
            same(&r, &want),
            "invalidate({key:#x}, {ctx:?}): got {r:?}, model {want:?}"
        );
        if r.is_ok() {
            let i = i.unwrap();
            if let Some(m) = self.mr(i) {
                m.status = Status::Invalidated;
            } else {
                self.unbind(i);
                if let Obj::Mw(w) = &mut self.objs[i].1 {
                    w.invalidated = true;
                }
            }
        }
    }

    fn unbind(&mut self, i: usize) {
        let parent = match &mut self.objs[i].1 {
            Obj::Mw(w) => w.binding.take().map(|b| b.parent),
            _ => None,
        };
        if let Some(p) = parent
            && let Some(m) = self.mr(p)
        {
            m.windows -= 1;
        }
    }

    fn alloc_mw(&mut self, pd: u8, type2: bool) {
        let pd = self.pd(pd);
        let ty = if type2 { MwType::Type2 } else { MwType::Type1 };
        let r = self.mem.alloc_mw(pd, ty);
        let want = pd != self.pds[2] + 1000 && self.live_keys() < MAX_KEYS as usize;
        match (r, want) {
            (Ok(key), true) => {
                assert!(self.find(key).is_none(), "alloc_mw handed out a live key");
                self.objs.push((
                    key,
                    Obj::Mw(MwModel {
                        pd,
                        ty,
                        binding: None,
                        invalidated: false,
                    }),
                ));
            }
            (Err(_), false) => {}
            (r, w) => panic!("alloc_mw: got {r:?}, model {w}"),
        }
    }

    fn dealloc_mw(&mut self, i: u8) {
        let Some(i) = self.obj_index(i) else { return };
        let key = self.objs[i].0;
        let r = self.mem.dealloc_mw(key);
        let want = matches!(self.objs[i].1, Obj::Mw(_));
        match (r, want) {
            (Ok(()), true) => {
                self.unbind(i);
                self.objs[i].1 = Obj::Gone;
            }
            (Err(_), false) => {}
            (r, w) => panic!("dealloc_mw({key:#x}): got {r:?}, model {w}"),
        }
    }

    /// The model's verdict on binding window `mw` to `[iova, iova+len)` of region `mr`.
    fn bind_model(
        &self,
        ctx: AccessCtx,
        (mw, mr): (u32, u32),
        (iova, len): (u64, u64),
        access: u32,
        type2: Option<u32>,
    ) -> Result<Option<BindModel>, AccessError> {
        if bad_slot(mw) {
            return Err(AccessError::InvalidKey(mw));
        }
        if let Some(nk) = type2
            && key_index(nk) != key_index(mw)
        {
            return Err(AccessError::InvalidOperation(mw));
        }
        if slot(mr) == slot(mw) {
            return Err(AccessError::InvalidKey(mr));
        }
        let Some(Obj::Mw(w)) = self.find(mw).map(|i| &self.objs[i].1) else {
            return Err(AccessError::InvalidKey(mw));
        };
        let want_ty = if type2.is_some() {
            MwType::Type2
        } else {
            MwType::Type1
        };
        if w.ty != want_ty {
            return Err(AccessError::InvalidOperation(mw));
        }
        if w.pd != ctx.pd {
            return Err(AccessError::WrongPd(mw));
        }
        if type2.is_some() && w.binding.is_some() {
            return Err(AccessError::InvalidOperation(mw));
        }
        if type2.is_none() && len == 0 {
            return Ok(None);
        }
        if bad_slot(mr) {
            return Err(AccessError::InvalidKey(mr));
        }
        let Some(pi) = self.find(mr) else {
            return Err(AccessError::InvalidKey(mr));
        };
        let Obj::Mr(p) = &self.objs[pi].1 else {
            return Err(AccessError::InvalidKey(mr));
        };
        // LOCAL_WRITE (1) means nothing for a window and is ignored.
        if access & !(REMOTE | 32 | 1 | Access::OPTIONAL_RANGE) != 0 {
            return Err(AccessError::InvalidOperation(mw));
        }
        let access = access & (REMOTE | 32);
        if p.pd != w.pd {
            return Err(AccessError::WrongPd(mr));
        }
        match p.status {
            Status::Valid => {}
            Status::Invalidated => return Err(AccessError::Invalidated(mr)),
            Status::Suspended => return Err(AccessError::Suspended(mr)),
        }
        if p.access & 16 == 0 || (access & (2 | 8) != 0 && p.access & 1 == 0) {
            return Err(AccessError::AccessDenied { key: mr, needed: 0 });
        }
        if !range_fits(iova, len) || offset_in(p.iova, p.data.len() as u64, iova, len).is_none() {
            return Err(AccessError::OutOfBounds { key: mr, iova, len });
        }
        Ok(Some(BindModel {
            parent: pi,
            start: if access & 32 != 0 { 0 } else { iova },
            len,
            parent_iova: iova,
            access,
            qpn: type2.map(|_| ctx.qpn),
        }))
    }

    fn bind(
        &mut self,
        (mw, mr): (u32, u32),
        ctx: AccessCtx,
        (va, len): (VaSel, u16),
        access: u8,
        tag: u8,
    ) {
        let Some(wi) = self.find(mw) else {
            // Still exercise the error paths with a key of nothing.
            let r =
                self.mem
                    .bind_mw_type1(ctx, mw, mr, 0, u64::from(len), Access(u32::from(access)));
            assert!(r.is_err(), "bind of the unknown window {mw:#x} succeeded");
            return;
        };
        let type2 = matches!(&self.objs[wi].1, Obj::Mw(w) if w.ty == MwType::Type2);
        let iova = self.va(mr, va);
        let len = u64::from(len) % 4200;
        let access = u32::from(access & 0x3f);
        if type2 {
            let nk = (mw & !0xff) | u32::from(tag);
            let want = self.bind_model(ctx, (mw, mr), (iova, len), access, Some(nk));
            let r = self.mem.bind_mw(
                ctx,
                softrdma::mem::MwBind {
                    mw_key: mw,
                    new_rkey: nk,
                    mr_lkey: mr,
                    iova,
                    len,
                    access: Access(access),
                },
            );
            assert!(
                same(&r, &want),
                "bind type 2 {mw:#x} on {mr:#x} [{iova:#x}+{len}] {access:#x} {ctx:?}: got {r:?}, model {want:?}"
            );
            if let Ok(b) = want {
                self.set_binding(wi, nk, b);
            }
        } else {
            let want = self.bind_model(ctx, (mw, mr), (iova, len), access, None);
            let r = self
                .mem
                .bind_mw_type1(ctx, mw, mr, iova, len, Access(access));
            assert!(
                same(&r, &want),
                "bind type 1 {mw:#x} on {mr:#x} [{iova:#x}+{len}] {access:#x} {ctx:?}: got {r:?}, model {want:?}"
            );
            if let (Ok(nk), Ok(b)) = (r, want) {
                assert_eq!(slot(nk), slot(mw), "a rebind left its slot");
                self.set_binding(wi, nk, b);
            }
        }
    }

    fn set_binding(&mut self, wi: usize, key: u32, b: Option<BindModel>) {
        self.unbind(wi);
        if let Some(b) = b
            && let Some(m) = self.mr(b.parent)
        {
            m.windows += 1;
        }
        self.objs[wi].0 = key;
        if let Obj::Mw(w) = &mut self.objs[wi].1 {
            w.binding = b;
            w.invalidated = false;
        }
    }

    fn va(&self, key: u32, v: VaSel) -> u64 {
        let (start, len) = match self.find(key).map(|i| &self.objs[i].1) {
            Some(Obj::Mr(m)) => (m.iova, m.data.len() as u64),
            Some(Obj::Mw(MwModel {
                binding: Some(b), ..
            })) => (b.start, b.len),
            _ => (0, 0),
        };
        match v {
            VaSel::Start => start,
            VaSel::Off(o) => start.wrapping_add(u64::from(o) % (len + 16)),
            VaSel::End => start.wrapping_add(len),
            VaSel::Before(b) => start.wrapping_sub(u64::from(b)),
            VaSel::Any(a) => a,
        }
    }

    /// The model's resolution of an access: (region index, offset in its bytes, host address).
    fn resolve(
        &self,
        ctx: AccessCtx,
        key: u32,
        iova: u64,
        len: u64,
        need: u32,
    ) -> Result<(usize, usize, usize), AccessError> {
        if bad_slot(key) {
            return Err(AccessError::InvalidKey(key));
        }
        let Some(i) = self.find(key) else {
            return Err(AccessError::InvalidKey(key));
        };
        match &self.objs[i].1 {
            Obj::Mr(m) => {
                if m.pd != ctx.pd {
                    return Err(AccessError::WrongPd(key));
                }
                if m.status == Status::Invalidated {
                    return Err(AccessError::Invalidated(key));
                }
                if !grants(m.access, need) {
                    return Err(AccessError::AccessDenied { key, needed: 0 });
                }
                let off = offset_in(m.iova, m.data.len() as u64, iova, len)
                    .ok_or(AccessError::OutOfBounds { key, iova, len })?;
                if m.status == Status::Suspended {
                    return Err(AccessError::Suspended(key));
                }
                Ok((i, off as usize, m.addr + off as usize))
            }
            Obj::Mw(w) => {
                if w.pd != ctx.pd {
                    return Err(AccessError::WrongPd(key));
                }
                let Some(b) = w.binding else {
                    return Err(if w.invalidated {
                        AccessError::Invalidated(key)
                    } else {
                        AccessError::InvalidKey(key)
                    });
                };
                if b.qpn.is_some_and(|q| q != ctx.qpn) {
                    return Err(AccessError::WrongQp(key));
                }
                if need & REMOTE == 0 {
                    return Err(AccessError::InvalidOperation(key));
                }
                if !grants(b.access, need) {
                    return Err(AccessError::AccessDenied { key, needed: 0 });
                }
                let off = offset_in(b.start, b.len, iova, len).ok_or(AccessError::OutOfBounds {
                    key,
                    iova,
                    len,
                })?;
                let Obj::Mr(p) = &self.objs[b.parent].1 else {
                    unreachable!("a bound window's parent is registered")
                };
                match p.status {
                    Status::Invalidated => Err(AccessError::Invalidated(key)),
                    Status::Suspended => Err(AccessError::Suspended(key)),
                    Status::Valid => {
                        let poff = (b.parent_iova - p.iova + off) as usize;
                        Ok((b.parent, poff, p.addr + poff))
                    }
                }
            }
            Obj::Gone => unreachable!(),
        }
    }

    fn access(&mut self, key: u32, ctx: AccessCtx, op: AccessOp, va: VaSel, len: u16, need: u8) {
        let iova = self.va(key, va);
        let len = usize::from(len) % 4200;
        let need = u32::from(need) & 0x3f;
        let ro = |w: &World, r: &Result<(usize, usize, usize), AccessError>| matches!(r, Ok((i, ..)) if matches!(&w.objs[*i].1, Obj::Mr(m) if matches!(m.kind, Kind::RawReadOnly)));
        match op {
            AccessOp::Check => {
                let want = self.resolve(ctx, key, iova, len as u64, need);
                let r = self.mem.check(ctx, key, iova, len as u64, Access(need));
                assert!(
                    same(&r, &want),
                    "check({key:#x}, {iova:#x}+{len}, {need:#x}, {ctx:?}): got {r:?}, model {want:?}"
                );
            }
            AccessOp::Lend => {
                let mut want = self.resolve(ctx, key, iova, len as u64, need);
                if self
                    .find(key)
                    .is_some_and(|i| matches!(self.objs[i].1, Obj::Mw(_)))
                {
                    // Windows are never lent (the caller copies, through `read`, which checks).
                    want = Ok((0, 0, 0));
                }
                let r = self.mem.lend(ctx, key, iova, len as u64, Access(need));
                assert!(
                    same(&r, &want),
                    "lend({key:#x}, {iova:#x}+{len}, {need:#x}, {ctx:?}): got {:?}, model {want:?}",
                    r.as_ref().map(|l| l.is_some())
                );
            }
            AccessOp::Read => {
                let want = self.resolve(ctx, key, iova, len as u64, need);
                let mut out = vec![0u8; len];
                let r = self.mem.read(ctx, key, iova, &mut out, Access(need));
                assert!(
                    same(&r, &want),
                    "read({key:#x}, {iova:#x}+{len}, {need:#x}, {ctx:?}): got {r:?}, model {want:?}"
                );
                if let Ok((i, off, _)) = want {
                    let Obj::Mr(m) = &self.objs[i].1 else {
                        unreachable!()
                    };
                    assert!(
                        out == m.data[off..off + len],
                        "read({key:#x}, {iova:#x}+{len}) returned other bytes than the model's"
                    );
                }
            }
            AccessOp::Write(fill) => {
                let mut want = self.resolve(ctx, key, iova, len as u64, need);
                if ro(self, &want) && len > 0 && self.checked {
                    want = Err(AccessError::Fault(key));
                } else if ro(self, &want) && len > 0 {
                    return;
                }
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                let r = self.mem.write(ctx, key, iova, &data, Access(need));
                assert!(
                    same(&r, &want),
                    "write({key:#x}, {iova:#x}+{len}, {need:#x}, {ctx:?}): got {r:?}, model {want:?}"
                );
                if let Ok((i, off, _)) = want
                    && let Some(m) = self.mr(i)
                {
                    m.data[off..off + len].copy_from_slice(&data);
                }
            }
            AccessOp::CompareSwap(..) | AccessOp::FetchAdd(_) => {
                let aop = match op {
                    AccessOp::CompareSwap(c, s) => AtomicOp::CompareSwap {
                        compare: c,
                        swap: s,
                    },
                    AccessOp::FetchAdd(a) => AtomicOp::FetchAdd { add: a },
                    _ => unreachable!(),
                };
                let mut want = self.resolve(ctx, key, iova, 8, Access::REMOTE_ATOMIC.0);
                if let Ok((_, _, host)) = want
                    && (!iova.is_multiple_of(8) || !host.is_multiple_of(8))
                {
                    want = Err(AccessError::Misaligned(iova));
                }
                if want.is_ok() && ro(self, &want) {
                    if skip(ATOMIC_READONLY_RAW) || !self.checked {
                        return;
                    }
                    // Expected: refused like a write (the page cannot be written). Today this
                    // crashes the process.
                    want = Err(AccessError::Fault(key));
                }
                let r = self.mem.atomic(ctx, key, iova, aop);
                assert!(
                    same(&r, &want),
                    "atomic({key:#x}, {iova:#x}, {ctx:?}): got {r:?}, model {want:?}"
                );
                if let Ok((i, off, _)) = want
                    && let Some(m) = self.mr(i)
                {
                    let cur = u64::from_ne_bytes(m.data[off..off + 8].try_into().unwrap());
                    assert_eq!(r, Ok(cur), "atomic returned another original value");
                    let new = match aop {
                        AtomicOp::CompareSwap { compare, swap } if cur == compare => swap,
                        AtomicOp::CompareSwap { .. } => cur,
                        AtomicOp::FetchAdd { add } => cur.wrapping_add(add),
                    };
                    m.data[off..off + 8].copy_from_slice(&new.to_ne_bytes());
                }
            }
        }
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Reg {
                pd,
                kind,
                len,
                access,
                iova,
            } => self.reg(pd, kind, len, access, iova),
            Op::Dereg(i) => self.dereg(i),
            Op::Rereg {
                obj,
                pd,
                access,
                translation,
            } => self.rereg(obj, pd, access, translation),
            Op::Invalidate(i) => self.status_op(i, 0),
            Op::Suspend(i) => self.status_op(i, 1),
            Op::Resume(i) => self.status_op(i, 2),
            Op::RemoteInvalidate { key, pd, qpn } => {
                let ctx = AccessCtx {
                    pd: self.pd(pd),
                    qpn: 1 + u32::from(qpn),
                };
                self.remote_invalidate(self.pick(key), ctx);
            }
            Op::AllocMw { pd, type2 } => self.alloc_mw(pd, type2),
            Op::DeallocMw(i) => self.dealloc_mw(i),
            Op::Bind {
                mw,
                mr,
                pd,
                qpn,
                va,
                len,
                access,
                tag,
            } => {
                let ctx = AccessCtx {
                    pd: self.pd(pd),
                    qpn: 1 + u32::from(qpn),
                };
                let (mw, mr) = (self.pick(mw), self.pick(mr));
                self.bind((mw, mr), ctx, (va, len), access, tag);
            }
            Op::Access {
                key,
                pd,
                qpn,
                op,
                va,
                len,
                need,
            } => {
                let ctx = AccessCtx {
                    pd: self.pd(pd),
                    qpn: 1 + u32::from(qpn),
                };
                self.access(self.pick(key), ctx, op, va, len, need);
            }
        }
        let s = self.mem.stats();
        let regions = self
            .objs
            .iter()
            .filter(|o| matches!(o.1, Obj::Mr(_)))
            .count();
        let windows = self
            .objs
            .iter()
            .filter(|o| matches!(o.1, Obj::Mw(_)))
            .count();
        assert_eq!(s.regions, regions as u64, "region count");
        assert_eq!(s.windows, windows as u64, "window count");
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut w = World::new();
    for op in ops.iter().take(128) {
        w.run(op);
    }
    let maps = core::mem::take(&mut w.maps);
    drop(w);
    for Mapping(p, n) in maps {
        // SAFETY: a mapping this harness made; the table that used it is gone.
        unsafe { libc::munmap(p.cast(), n) };
    }
});
