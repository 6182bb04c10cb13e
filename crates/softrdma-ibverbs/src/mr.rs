//! Protection domains and memory regions: `softrdma::verbs::Pd` and `Mr` of the context's
//! engine.
//!
//! An `ibv_pd` is the C head of a [`Pd`] (its `handle` is the memory table's PD handle); an
//! `ibv_mr` is the C head of an [`Mr`] (`lkey == rkey == handle`, the memory table's key).
//! The registered bytes are the application's (`MemSource::raw`), a file's
//! (`ibv_reg_dmabuf_mr`: `MemSource::file`) or device memory's (`crate::dm`). A PD counts the objects
//! made from it (regions, windows, QPs, SRQs, AHs): `ibv_dealloc_pd` is EBUSY while any
//! remains, as with a kernel driver.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma::verbs::{self, MrRereg};
use softrdma::verbs::{Access, MemSource};

use crate::abi::*;
use crate::context::{Shared, shared_of};
use crate::errno::{ffi_errno, ffi_ptr, guard, set_errno};
use crate::registry::{self, Kind};

/// A protection domain: the C struct first, then ours.
#[repr(C)]
pub struct Pd {
    /// What C sees.
    pub pd: ibv_pd,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's PD.
    pub vpd: verbs::Pd,
    /// Objects made from this PD and not yet destroyed.
    pub users: AtomicU32,
    /// For a parent domain (`ibv_alloc_parent_domain`): the protection domain it stands for
    /// (it holds that PD); NULL for a PD.
    pub parent: *mut ibv_pd,
}

// SAFETY: `parent` names a PD of this library that the C API keeps alive while this one
// lives (it counts as one of its users); it is only read.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl core::fmt::Debug for Pd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pd")
            .field("handle", &self.pd.handle)
            .finish()
    }
}

impl Pd {
    /// The PD behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_dealloc_pd(pd)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: registered PD pointers point to a live Pd (C struct first).
        registry::contains(pd, Kind::Pd).then(|| unsafe { &*pd.cast::<Pd>() })
    }

    /// One more object uses this PD.
    pub fn hold(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    /// An object made from this PD is gone.
    pub fn release(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A region's claim on the device memory it is part of (`crate::dm`): the DM cannot be freed
/// while one exists.
#[derive(Debug)]
pub struct DmHold(Arc<AtomicU32>);

impl DmHold {
    /// A claim on the DM whose live regions `users` counts (one more of them).
    pub fn new(users: &Arc<AtomicU32>) -> DmHold {
        users.fetch_add(1, Ordering::AcqRel);
        DmHold(users.clone())
    }
}

impl Drop for DmHold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A memory region: the C struct first, then ours.
#[repr(C)]
pub struct Mr {
    /// What C sees.
    pub mr: ibv_mr,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// The engine's region (taken when deregistered).
    pub vmr: Option<verbs::Mr>,
    /// The PD it counts against (changes with `IBV_REREG_MR_CHANGE_PD`).
    pub owner: core::cell::Cell<*const Pd>,
    /// The device memory it is part of (`ibv_reg_dm_mr`), kept busy while it lives.
    pub dm: Option<DmHold>,
}

impl core::fmt::Debug for Mr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Mr")
            .field("lkey", &self.mr.lkey)
            .field("addr", &self.mr.addr)
            .field("length", &self.mr.length)
            .finish()
    }
}

impl Mr {
    /// The MR behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_dereg_mr(mr)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(mr: *mut ibv_mr) -> Option<&'a Mr> {
        // SAFETY: registered MR pointers point to a live Mr (C struct first).
        registry::contains(mr, Kind::Mr).then(|| unsafe { &*mr.cast::<Mr>() })
    }
}

