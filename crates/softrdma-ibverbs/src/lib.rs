//! softrdma's drop-in `libibverbs.so.1`: unmodified rdma-core tools and perftest run on
//! softrdma devices (see docs/IBVERBS.md).
//!
//! A thin skin: C structs in, Rust objects out, errors to errno. Every C object this library
//! hands out is the first field of a `#[repr(C)]` Rust struct (`Pd`, `Mr`, `CompChannel`, ...;
//! a context sits inside a `verbs_context`, see [`context`]), so a C pointer is also the Rust
//! object's address; [`registry`] records the live ones, and the control path refuses (EINVAL)
//! any pointer it did not hand out instead of dereferencing it. Entry points never unwind into
//! C ([`errno::guard`]).
//!
//! Modules: [`abi`] (struct mirrors, layout table), [`config`] (which devices exist),
//! [`device`] (discovery), [`engine`] (the engines behind contexts), [`context`] (the context
//! block and its shared state), [`open`] (open/close: a context assembled with the operations
//! of the modules above [`context`]), [`query`] (device, port, GID, P_Key), [`mr`] (PDs and
//! regions), [`channel`] and [`events`] (completion channels, async events), [`cq`], [`qp`],
//! [`srq`], [`ah`], [`mw`] and [`post`] (the rest of the verbs, over `softrdma::verbs`),
//! [`qp_ex`] and [`wr_ex`] (the `ibv_wr_*` post API), [`dm`] (device memory) and [`ext_ops`]
//! (the `verbs_context` slots served), [`rate`] and [`marshall`] (pure conversions),
//! [`import`] (object import, unsupported), [`sdv`] (softrdma's own calls,
//! `include/softrdma/sdv.h`), [`stats`] (`SOFTRDMA_STATS`), [`rdmacm`] (librdmacm's calls),
//! [`exports`] (symbols and version nodes).
//!
//! The modules form layers: each uses only modules below it (`scripts/tree-limits` refuses an
//! import cycle). Plain data and conversions at the bottom (`abi`, `errno`, `registry`,
//! `config`, ...), then `device`, `engine`, `context`, the verbs objects in the order they
//! hold one another (PD and region, CQ, QP, then what names a QP: `ah`, `mw`, `post`,
//! `wr_ex`), `ext_ops`, and at the top `open`, which names functions of all of them in the
//! tables of a context, then `rdmacm` and `exports`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

pub mod abi;
pub mod ah;
pub mod channel;
pub mod config;
pub mod context;
pub mod cq;
pub mod device;
pub mod dm;
pub mod engine;
pub mod errno;
pub mod events;
pub mod exports;
pub mod ext_ops;
pub mod ifmtu;
pub mod import;
pub mod limits;
pub mod marshall;
pub mod mr;
pub mod mw;
pub mod open;
pub mod post;
pub mod qp;
pub mod qp_ex;
pub mod query;
pub mod rate;
pub mod rdmacm;
pub mod registry;
pub mod sdv;
pub mod srq;
pub mod stats;
pub mod strings;
pub mod sysfs;
pub mod wr_ex;
