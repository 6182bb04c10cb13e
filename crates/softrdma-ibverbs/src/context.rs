//! Contexts: the `verbs_context`/`ibv_context` block C sees, and the Rust state behind it.
//!
//! Memory layout of one opened context (one heap block, [`Context`]):
//! ```text
//!   +0    verbs_context: 39 extended-op slots, sz
//!   +320  ibv_context: device, ops (32 slots), cmd_fd, async_fd, ..., abi_compat
//!   +648  Arc<Shared>: the device, the memory table, the async event queue
//! ```
//! C holds `&ctx.vctx.context`; [`Context::from_ibv`] checks the registry and steps back 320
//! bytes. The functions a context calls through live in the modules above this one, so
//! whoever opens it names them ([`Ops`]: `crate::open`, for `ibv_open_device`): the
//! data-path table `ctx->ops`, the `ibv_wr_*` operations of its QPs and the destination of
//! the engine's asynchronous events. `ibv_open_device` then fills the extended slots softrdma
//! serves (`crate::ext_ops::install`: `query_device_ex`, the device memory calls,
//! `create_qp_ex`, `create_cq_ex`, ...) and sets `abi_compat` to `UINTPTR_MAX`, which makes
//! verbs.h consult them; every other slot stays NULL, so verbs.h falls back to the exported
//! function (`ibv_query_port`) or fails with EOPNOTSUPP (`ibv_open_xrcd`, `ibv_create_wq`,
//! ...).
//!
//! The engine behind a context is a `softrdma::verbs::Device`, opened on first use (the first
//! PD, CQ or completion channel), so `ibv_devinfo` never binds the RoCEv2 port. All contexts
//! of one device in a process share one engine (`crate::engine`): a device is one address
//! and one UDP port.

use core::ffi::c_int;
use std::sync::{Arc, OnceLock};

use softrdma::verbs;

use crate::abi::{
    CompatSlot, VERBS_CONTEXT_OPS, ibv_async_event, ibv_context, ibv_context_ops, verbs_context,
};
use crate::device::Device;
use crate::engine::{AsyncEventHook, engine_for, release_engine};
use crate::errno::{ffi_minus1, guard};
use crate::events::EventQueue;
use crate::qp_ex::QpExOps;
use crate::registry::{self, Kind};

/// What a context is assembled from besides its device: the functions it calls through that
/// live in the modules above this one, named by whoever opens it (`crate::open`).
#[derive(Clone, Copy, Debug)]
pub struct Ops {
    /// `ctx->ops`: the data-path verbs.
    pub verbs: ibv_context_ops,
    /// The `ibv_wr_*` operations every QP created on the context carries.
    pub qp_ex: QpExOps,
    /// Where the asynchronous events of the device's engine go, if this context opens it.
    pub async_event: AsyncEventHook,
}

/// State shared by a context and every object created on it (they keep it alive after
/// `ibv_close_device`, so a late `ibv_dereg_mr` never touches freed memory).
#[derive(Debug)]
pub struct Shared {
    /// The device the context was opened on.
    pub dev: &'static Device,
    /// The engine, once opened ([`Shared::verbs`]).
    engine: OnceLock<verbs::Device>,
    /// Async events (`ibv_get_async_event`); its fd is `ctx->async_fd`.
    pub async_events: EventQueue<ibv_async_event>,
    /// The `ibv_wr_*` operations of its QPs ([`Ops::qp_ex`]).
    pub qp_ex: QpExOps,
    /// Where the engine's asynchronous events go ([`Ops::async_event`]).
    on_async_event: AsyncEventHook,
}

impl Shared {
    /// The verbs device behind this context, opened on first use (errno of the failure,
    /// e.g. `EADDRINUSE` when another process already is this device).
    pub fn verbs(&self) -> Result<&verbs::Device, c_int> {
        if let Some(d) = self.engine.get() {
            return Ok(d);
        }
        let d = engine_for(self.dev, self.on_async_event)?;
        if let Err(d) = self.engine.set(d) {
            // Another thread of this context won the race; give our reference back.
            drop(d);
            release_engine(self.dev);
        }
        self.engine.get().ok_or(libc::EIO)
    }

    /// Queue an async event (`ibv_get_async_event`).
    pub fn async_event(&self, event: ibv_async_event) {
        self.async_events.push(event);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.engine.take().is_some() {
            release_engine(self.dev);
        }
    }
}

/// One opened context. `#[repr(C)]` so that `vctx` (and the `ibv_context` at its end) is
/// first.
#[repr(C)]
pub struct Context {
    /// What C sees (it holds a pointer to `vctx.context`).
    pub vctx: verbs_context,
    /// Ours.
    pub shared: Arc<Shared>,
    /// `cmd_fd`: a file of the context's own (an empty memfd) where rdma-core has the uverbs
    /// command fd, so that programs that `dup` or `fstat` it (rdma-core's import tests) get
    /// a real descriptor; no command is ever written to it. Closed with the context.
    _cmd_file: std::fs::File,
}

