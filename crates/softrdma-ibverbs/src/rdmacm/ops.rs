//! The table `librdmacm.so.1` calls through (`stubs/rdmacm.c` declares the same struct, in
//! the same order), and `rdma_getaddrinfo`.

use core::ffi::{c_char, c_int, c_void};
use core::ptr::null_mut;
use std::ffi::CStr;
use std::net::SocketAddr;

use super::abi::*;
use super::addr::{from_sockaddr, to_storage};
use super::id;
use crate::abi::{ibv_context, ibv_pd, ibv_qp_attr, ibv_qp_init_attr, ibv_srq_init_attr};

type Chan = *mut rdma_event_channel;
type CmId = *mut rdma_cm_id;

/// The calls `librdmacm.so.1` forwards.
#[repr(C)]
#[derive(Debug)]
pub struct RdmacmOps {
    pub version: u32,
    pub create_event_channel: unsafe extern "C" fn() -> Chan,
    pub destroy_event_channel: unsafe extern "C" fn(Chan),
    pub create_id: unsafe extern "C" fn(Chan, *mut CmId, *mut c_void, c_int) -> c_int,
    pub destroy_id: unsafe extern "C" fn(CmId) -> c_int,
    pub bind_addr: unsafe extern "C" fn(CmId, *mut libc::sockaddr) -> c_int,
    pub resolve_addr:
        unsafe extern "C" fn(CmId, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int,
    pub resolve_route: unsafe extern "C" fn(CmId, c_int) -> c_int,
    pub create_qp: unsafe extern "C" fn(CmId, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int,
    pub create_qp_ex: unsafe extern "C" fn(CmId, *mut c_void) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(CmId),
    pub connect: unsafe extern "C" fn(CmId, *mut rdma_conn_param) -> c_int,
    pub listen: unsafe extern "C" fn(CmId, c_int) -> c_int,
    pub accept: unsafe extern "C" fn(CmId, *mut rdma_conn_param) -> c_int,
    pub reject: unsafe extern "C" fn(CmId, *const c_void, u8) -> c_int,
    pub disconnect: unsafe extern "C" fn(CmId) -> c_int,
    pub get_cm_event: unsafe extern "C" fn(Chan, *mut *mut rdma_cm_event) -> c_int,
    pub ack_cm_event: unsafe extern "C" fn(*mut rdma_cm_event) -> c_int,
    pub set_option: unsafe extern "C" fn(CmId, c_int, c_int, *mut c_void, usize) -> c_int,
    pub migrate_id: unsafe extern "C" fn(CmId, Chan) -> c_int,
    pub get_request: unsafe extern "C" fn(CmId, *mut CmId) -> c_int,
    pub create_ep: unsafe extern "C" fn(
        *mut CmId,
        *mut rdma_addrinfo,
        *mut ibv_pd,
        *mut ibv_qp_init_attr,
    ) -> c_int,
    pub destroy_ep: unsafe extern "C" fn(CmId),
    pub establish: unsafe extern "C" fn(CmId) -> c_int,
    pub init_qp_attr: unsafe extern "C" fn(CmId, *mut ibv_qp_attr, *mut c_int) -> c_int,
    pub create_srq: unsafe extern "C" fn(CmId, *mut ibv_pd, *mut ibv_srq_init_attr) -> c_int,
    pub destroy_srq: unsafe extern "C" fn(CmId),
    pub get_devices: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_context,
    pub free_devices: unsafe extern "C" fn(*mut *mut ibv_context),
    pub getaddrinfo: unsafe extern "C" fn(
        *const c_char,
        *const c_char,
        *const rdma_addrinfo,
        *mut *mut rdma_addrinfo,
    ) -> c_int,
    pub freeaddrinfo: unsafe extern "C" fn(*mut rdma_addrinfo),
    pub event_str: unsafe extern "C" fn(c_int) -> *const c_char,
    pub get_src_port: unsafe extern "C" fn(CmId) -> u16,
    pub get_dst_port: unsafe extern "C" fn(CmId) -> u16,
}

/// The table's layout version; `stubs/rdmacm.c` refuses another.
pub const OPS_VERSION: u32 = 1;

static OPS: RdmacmOps = RdmacmOps {
    version: OPS_VERSION,
    create_event_channel: id::create_event_channel,
    destroy_event_channel: id::destroy_event_channel,
    create_id: id::create_id,
    destroy_id: id::destroy_id,
    bind_addr: id::bind_addr,
    resolve_addr: id::resolve_addr,
    resolve_route: id::resolve_route,
    create_qp: id::create_qp,
    create_qp_ex: id::create_qp_ex,
    destroy_qp: id::destroy_qp,
    connect: id::connect,
    listen: id::listen,
    accept: id::accept,
    reject: id::reject,
    disconnect: id::disconnect,
    get_cm_event: id::get_cm_event,
    ack_cm_event: id::ack_cm_event,
    set_option: id::set_option,
    migrate_id: id::migrate_id,
    get_request: id::get_request,
    create_ep: id::create_ep,
    destroy_ep: id::destroy_ep,
    establish: id::establish,
    init_qp_attr: id::init_qp_attr,
    create_srq: id::create_srq,
    destroy_srq: id::destroy_srq,
    get_devices: id::get_devices,
    free_devices: id::free_devices,
    getaddrinfo,
    freeaddrinfo,
    event_str,
    get_src_port,
    get_dst_port,
};

/// `rdma_event_str`.
pub(crate) unsafe extern "C" fn event_str(e: c_int) -> *const c_char {
    static NAMES: std::sync::LazyLock<Vec<std::ffi::CString>> = std::sync::LazyLock::new(|| {
        super::EVENT_NAMES
            .iter()
            .map(|n| std::ffi::CString::new(*n).unwrap_or_default())
            .collect()
    });
    static UNKNOWN: &CStr = c"UNKNOWN EVENT";
    usize::try_from(e)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(UNKNOWN.as_ptr(), |n| n.as_ptr())
}

fn port_of(p: CmId, dst: bool) -> u16 {
    if !crate::registry::contains(p.cast_const(), crate::registry::Kind::CmId) {
        return 0;
    }
    // SAFETY: a live id of ours.
    let a = unsafe { &(*p).route.addr };
    let st = if dst { &a.dst } else { &a.src };
    super::addr::of_storage(st).map_or(0, |s| s.port().to_be())
}

/// `rdma_get_src_port`: the local rdma_cm port, in network byte order.
pub(crate) unsafe extern "C" fn get_src_port(p: CmId) -> u16 {
    port_of(p, false)
}

/// `rdma_get_dst_port`: the peer's rdma_cm port, in network byte order.
pub(crate) unsafe extern "C" fn get_dst_port(p: CmId) -> u16 {
    port_of(p, true)
}

/// `softrdma_rdmacm_ops`: the table (exported from `libibverbs.so.1`, node
/// `SOFTRDMA_PRIVATE_RDMACM`).
pub(crate) unsafe extern "C" fn softrdma_rdmacm_ops() -> *const RdmacmOps {
    &OPS
}

/// One result of `rdma_getaddrinfo`, with the storage its pointers name.
#[repr(C)]
struct AddrInfo {
    ai: rdma_addrinfo,
    src: SockStorage,
    dst: SockStorage,
}

/// `rdma_getaddrinfo`, as rdma-core's: with `node` or `service`, the first IPv4 or IPv6 address
/// the system resolver gives, as the source (`RAI_PASSIVE`) or the destination; with neither,
/// the addresses the hints carry (libfabric's verbs provider calls it so). A source the
/// hints carry fills an empty source. TCP port space and RC unless the hints say otherwise.
/// EINVAL with no node, no service and no hints.
pub(crate) unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    crate::errno::ffi_minus1(|| {
        // SAFETY: NULL or readable per the contract.
        let h = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && h.is_none()) {
            return Err(libc::EINVAL);
        }
        let flags = h.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: NULL or a socket address per the contract (the hints' own fields).
        let hint_src = h.and_then(|h| unsafe { from_sockaddr(h.ai_src_addr) });
        // SAFETY: as above.
        let hint_dst = h.and_then(|h| unsafe { from_sockaddr(h.ai_dst_addr) });
        let (mut src, dst) = if node.is_null() && service.is_null() {
            (None, hint_dst)
        } else {
            // SAFETY: C strings (or NULL) per the contract.
            let a = unsafe { resolve(node, service, h.map_or(0, |h| h.ai_family), flags) }?;
            if passive {
                (Some(a), None)
            } else {
                (None, Some(a))
            }
        };
        if src.is_none() {
            src = hint_src;
        }
        let family = match (src.or(dst), h.map_or(0, |h| h.ai_family)) {
            (Some(a), _) if a.is_ipv4() => libc::AF_INET,
            (Some(_), _) => libc::AF_INET6,
            (None, f) => f,
        };
        let b = Box::into_raw(Box::new(AddrInfo {
            ai: rdma_addrinfo {
                ai_flags: flags,
                ai_family: family,
                ai_qp_type: h.map_or(2, |h| if h.ai_qp_type == 0 { 2 } else { h.ai_qp_type }),
                ai_port_space: h.map_or(RDMA_PS_TCP, |h| {
                    if h.ai_port_space == 0 {
                        RDMA_PS_TCP
                    } else {
                        h.ai_port_space
                    }
                }),
                ai_src_len: 0,
                ai_dst_len: 0,
                ai_src_addr: null_mut(),
                ai_dst_addr: null_mut(),
                ai_src_canonname: null_mut(),
                ai_dst_canonname: null_mut(),
                ai_route_len: 0,
                ai_route: null_mut(),
                ai_connect_len: 0,
                ai_connect: null_mut(),
                ai_next: null_mut(),
            },
            src: SockStorage([0; 128]),
            dst: SockStorage([0; 128]),
        }));
        // SAFETY: just allocated; its address fields point into itself.
        unsafe {
            if let Some(a) = src {
                let (st, len) = to_storage(a);
                (*b).src = st;
                (*b).ai.ai_src_len = len;
                (*b).ai.ai_src_addr = (*b).src.0.as_mut_ptr().cast();
            }
            if let Some(a) = dst {
                let (st, len) = to_storage(a);
                (*b).dst = st;
                (*b).ai.ai_dst_len = len;
                (*b).ai.ai_dst_addr = (*b).dst.0.as_mut_ptr().cast();
            }
            *res = b.cast();
        }
        Ok(())
    })
}

/// The first address the system resolver gives for `node`/`service` (stream sockets).
///
/// # Safety
/// `node` and `service` are NULL or C strings.
unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    flags: c_int,
) -> Result<SocketAddr, c_int> {
    // SAFETY: all-zero is a valid addrinfo hint.
    let mut ch: libc::addrinfo = unsafe { core::mem::zeroed() };
    ch.ai_family = family;
    ch.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_PASSIVE != 0 {
        ch.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        ch.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut out: *mut libc::addrinfo = null_mut();
    // SAFETY: C strings (or NULL) per the contract; `out` freed below.
    let rc = unsafe { libc::getaddrinfo(node, service, &ch, &mut out) };
    if rc != 0 || out.is_null() {
        return Err(libc::EADDRNOTAVAIL);
    }
    // SAFETY: a result list of getaddrinfo.
    let first = unsafe { from_sockaddr((*out).ai_addr) };
    // SAFETY: as above.
    unsafe { libc::freeaddrinfo(out) };
    first.ok_or(libc::EADDRNOTAVAIL)
}

/// `rdma_freeaddrinfo`.
pub(crate) unsafe extern "C" fn freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a chain getaddrinfo made (AddrInfo, addrinfo first).
        let b = unsafe { Box::from_raw(p.cast::<AddrInfo>()) };
        p = b.ai.ai_next;
    }
}