/// `ibv_alloc_pd`: NULL with errno EINVAL (not an open context) or ENOMEM (too many PDs).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        let vpd = shared.verbs()?.alloc_pd().map_err(|e| e.errno())?;
        let p = Box::into_raw(Box::new(Pd {
            pd: ibv_pd {
                context,
                handle: vpd.handle(),
            },
            shared,
            vpd,
            users: AtomicU32::new(0),
            parent: core::ptr::null_mut(),
        }))
        .cast::<ibv_pd>();
        registry::insert(p, Kind::Pd);
        Ok(p)
    })
}

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain`): a PD that stands for
/// `attr->pd` everywhere a PD is taken (regions, windows, QPs, SRQs, AHs, an extended CQ's
/// `parent_domain`); freed with `ibv_dealloc_pd`, and `attr->pd` cannot be freed before it
/// (EBUSY). The custom allocators (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`) are accepted
/// and never called: this library allocates no queue memory the application could place
/// (queues live in the engine). NULL with errno EINVAL (not a context of ours, NULL `attr`,
/// `attr->pd` not a PD of the context or a parent domain itself, unknown `comp_mask` bits),
/// or EOPNOTSUPP for a thread domain (`attr->td`: none can be allocated here).
///
/// # Safety
/// `attr` is NULL or points to a readable `ibv_parent_domain_init_attr`.
pub unsafe extern "C" fn alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    ffi_ptr(|| {
        // SAFETY: the C API forbids closing the context concurrently.
        let shared = unsafe { shared_of(context) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        let a = unsafe { attr.read() };
        const ALLOCATORS: u32 = 1 << 0;
        const PD_CONTEXT: u32 = 1 << 1;
        if a.comp_mask & !(ALLOCATORS | PD_CONTEXT) != 0 {
            return Err(libc::EINVAL);
        }
        if !a.td.is_null() {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: registry-checked; the C API forbids deallocating it concurrently.
        let parent = unsafe { Pd::from_ibv(a.pd) }.ok_or(libc::EINVAL)?;
        if !Arc::ptr_eq(&parent.shared, &shared) || !parent.parent.is_null() {
            return Err(libc::EINVAL);
        }
        let p = Box::into_raw(Box::new(Pd {
            pd: ibv_pd {
                context,
                handle: parent.pd.handle,
            },
            shared,
            vpd: parent.vpd.clone(),
            users: AtomicU32::new(0),
            parent: a.pd,
        }))
        .cast::<ibv_pd>();
        parent.hold();
        registry::insert(p, Kind::Pd);
        Ok(p)
    })
}

/// `ibv_dealloc_pd`: 0 or errno (EINVAL: not a PD; EBUSY: regions or windows remain).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_errno(|| {
        if !registry::remove(pd, Kind::Pd) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Pd only this caller holds.
        let p = unsafe { &*pd.cast::<Pd>() };
        if p.users.load(Ordering::Acquire) > 0 {
            registry::insert(pd, Kind::Pd);
            return Err(libc::EBUSY);
        }
        if !p.parent.is_null() {
            // SAFETY: a parent domain's PD is held by it, so it is live.
            unsafe { &*p.parent.cast::<Pd>() }.release();
        }
        // SAFETY: claimed above; it came from Box::into_raw.
        drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
        Ok(())
    })
}