// SAFETY: the C part is written only while the context is created and destroyed (by the one
// thread that owns the pointer then); every other access goes through `shared`, which is Sync.
unsafe impl Sync for Context {}
// SAFETY: as above.
unsafe impl Send for Context {}

impl core::fmt::Debug for Context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.shared.dev.cfg.name)
            .field("async_fd", &self.vctx.context.async_fd)
            .finish()
    }
}

/// Offset of the `ibv_context` inside [`Context`].
pub const CONTEXT_OFFSET: usize =
    core::mem::offset_of!(Context, vctx) + core::mem::offset_of!(verbs_context, context);

impl Context {
    /// Open a context on `dev` that calls through `ops`; the C pointer to hand out.
    pub fn open(dev: &'static Device, ops: Ops) -> Result<*mut ibv_context, c_int> {
        let async_events = EventQueue::new()?;
        let async_fd = async_events.fd();
        let shared = Arc::new(Shared {
            dev,
            engine: OnceLock::new(),
            async_events,
            qp_ex: ops.qp_ex,
            on_async_event: ops.async_event,
        });
        // SAFETY: a NUL-terminated name and a flag; the result is checked.
        let fd = unsafe { libc::memfd_create(c"softrdma-context".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::errno::errno());
        }
        // SAFETY: a descriptor just created and owned by nothing else.
        let cmd_file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let ctx = Box::new(Context {
            vctx: verbs_context {
                ops: [CompatSlot::None; VERBS_CONTEXT_OPS],
                sz: core::mem::size_of::<verbs_context>(),
                context: ibv_context {
                    device: (&dev.dev as *const crate::abi::ibv_device).cast_mut(),
                    ops: ops.verbs,
                    cmd_fd: fd,
                    async_fd,
                    num_comp_vectors: 1,
                    mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                    abi_compat: core::ptr::null_mut(),
                },
            },
            shared,
            _cmd_file: cmd_file,
        });
        let raw = Box::into_raw(ctx);
        // SAFETY: `raw` is a valid, just-allocated Context.
        let c = unsafe { core::ptr::addr_of_mut!((*raw).vctx.context) };
        registry::insert(c, Kind::Context);
        Ok(c)
    }

    /// The context behind a C pointer, if it is an open context.
    ///
    /// # Safety
    /// The returned reference is valid until `ibv_close_device(ctx)`; the caller must not
    /// keep it past a close that can run concurrently (the C API forbids that race).
    pub unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
        if !registry::contains(ctx, Kind::Context) {
            return None;
        }
        // SAFETY: registered context pointers point CONTEXT_OFFSET bytes into a live Context.
        Some(unsafe { &*ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<Context>() })
    }

    /// The C pointer of this context.
    pub fn ibv(&self) -> *mut ibv_context {
        (&self.vctx.context as *const ibv_context).cast_mut()
    }

    /// Close the context `ctx` (`ibv_close_device`).
    pub fn close(ctx: *mut ibv_context) -> Result<(), c_int> {
        if !registry::remove(ctx, Kind::Context) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the pointer was registered (so it is CONTEXT_OFFSET bytes into a Context
        // from Box::into_raw) and the registry let exactly this caller claim it.
        drop(unsafe { Box::from_raw(ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<Context>()) });
        Ok(())
    }
}

/// The shared state of an open context, for the verbs below.
///
/// # Safety
/// As [`Context::from_ibv`].
pub unsafe fn shared_of(ctx: *mut ibv_context) -> Result<Arc<Shared>, c_int> {
    // SAFETY: forwarded contract.
    match unsafe { Context::from_ibv(ctx) } {
        Some(c) => Ok(c.shared.clone()),
        None => Err(libc::EINVAL),
    }
}

/// `ibv_get_async_event`: wait for the next async event of `context` (or fail with EAGAIN
/// if the application made `async_fd` non-blocking). 0, or -1 with errno.
///
/// # Safety
/// `event` is NULL or points to a writable `struct ibv_async_event`.
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ffi_minus1(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the C API forbids closing a context while a thread waits on it.
        let shared = unsafe { shared_of(context) }?;
        let ev = shared.async_events.wait()?;
        // SAFETY: `event` is non-NULL and writable per the contract.
        unsafe { event.write(ev) };
        Ok(())
    })
}

/// `ibv_ack_async_event`: count the event as handled on its CQ, QP or SRQ (whose destroy
/// waits for every event to be acknowledged). Unknown objects are ignored.
///
/// # Safety
/// `event` is NULL or points to an event returned by `ibv_get_async_event`.
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard(
        || (),
        || {
            if event.is_null() {
                return;
            }
            // SAFETY: non-NULL and readable per the contract.
            let ev = unsafe { event.read() };
            crate::events::ack_async(&ev);
        },
    )
}
