//! Device, port, GID and P_Key queries.
//!
//! GID table: `gid_tbl_len` is 16; indices 0 and 1 both hold the device's IPv4-mapped GID
//! `::ffff:a.b.c.d` (type RoCE v2: softrdma speaks only RoCEv2), so the `-g 0`/`-x 0` of
//! rdma-core's tools and perftest and the `-g 1` used with rxe all work; indices 2..15 are
//! empty (zero GID; `ibv_query_gid_ex` reports ENODATA for them).

use core::ffi::{c_int, c_uint};

use crate::abi::*;
use crate::context::Context;
use crate::device::{Device, copy_cstr};
use crate::errno::{ffi_errno, ffi_minus1, guard};
use crate::limits as l;

/// GID indices that hold the device's address.
pub const POPULATED_GIDS: u32 = 2;

fn device_of<'a>(ctx: *mut ibv_context) -> Result<&'a Device, c_int> {
    // SAFETY: the C API forbids closing a context while querying it.
    unsafe { Context::from_ibv(ctx) }
        .map(|c| c.shared.dev)
        .ok_or(libc::EINVAL)
}

/// The attributes `ibv_query_device` reports for `dev`.
pub fn device_attr(dev: &Device) -> ibv_device_attr {
    let mut a = ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: dev.guid(),
        sys_image_guid: dev.guid(),
        max_mr_size: l::MAX_MR_SIZE,
        page_size_cap: l::PAGE_SIZE_CAP,
        vendor_id: l::VENDOR_ID,
        vendor_part_id: l::VENDOR_PART_ID,
        hw_ver: l::HW_VER,
        max_qp: l::MAX_QP,
        max_qp_wr: l::MAX_QP_WR,
        device_cap_flags: IBV_DEVICE_SYS_IMAGE_GUID
            | IBV_DEVICE_RC_RNR_NAK_GEN
            | IBV_DEVICE_N_NOTIFY_CQ
            | IBV_DEVICE_MEM_WINDOW
            | IBV_DEVICE_MEM_WINDOW_TYPE_2B,
        max_sge: l::MAX_SGE,
        max_sge_rd: l::MAX_SGE,
        max_cq: l::MAX_CQ,
        max_cqe: l::MAX_CQE,
        max_mr: l::MAX_MR,
        max_pd: l::MAX_PD,
        max_qp_rd_atom: l::MAX_QP_RD_ATOM,
        max_ee_rd_atom: 0,
        max_res_rd_atom: l::MAX_RES_RD_ATOM,
        max_qp_init_rd_atom: l::MAX_QP_RD_ATOM,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: l::MAX_MW,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: l::MAX_AH,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: l::MAX_SRQ,
        max_srq_wr: l::MAX_SRQ_WR,
        max_srq_sge: l::MAX_SRQ_SGE,
        max_pkeys: 1,
        local_ca_ack_delay: l::LOCAL_CA_ACK_DELAY,
        phys_port_cnt: 1,
    };
    copy_cstr(
        &mut a.fw_ver,
        concat!("softrdma ", env!("CARGO_PKG_VERSION")),
    );
    a
}

/// The attributes `ibv_query_port` reports for port 1 of `dev`.
pub fn port_attr(dev: &Device) -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: dev.cfg.active_mtu,
        gid_tbl_len: l::GID_TBL_LEN,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: l::MAX_MSG_SZ,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: dev.link.0,
        active_speed: dev.link.1,
        phys_state: l::PHYS_STATE_LINK_UP,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        lid: dev.lid(),
        ..ibv_port_attr::default()
    }
}

/// GID `index` of port 1: `Some(gid)` for a valid index (zero when empty), `None` past the
/// table.
pub fn gid(dev: &Device, index: u32) -> Option<[u8; 16]> {
    match index {
        i if i < POPULATED_GIDS => Some(dev.gid()),
        i if i < l::GID_TBL_LEN as u32 => Some([0; 16]),
        _ => None,
    }
}

/// `ibv_query_device`: 0 or errno (EINVAL: not an open context or `device_attr` NULL).
///
/// # Safety
/// `device_attr` is NULL or points to a writable `struct ibv_device_attr`.
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr: *mut ibv_device_attr,
) -> c_int {
    ffi_errno(|| {
        let dev = device_of(context)?;
        if device_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { device_attr.write(self::device_attr(dev)) };
        Ok(())
    })
}

/// `ibv_query_port` (the exported function behind verbs.h's inline wrapper): 0 or errno
/// (EINVAL: not an open context, port other than 1, NULL attributes). Writes the first
/// [`COMPAT_PORT_ATTR_LEN`] bytes (see there).
///
/// # Safety
/// `port_attr` is NULL or points to at least 48 writable bytes.
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    ffi_errno(|| {
        let dev = device_of(context)?;
        if port_num != 1 || port_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let a = self::port_attr(dev);
        // SAFETY: `a` is a live ibv_port_attr (52 >= 48 bytes); the destination has 48
        // writable bytes per the contract; they do not overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                (&a as *const ibv_port_attr).cast::<u8>(),
                port_attr.cast::<u8>(),
                COMPAT_PORT_ATTR_LEN,
            )
        };
        Ok(())
    })
}