/// Register `length` bytes at `addr` in `pd`.
fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: Option<u64>,
    access: u32,
) -> Result<*mut ibv_mr, c_int> {
    // SAFETY: the C API forbids deallocating the PD concurrently.
    let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    if addr.is_null() || length == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the C contract of ibv_reg_mr: the memory stays mapped until ibv_dereg_mr (or
    // a rereg that replaces it), and the device may access it from any thread. A range that
    // is not mapped is refused when pinned (mlock fails: EFAULT); unpinned it faults on
    // access, like ODP memory.
    let src = unsafe { MemSource::raw(addr.cast(), length) };
    reg_source(
        p,
        Registration {
            src,
            addr,
            iova,
            access,
            dm: None,
        },
    )
}

/// What [`reg_source`] registers.
pub(crate) struct Registration {
    /// The memory.
    pub src: MemSource,
    /// What `mr->addr` says (the host address of raw memory; the offset for a dma-buf or
    /// device memory, as rdma-core's providers report).
    pub addr: *mut c_void,
    /// Peers' first address (`None`: the host address).
    pub iova: Option<u64>,
    /// `IBV_ACCESS_*`.
    pub access: u32,
    /// The device memory the region is part of.
    pub dm: Option<DmHold>,
}

/// Register `r.src` in `p` and hand out the C region.
pub(crate) fn reg_source(p: &Pd, r: Registration) -> Result<*mut ibv_mr, c_int> {
    let length = r.src.len();
    let vmr = p
        .vpd
        .reg_mr(r.src, Access(r.access), r.iova)
        .map_err(|e| e.errno())?;
    let info = vmr.info();
    p.hold();
    let m = Box::into_raw(Box::new(Mr {
        mr: ibv_mr {
            context: p.pd.context,
            pd: (&p.pd as *const ibv_pd).cast_mut(),
            addr: r.addr,
            length,
            handle: info.lkey,
            lkey: info.lkey,
            rkey: info.rkey,
        },
        shared: p.shared.clone(),
        vmr: Some(vmr),
        owner: core::cell::Cell::new(p),
        dm: r.dm,
    }))
    .cast::<ibv_mr>();
    registry::insert(m, Kind::Mr);
    Ok(m)
}

/// `ibv_reg_mr`: NULL with errno EINVAL (bad PD, NULL address, zero length, malformed or
/// inconsistent access flags), ENOMEM (too many regions, pinning limit), EFAULT (unmapped
/// memory, when pinned). Optional access flags (`IBV_ACCESS_OPTIONAL_RANGE`, e.g. relaxed
/// ordering) are accepted and ignored.
///
/// # Safety
/// The memory must stay mapped until the region is deregistered.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, None, access as u32))
}

/// `ibv_reg_mr_iova` (IBVERBS_1.7): as `ibv_reg_mr`, peers address the region from `iova`.
///
/// # Safety
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, Some(iova), access as u32))
}

/// `ibv_reg_mr_iova2` (IBVERBS_1.8; what verbs.h's `ibv_reg_mr` macro calls when optional
/// access flags are set).
///
/// # Safety
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    ffi_ptr(|| reg(pd, addr, length, Some(iova), access))
}

/// `ibv_reg_dmabuf_mr` (IBVERBS_1.12): register `length` bytes at `offset` of the file
/// behind `fd` (a dma-buf, a memfd, a regular file: anything `mmap` accepts), peers
/// addressing them from `iova`. The device duplicates `fd` and maps the range itself
/// (`MAP_SHARED`), so the caller may close `fd` at once; a file that can still be truncated is
/// reached with kernel-checked copies (an access past a truncation fails, never SIGBUS).
/// `mr->addr` is `offset`, as rdma-core reports. NULL with errno EINVAL (bad PD, zero length,
/// range past the end of the file or wrapping, bad access flags), EBADF (`fd`), or the
/// `mmap` error (ENODEV: not mappable; EACCES: opened read-only).
///
/// # Safety
/// None: any arguments are accepted.
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    ffi_ptr(|| {
        // SAFETY: the C API forbids deallocating the PD concurrently.
        let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        if length == 0 {
            return Err(libc::EINVAL);
        }
        let end = offset.checked_add(length as u64).ok_or(libc::EINVAL)?;
        let file = dup_fd(fd)?;
        let size = file
            .metadata()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?
            .len();
        if size < end {
            return Err(libc::EINVAL);
        }
        reg_source(
            p,
            Registration {
                src: MemSource::file(file, offset, length),
                addr: offset as usize as *mut c_void,
                iova: Some(iova),
                access: access as u32,
                dm: None,
            },
        )
    })
}

/// A descriptor of our own for the file behind `fd`.
fn dup_fd(fd: c_int) -> Result<std::fs::File, c_int> {
    use std::os::fd::{FromRawFd, OwnedFd};
    if fd < 0 {
        return Err(libc::EBADF);
    }
    // SAFETY: F_DUPFD_CLOEXEC only reads `fd` (any value is safe: a bad one is EBADF).
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(crate::errno::errno());
    }
    // SAFETY: `dup` was just returned by fcntl and is owned by nothing else.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(dup) }))
}

