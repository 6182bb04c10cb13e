//! The exported C symbols and their version nodes.
//!
//! Why not `#[no_mangle]`: rustc gives a cdylib its own (unversioned) version script listing
//! every `#[no_mangle]` symbol, and the linker then ignores the nodes of `libibverbs.map`
//! for them. So the Rust functions keep mangled, internal names, and each C name is a
//! one-instruction trampoline defined in `global_asm!` (a tail jump: arguments and return
//! value pass through untouched). rustc's script does not name those symbols, so
//! `libibverbs.map` assigns their nodes. `tests/exports.rs` checks this table, the map and
//! the built library against each other.
//!
//! A few symbols exist only as compatibility versions (`name@NODE`, not the default
//! `name@@NODE`): programs linked long ago still bind to them, but a new link cannot. Those
//! are listed by `compat_exports!`: the trampoline gets an internal name
//! (`softrdma_compat_<name>`, kept local by the map's `local: *`) and `.symver` gives it the
//! non-default version.

/// The parts of a trampoline that differ between targets: the symbol type's syntax and the
/// tail jump to the operand `f`.
#[cfg(target_arch = "x86_64")]
macro_rules! arch {
    (function) => {
        "@function"
    };
    (jump) => {
        "jmp {f}"
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! arch {
    (function) => {
        "%function"
    };
    (jump) => {
        "b {f}"
    };
}

/// One trampoline, what `exports!` and `compat_exports!` both expand to: the global function
/// `$prefix$name`, a tail jump to `$path`, and then the assembler lines `$extra`.
macro_rules! trampoline {
    ($prefix:literal, $name:ident = $path:path $(, $extra:expr)* $(,)?) => {
        core::arch::global_asm!(
            ".pushsection .text",
            concat!(".globl ", $prefix, stringify!($name)),
            concat!(".type ", $prefix, stringify!($name), ",", arch!(function)),
            ".p2align 4",
            concat!($prefix, stringify!($name), ":"),
            arch!(jump),
            concat!(".size ", $prefix, stringify!($name), ", . - ", $prefix, stringify!($name)),
            $( $extra, )*
            ".popsection",
            f = sym $path,
        );
    };
}

macro_rules! exports {
    ($( $node:literal => [ $( $name:ident = $path:path ),* $(,)? ] ),* $(,)?) => {
        $( $( trampoline!("", $name = $path); )* )*

        /// Every exported symbol with its version node.
        pub const EXPORTS: &[(&str, &str)] = &[ $( $( (stringify!($name), $node), )* )* ];
    };
}

macro_rules! compat_exports {
    ($( $node:literal => [ $( $name:ident = $path:path ),* $(,)? ] ),* $(,)?) => {
        $( $(
            trampoline!(
                "softrdma_compat_",
                $name = $path,
                concat!(".symver softrdma_compat_", stringify!($name), ", ", stringify!($name),
                    "@", $node),
            );
        )* )*

        /// Every compatibility-only symbol (non-default version) with its version node.
        pub const COMPAT_EXPORTS: &[(&str, &str)] = &[ $( $( (stringify!($name), $node), )* )* ];
    };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("softrdma-ibverbs exports its symbols with x86_64 or aarch64 trampolines");

use crate::{ah, channel as ch, context as cx, cq, device as dv, mr, open as op, qp, query as q};
use crate::{import as im, marshall as ma, rate, sdv, srq, strings as st, sysfs as fs};

exports! {
    "IBVERBS_1.0" => [
        ibv_create_comp_channel = ch::ibv_create_comp_channel,
        ibv_destroy_comp_channel = ch::ibv_destroy_comp_channel,
        ibv_copy_path_rec_from_kern = ma::ibv_copy_path_rec_from_kern,
        ibv_copy_path_rec_to_kern = ma::ibv_copy_path_rec_to_kern,
        ibv_copy_qp_attr_from_kern = ma::ibv_copy_qp_attr_from_kern,
        ibv_get_sysfs_path = fs::ibv_get_sysfs_path,
        ibv_rate_to_mult = rate::ibv_rate_to_mult,
        ibv_read_sysfs_file = fs::ibv_read_sysfs_file,
        mult_to_ibv_rate = rate::mult_to_ibv_rate,
    ],
    "IBVERBS_1.1" => [
        ibv_ack_async_event = cx::ibv_ack_async_event,
        ibv_ack_cq_events = ch::ibv_ack_cq_events,
        ibv_alloc_pd = mr::ibv_alloc_pd,
        ibv_attach_mcast = qp::ibv_attach_mcast,
        ibv_close_device = op::ibv_close_device,
        ibv_copy_ah_attr_from_kern = ma::ibv_copy_ah_attr_from_kern,
        ibv_create_ah = ah::ibv_create_ah,
        ibv_create_ah_from_wc = ah::ibv_create_ah_from_wc,
        ibv_create_cq = cq::ibv_create_cq,
        ibv_create_qp = qp::ibv_create_qp,
        ibv_create_srq = srq::ibv_create_srq,
        ibv_dealloc_pd = mr::ibv_dealloc_pd,
        ibv_dereg_mr = mr::ibv_dereg_mr,
        ibv_destroy_ah = ah::ibv_destroy_ah,
        ibv_destroy_cq = cq::ibv_destroy_cq,
        ibv_destroy_qp = qp::ibv_destroy_qp,
        ibv_destroy_srq = srq::ibv_destroy_srq,
        ibv_detach_mcast = qp::ibv_detach_mcast,
        ibv_dofork_range = fs::ibv_dofork_range,
        ibv_dontfork_range = fs::ibv_dofork_range,
        ibv_event_type_str = st::ibv_event_type_str,
        ibv_fork_init = fs::ibv_fork_init,
        ibv_free_device_list = dv::ibv_free_device_list,
        ibv_get_async_event = cx::ibv_get_async_event,
        ibv_get_cq_event = ch::ibv_get_cq_event,
        ibv_get_device_guid = dv::ibv_get_device_guid,
        ibv_get_device_list = dv::ibv_get_device_list,
        ibv_get_device_name = dv::ibv_get_device_name,
        ibv_init_ah_from_wc = ah::ibv_init_ah_from_wc,
        ibv_modify_qp = qp::ibv_modify_qp,
        ibv_modify_srq = srq::ibv_modify_srq,
        ibv_node_type_str = st::ibv_node_type_str,
        ibv_open_device = op::ibv_open_device,
        ibv_port_state_str = st::ibv_port_state_str,
        ibv_query_device = q::ibv_query_device,
        ibv_query_gid = q::ibv_query_gid,
        ibv_query_pkey = q::ibv_query_pkey,
        ibv_query_port = q::ibv_query_port,
        ibv_query_qp = qp::ibv_query_qp,
        ibv_query_srq = srq::ibv_query_srq,
        ibv_rate_to_mbps = rate::ibv_rate_to_mbps,
        ibv_reg_mr = mr::ibv_reg_mr,
        ibv_rereg_mr = mr::ibv_rereg_mr,
        ibv_resize_cq = cq::ibv_resize_cq,
        ibv_resolve_eth_l2_from_gid = ah::ibv_resolve_eth_l2_from_gid,
        ibv_wc_status_str = st::ibv_wc_status_str,
        mbps_to_ibv_rate = rate::mbps_to_ibv_rate,
    ],
    "IBVERBS_1.5" => [ibv_get_pkey_index = q::ibv_get_pkey_index],
    "IBVERBS_1.6" => [ibv_qp_to_qp_ex = qp::ibv_qp_to_qp_ex],
    "IBVERBS_1.7" => [ibv_reg_mr_iova = mr::ibv_reg_mr_iova],
    "IBVERBS_1.8" => [ibv_reg_mr_iova2 = mr::ibv_reg_mr_iova2],
    "IBVERBS_1.9" => [ibv_get_device_index = dv::ibv_get_device_index],
    "IBVERBS_1.10" => [
        ibv_import_device = im::ibv_import_device,
        ibv_import_mr = im::ibv_import_mr,
        ibv_import_pd = im::ibv_import_pd,
        ibv_query_ece = qp::ibv_query_ece,
        ibv_set_ece = qp::ibv_set_ece,
        ibv_unimport_mr = im::ibv_unimport_mr,
        ibv_unimport_pd = im::ibv_unimport_pd,
    ],
    "IBVERBS_1.11" => [
        _ibv_query_gid_ex = q::_ibv_query_gid_ex,
        _ibv_query_gid_table = q::_ibv_query_gid_table,
    ],
    "IBVERBS_1.12" => [ibv_reg_dmabuf_mr = mr::ibv_reg_dmabuf_mr],
    "IBVERBS_1.13" => [
        ibv_import_dm = im::ibv_import_dm,
        ibv_is_fork_initialized = fs::ibv_is_fork_initialized,
        ibv_unimport_dm = im::ibv_unimport_dm,
    ],
    "IBVERBS_1.14" => [ibv_query_qp_data_in_order = qp::ibv_query_qp_data_in_order],
    "IBVERBS_PRIVATE_34" => [ibv_query_gid_type = q::ibv_query_gid_type],
    "SOFTRDMA_1.0" => [
        softrdma_mr_get_remap_policy = sdv::softrdma_mr_get_remap_policy,
        softrdma_mr_query_coherence = sdv::softrdma_mr_query_coherence,
        softrdma_mr_resume = sdv::softrdma_mr_resume,
        softrdma_mr_set_remap_policy = sdv::softrdma_mr_set_remap_policy,
        softrdma_mr_suspend = sdv::softrdma_mr_suspend,
        softrdma_query_counters = sdv::softrdma_query_counters,
        softrdma_query_qp_counters = sdv::softrdma_query_qp_counters,
    ],
    "SOFTRDMA_PRIVATE_RDMACM" => [
        softrdma_rdmacm_ops = crate::rdmacm::ops::softrdma_rdmacm_ops,
    ],
}

compat_exports! {
    "IBVERBS_1.1" => [ibv_register_driver = dv::ibv_register_driver],
}