/// `ibv_query_gid`: 0, or -1 with errno EINVAL (bad context, port, index, NULL `gid`).
///
/// # Safety
/// `gid` is NULL or points to a writable `union ibv_gid`.
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi_minus1(|| {
        let dev = device_of(context)?;
        if port_num != 1 || gid.is_null() || index < 0 {
            return Err(libc::EINVAL);
        }
        let g = self::gid(dev, index as u32).ok_or(libc::EINVAL)?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { gid.write(ibv_gid { raw: g }) };
        Ok(())
    })
}

fn gid_entry(dev: &Device, index: u32) -> Result<ibv_gid_entry, c_int> {
    match gid(dev, index) {
        None => Err(libc::EINVAL),
        Some(_) if index >= POPULATED_GIDS => Err(libc::ENODATA),
        Some(g) => Ok(ibv_gid_entry {
            gid: ibv_gid { raw: g },
            gid_index: index,
            port_num: 1,
            gid_type: IBV_GID_TYPE_ROCE_V2,
            // No network interface is bound to the GID (as for an IP on loopback).
            ndev_ifindex: 0,
        }),
    }
}

/// `_ibv_query_gid_ex` (behind verbs.h's `ibv_query_gid_ex`): 0 or errno (EINVAL: bad
/// arguments, flags not 0, entry_size too small; ENODATA: an empty GID entry).
///
/// # Safety
/// `entry` is NULL or points to `entry_size` writable bytes.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi_errno(|| {
        let dev = device_of(context)?;
        if port_num != 1
            || entry.is_null()
            || flags != 0
            || entry_size < core::mem::size_of::<ibv_gid_entry>()
        {
            return Err(libc::EINVAL);
        }
        let e = gid_entry(dev, gid_index)?;
        // SAFETY: non-NULL with at least sizeof(ibv_gid_entry) writable bytes.
        unsafe { entry.write(e) };
        Ok(())
    })
}

/// `_ibv_query_gid_table` (behind `ibv_query_gid_table`): the number of populated entries
/// written, or a negative errno (EINVAL, also when `max_entries` is too small, as the kernel
/// answers rdma-core).
///
/// # Safety
/// `entries` is NULL or points to `max_entries * entry_size` writable bytes.
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(
        || -(crate::errno::PANIC_ERRNO as isize),
        || {
            let Ok(dev) = device_of(context) else {
                return -(libc::EINVAL as isize);
            };
            if entries.is_null() || flags != 0 || entry_size < core::mem::size_of::<ibv_gid_entry>()
            {
                return -(libc::EINVAL as isize);
            }
            if max_entries < POPULATED_GIDS as usize {
                return -(libc::EINVAL as isize);
            }
            for i in 0..POPULATED_GIDS {
                let Ok(e) = gid_entry(dev, i) else {
                    return -(libc::EINVAL as isize);
                };
                // SAFETY: `i < max_entries`; each entry is `entry_size` bytes apart and
                // writable per the contract (write_unaligned: entry_size may be odd).
                unsafe {
                    entries
                        .cast::<u8>()
                        .add(i as usize * entry_size)
                        .cast::<ibv_gid_entry>()
                        .write_unaligned(e)
                };
            }
            POPULATED_GIDS as isize
        },
    )
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by `ibv_devinfo`): RoCE v2 for the
/// populated entries. 0, or -1 with errno (EINVAL; ENODATA for an empty entry).
///
/// # Safety
/// `gid_type` is NULL or points to a writable `int`.
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    ffi_minus1(|| {
        let dev = device_of(context)?;
        if port_num != 1 || gid_type.is_null() {
            return Err(libc::EINVAL);
        }
        gid(dev, index).ok_or(libc::EINVAL)?;
        // SAFETY: non-NULL and writable per the contract.
        unsafe { *gid_type = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        Ok(())
    })
}

/// `ibv_query_pkey`: index 0 holds the default P_Key 0xffff (network byte order). 0, or -1
/// with errno EINVAL.
///
/// # Safety
/// `pkey` is NULL or points to a writable `__be16`.
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi_minus1(|| {
        device_of(context)?;
        if port_num != 1 || index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { *pkey = 0xffffu16.to_be() };
        Ok(())
    })
}

/// `ibv_get_pkey_index`: 0 for the default P_Key (either membership bit), else -1 (errno
/// ENOENT; EINVAL for a bad context or port).
///
/// # Safety
/// None beyond the C API's: any pointer is accepted.
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(
        || -1,
        || {
            let r = device_of(context).and_then(|_| {
                if port_num != 1 {
                    Err(libc::EINVAL)
                } else if u16::from_be(pkey) & 0x7fff == 0x7fff {
                    Ok(0)
                } else {
                    Err(libc::ENOENT)
                }
            });
            r.unwrap_or_else(|e| {
                crate::errno::set_errno(e);
                -1
            })
        },
    )
}