/// `ibv_dereg_mr`: 0 or errno (EINVAL: not a live region, e.g. deregistered twice; EBUSY:
/// memory windows are bound to it).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_errno(|| {
        if !registry::remove(mr, Kind::Mr) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Mr (from Box::into_raw) only this caller
        // holds.
        let mut m = unsafe { Box::from_raw(mr.cast::<Mr>()) };
        if let Some(v) = m.vmr.take()
            && let Err((v, e)) = v.dereg()
        {
            // Windows are bound to it (they hold the region): it stays registered.
            m.vmr = Some(v);
            let _ = Box::into_raw(m);
            registry::insert(mr, Kind::Mr);
            return Err(e.errno());
        }
        // SAFETY: the owner PD cannot be deallocated while this region counts against it.
        unsafe { (*m.owner.get()).release() };
        drop(m);
        Ok(())
    })
}

/// `enum ibv_rereg_mr_err_code`: an input error (the old region is unchanged).
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `enum ibv_rereg_mr_err_code`: the device refused (the old region is unchanged).
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: change translation, PD and/or access of `mr`; the region gets new keys
/// (written to `mr->lkey` and `mr->rkey`, as rdma-core does with the kernel's answer) and
/// the old ones stop working. 0, or
/// `IBV_REREG_MR_ERR_INPUT` (-1; errno EINVAL: bad region, flags, PD or range) or
/// `IBV_REREG_MR_ERR_CMD` (-4; errno from the memory subsystem). On failure the old region
/// stays valid and unchanged.
///
/// # Safety
/// With `IBV_REREG_MR_CHANGE_TRANSLATION`, the new memory must stay mapped until the region
/// is deregistered or re-registered again.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    guard(
        || {
            set_errno(crate::errno::PANIC_ERRNO);
            IBV_REREG_MR_ERR_CMD
        },
        || {
            let input = |e| {
                set_errno(e);
                IBV_REREG_MR_ERR_INPUT
            };
            let all = IBV_REREG_MR_CHANGE_TRANSLATION
                | IBV_REREG_MR_CHANGE_PD
                | IBV_REREG_MR_CHANGE_ACCESS;
            if flags & !all != 0 {
                return input(libc::EINVAL);
            }
            // SAFETY: the C API forbids deregistering the region concurrently.
            if unsafe { Mr::from_ibv(mr) }.is_none() {
                return input(libc::EINVAL);
            }
            // SAFETY: a live region (checked just above) that only this call uses: the C API
            // forbids using an MR concurrently with its re-registration.
            let m = unsafe { &mut *mr.cast::<Mr>() };
            let mut change = MrRereg::default();
            if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
                if addr.is_null() || length == 0 {
                    return input(libc::EINVAL);
                }
                // SAFETY: the caller's contract (see above).
                let src = unsafe { MemSource::raw(addr.cast(), length) };
                change.translation = Some((src, None));
            }
            let mut new_pd = None;
            if flags & IBV_REREG_MR_CHANGE_PD != 0 {
                // SAFETY: the C API forbids deallocating the PD concurrently.
                match unsafe { Pd::from_ibv(pd) } {
                    Some(p) if Arc::ptr_eq(&p.shared, &m.shared) => {
                        change.pd = Some(&p.vpd);
                        new_pd = Some(pd);
                    }
                    _ => return input(libc::EINVAL),
                }
            }
            if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
                change.access = Some(Access(access as u32));
            }
            let Some(vmr) = m.vmr.as_mut() else {
                return input(libc::EINVAL);
            };
            match vmr.rereg(change) {
                Ok(_) => {
                    m.mr.lkey = vmr.lkey();
                    m.mr.rkey = vmr.rkey();
                    m.mr.handle = vmr.lkey();
                    if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
                        m.mr.addr = addr;
                        m.mr.length = length;
                    }
                    if let Some(p) = new_pd {
                        m.mr.pd = p;
                        // SAFETY: both PDs are live: the old one counts this region, the new
                        // one was checked above, and the C API forbids deallocating either
                        // concurrently.
                        unsafe {
                            (*m.owner.get()).release();
                            let np = p.cast::<Pd>();
                            (*np).hold();
                            m.owner.set(np);
                        }
                    }
                    0
                }
                Err(e) => {
                    set_errno(e.errno());
                    IBV_REREG_MR_ERR_CMD
                }
            }
        },
    )
}
