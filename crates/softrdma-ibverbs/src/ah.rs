//! Address handles: the path to a remote port. UD work requests name their destination with
//! one (`wr.ud.ah`); RC and UC QPs take their path from `ibv_modify_qp`, so for them an AH
//! only records and checks its attributes. The attributes must carry a GRH naming an
//! IPv4-mapped or IPv6 GID on port 1 (RoCE). `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc` read the sender's address from the GRH area a UD receive starts
//! with (the IPv4 header in its last 20 bytes, or the IPv6 header).

use core::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use softrdma::verbs::{self, GRH_LEN};

use crate::abi::*;
use crate::context::Shared;
use crate::cq::IBV_WC_GRH;
use crate::errno::{ffi_errno, ffi_ptr};
use crate::mr::Pd;
use crate::registry::{self, Kind};

/// An address handle: the C struct first, then ours.
#[repr(C)]
pub struct Ah {
    /// What C sees.
    pub ah: ibv_ah,
    /// The context it belongs to.
    pub shared: Arc<Shared>,
    /// Its attributes.
    pub attr: ibv_ah_attr,
    /// The peer it names.
    pub peer: IpAddr,
    /// The engine's address handle.
    pub vah: verbs::Ah,
}

impl core::fmt::Debug for Ah {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ah").field("peer", &self.peer).finish()
    }
}

impl Ah {
    /// The AH behind a C pointer, if it is a live one.
    ///
    /// # Safety
    /// Valid until `ibv_destroy_ah(ah)`, which the C API forbids to race with its use.
    pub unsafe fn from_ibv<'a>(ah: *mut ibv_ah) -> Option<&'a Ah> {
        // SAFETY: registered AH pointers point to a live Ah (C struct first).
        registry::contains(ah, Kind::Ah).then(|| unsafe { &*ah.cast::<Ah>() })
    }
}

static NEXT_AH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

fn create(pd: *mut ibv_pd, a: ibv_ah_attr) -> Result<*mut ibv_ah, c_int> {
    // SAFETY: the C API forbids deallocating the PD concurrently.
    let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let peer = crate::qp::peer_of(p.shared.dev, &a)?;
    let h = Box::into_raw(Box::new(Ah {
        ah: ibv_ah {
            context: p.pd.context,
            pd,
            handle: NEXT_AH.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        },
        shared: p.shared.clone(),
        attr: a,
        peer,
        vah: verbs::Ah::new(&p.vpd, peer),
    }))
    .cast::<ibv_ah>();
    p.hold();
    registry::insert(h, Kind::Ah);
    Ok(h)
}

/// `ibv_create_ah`: NULL with errno EINVAL (bad PD, NULL attributes, no GRH, a zero GID, a
/// port other than 1).
///
/// # Safety
/// `attr` is NULL or readable.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_ptr(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and readable per the contract.
        create(pd, unsafe { attr.read() })
    })
}

/// `ibv_destroy_ah`: 0 or EINVAL.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_errno(|| {
        if !registry::remove(ah, Kind::Ah) {
            return Err(libc::EINVAL);
        }
        // SAFETY: claimed from the registry: a live Ah (from Box::into_raw) only we hold.
        let h = unsafe { Box::from_raw(ah.cast::<Ah>()) };
        // SAFETY: the PD cannot be deallocated while this AH counts against it.
        unsafe { (*h.ah.pd.cast::<Pd>()).release() };
        drop(h);
        Ok(())
    })
}

/// The address vector that answers the sender of a UD receive: its GID (from the GRH area's
/// source address), the GRH area's hop limit and traffic class, the completion's SL, port 1.
/// EINVAL when the completion has no GRH area (`IBV_WC_GRH` clear) or the area holds no IP
/// header.
///
/// # Safety
/// `wc` is readable and `grh` points to 40 readable bytes.
unsafe fn ah_attr_from(wc: *const ibv_wc, grh: *const c_void) -> Result<ibv_ah_attr, c_int> {
    // SAFETY: readable per the contract.
    let wc = unsafe { wc.read() };
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Err(libc::EINVAL);
    }
    let mut g = [0u8; GRH_LEN];
    // SAFETY: `grh` points to GRH_LEN readable bytes per the contract; `g` is ours.
    unsafe { core::ptr::copy_nonoverlapping(grh.cast::<u8>(), g.as_mut_ptr(), GRH_LEN) };
    let (src, _dst) = softrdma::verbs::grh_source(&g).ok_or(libc::EINVAL)?;
    let (hop_limit, traffic_class) = if g[20] >> 4 == 4 {
        (g[28], g[21])
    } else {
        (g[7], (u16::from_be_bytes([g[0], g[1]]) >> 4) as u8)
    };
    let gid = match src {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut a = crate::qp::empty_ah_attr();
    a.grh.dgid = ibv_gid {
        raw: Ipv6Addr::octets(&gid),
    };
    a.grh.sgid_index = 0;
    a.grh.hop_limit = hop_limit;
    a.grh.traffic_class = traffic_class;
    a.grh.flow_label = 0;
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.is_global = 1;
    a.port_num = 1;
    Ok(a)
}

/// `ibv_create_ah_from_wc`: the address handle that answers the sender of a UD receive.
/// NULL with errno EINVAL (bad PD, NULL arguments, a completion without a GRH area, or an
/// area that holds no IP header).
///
/// # Safety
/// `wc` is NULL or readable; `grh` is NULL or points to 40 readable bytes.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut ibv_ah {
    ffi_ptr(|| {
        if !registry::contains(pd, Kind::Pd) || wc.is_null() || grh.is_null() || port_num != 1 {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL, readable per the contract.
        let a = unsafe { ah_attr_from(wc, grh) }?;
        create(pd, a)
    })
}

/// `ibv_init_ah_from_wc`: fill `ah_attr` to answer the sender of a UD receive; 0 or EINVAL
/// (bad context, NULL arguments, a completion without a GRH area, or an area that holds no
/// IP header).
///
/// # Safety
/// `wc` is NULL or readable; `grh` is NULL or points to 40 readable bytes; `ah_attr` is NULL
/// or writable.
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi_errno(|| {
        if !registry::contains(context, Kind::Context)
            || wc.is_null()
            || grh.is_null()
            || ah_attr.is_null()
            || port_num != 1
        {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL, readable per the contract.
        let a = unsafe { ah_attr_from(wc, grh) }?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { ah_attr.write(a) };
        Ok(())
    })
}

/// `ibv_resolve_eth_l2_from_gid` (IBVERBS_1.1): the Ethernet MAC (and VLAN) of the peer named by
/// `attr->grh.dgid`. softrdma runs over UDP sockets and has no view of layer 2 (the kernel's
/// neighbour table answers for its packets), so there is no answer to give: the function
/// returns `-EOPNOTSUPP`, or `-EINVAL` for a foreign context or a NULL `attr` or `eth_mac`
/// (rdma-core's convention for this function: 0 or a negative errno; errno is set to the
/// positive value as well). Nothing is written.
///
/// # Safety
/// None beyond the C API's: any pointer is accepted and never dereferenced.
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    context: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    let e = ffi_errno(|| {
        if !registry::contains(context, Kind::Context) || attr.is_null() || eth_mac.is_null() {
            return Err(libc::EINVAL);
        }
        Err(libc::EOPNOTSUPP)
    });
    crate::errno::set_errno(e);
    -e
}
