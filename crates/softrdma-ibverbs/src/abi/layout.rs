//! The offsets and sizes this library relies on, as a table that `tests/layout.rs` turns into a
//! C probe (`offsetof`/`sizeof`/`_Alignof` against the installed `infiniband/verbs.h`, and
//! against this crate's `include/softrdma/sdv.h` for softrdma's own structs).

use core::mem::{align_of, offset_of, size_of};

use super::*;

/// One row: a whole struct (`field` empty: `offset` is its alignment) or one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// The C type, e.g. `struct ibv_context`.
    pub c_type: &'static str,
    /// The C member designator (`wr.rdma.rkey`), or empty for the whole type.
    pub field: &'static str,
    /// Offset of the field, or alignment of the type.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Size of the pointee of a projection closure that is never called.
fn pointee_size<S, T>(_project: fn(*const S) -> *const T) -> usize {
    size_of::<T>()
}

macro_rules! ty {
    ($c:literal, $t:ty) => {
        FieldLayout {
            c_type: $c,
            field: "",
            offset: align_of::<$t>(),
            size: size_of::<$t>(),
        }
    };
}

macro_rules! fields {
    ($out:ident, $c:literal, $t:ty { $($cf:literal => $($rf:ident).+),* $(,)? }) => {
        $out.push(ty!($c, $t));
        $(
            $out.push(FieldLayout {
                c_type: $c,
                field: $cf,
                offset: offset_of!($t, $($rf).+),
                // SAFETY: the closure is never called; only its type is used.
                size: pointee_size::<$t, _>(|p| unsafe { core::ptr::addr_of!((*p).$($rf).+) }),
            });
        )*
    };
}

/// Every struct this library mirrors, with every field.
pub fn table() -> Vec<FieldLayout> {
    let mut t = Vec::new();
    fields!(t, "struct _ibv_device_ops", _ibv_device_ops {
        "_dummy1" => _dummy1, "_dummy2" => _dummy2,
    });
    fields!(t, "struct ibv_device", ibv_device {
        "_ops" => _ops, "node_type" => node_type, "transport_type" => transport_type,
        "name" => name, "dev_name" => dev_name, "dev_path" => dev_path,
        "ibdev_path" => ibdev_path,
    });
    fields!(t, "struct ibv_context_ops", ibv_context_ops {
        "_compat_query_device" => _compat_query_device,
        "_compat_query_port" => _compat_query_port,
        "_compat_alloc_pd" => _compat_alloc_pd,
        "_compat_dealloc_pd" => _compat_dealloc_pd,
        "_compat_reg_mr" => _compat_reg_mr,
        "_compat_rereg_mr" => _compat_rereg_mr,
        "_compat_dereg_mr" => _compat_dereg_mr,
        "alloc_mw" => alloc_mw, "bind_mw" => bind_mw, "dealloc_mw" => dealloc_mw,
        "_compat_create_cq" => _compat_create_cq,
        "poll_cq" => poll_cq, "req_notify_cq" => req_notify_cq,
        "_compat_cq_event" => _compat_cq_event,
        "_compat_resize_cq" => _compat_resize_cq,
        "_compat_destroy_cq" => _compat_destroy_cq,
        "_compat_create_srq" => _compat_create_srq,
        "_compat_modify_srq" => _compat_modify_srq,
        "_compat_query_srq" => _compat_query_srq,
        "_compat_destroy_srq" => _compat_destroy_srq,
        "post_srq_recv" => post_srq_recv,
        "_compat_create_qp" => _compat_create_qp,
        "_compat_query_qp" => _compat_query_qp,
        "_compat_modify_qp" => _compat_modify_qp,
        "_compat_destroy_qp" => _compat_destroy_qp,
        "post_send" => post_send, "post_recv" => post_recv,
        "_compat_create_ah" => _compat_create_ah,
        "_compat_destroy_ah" => _compat_destroy_ah,
        "_compat_attach_mcast" => _compat_attach_mcast,
        "_compat_detach_mcast" => _compat_detach_mcast,
        "_compat_async_event" => _compat_async_event,
    });
    fields!(t, "struct ibv_context", ibv_context {
        "device" => device, "ops" => ops, "cmd_fd" => cmd_fd, "async_fd" => async_fd,
        "num_comp_vectors" => num_comp_vectors, "mutex" => mutex, "abi_compat" => abi_compat,
    });
    fields!(t, "struct verbs_context", verbs_context {
        "sz" => sz, "context" => context,
    });
    // The named extended slots phase 2 may fill, by index into `verbs_context::ops`.
    for (name, slot) in [
        ("query_port", vctx_slot::QUERY_PORT),
        ("advise_mr", vctx_slot::ADVISE_MR),
        ("reg_dm_mr", vctx_slot::REG_DM_MR),
        ("alloc_dm", vctx_slot::ALLOC_DM),
        ("free_dm", vctx_slot::FREE_DM),
        ("create_cq_ex", vctx_slot::CREATE_CQ_EX),
        ("query_device_ex", vctx_slot::QUERY_DEVICE_EX),
        ("open_qp", vctx_slot::OPEN_QP),
        ("create_qp_ex", vctx_slot::CREATE_QP_EX),
        ("create_srq_ex", vctx_slot::CREATE_SRQ_EX),
    ] {
        t.push(FieldLayout {
            c_type: "struct verbs_context",
            field: name,
            offset: offset_of!(verbs_context, ops) + slot * size_of::<CompatSlot>(),
            size: size_of::<CompatSlot>(),
        });
    }
    fields!(t, "struct ibv_device_attr", ibv_device_attr {
        "fw_ver" => fw_ver, "node_guid" => node_guid, "sys_image_guid" => sys_image_guid,
        "max_mr_size" => max_mr_size, "page_size_cap" => page_size_cap,
        "vendor_id" => vendor_id, "vendor_part_id" => vendor_part_id, "hw_ver" => hw_ver,
        "max_qp" => max_qp, "max_qp_wr" => max_qp_wr, "device_cap_flags" => device_cap_flags,
        "max_sge" => max_sge, "max_sge_rd" => max_sge_rd, "max_cq" => max_cq,
        "max_cqe" => max_cqe, "max_mr" => max_mr, "max_pd" => max_pd,
        "max_qp_rd_atom" => max_qp_rd_atom, "max_ee_rd_atom" => max_ee_rd_atom,
        "max_res_rd_atom" => max_res_rd_atom, "max_qp_init_rd_atom" => max_qp_init_rd_atom,
        "max_ee_init_rd_atom" => max_ee_init_rd_atom, "atomic_cap" => atomic_cap,
        "max_ee" => max_ee, "max_rdd" => max_rdd, "max_mw" => max_mw,
        "max_raw_ipv6_qp" => max_raw_ipv6_qp, "max_raw_ethy_qp" => max_raw_ethy_qp,
        "max_mcast_grp" => max_mcast_grp, "max_mcast_qp_attach" => max_mcast_qp_attach,
        "max_total_mcast_qp_attach" => max_total_mcast_qp_attach, "max_ah" => max_ah,
        "max_fmr" => max_fmr, "max_map_per_fmr" => max_map_per_fmr, "max_srq" => max_srq,
        "max_srq_wr" => max_srq_wr, "max_srq_sge" => max_srq_sge, "max_pkeys" => max_pkeys,
        "local_ca_ack_delay" => local_ca_ack_delay, "phys_port_cnt" => phys_port_cnt,
    });
    fields!(t, "struct ibv_port_attr", ibv_port_attr {
        "state" => state, "max_mtu" => max_mtu, "active_mtu" => active_mtu,
        "gid_tbl_len" => gid_tbl_len, "port_cap_flags" => port_cap_flags,
        "max_msg_sz" => max_msg_sz, "bad_pkey_cntr" => bad_pkey_cntr,
        "qkey_viol_cntr" => qkey_viol_cntr, "pkey_tbl_len" => pkey_tbl_len, "lid" => lid,
        "sm_lid" => sm_lid, "lmc" => lmc, "max_vl_num" => max_vl_num, "sm_sl" => sm_sl,
        "subnet_timeout" => subnet_timeout, "init_type_reply" => init_type_reply,
        "active_width" => active_width, "active_speed" => active_speed,
        "phys_state" => phys_state, "link_layer" => link_layer, "flags" => flags,
        "port_cap_flags2" => port_cap_flags2,
    });
    fields!(t, "union ibv_gid", ibv_gid {
        "raw" => raw, "global.subnet_prefix" => global.subnet_prefix,
        "global.interface_id" => global.interface_id,
    });
    fields!(t, "struct ibv_gid_entry", ibv_gid_entry {
        "gid" => gid, "gid_index" => gid_index, "port_num" => port_num,
        "gid_type" => gid_type, "ndev_ifindex" => ndev_ifindex,
    });
    fields!(t, "struct ibv_async_event", ibv_async_event {
        "element.cq" => element.cq, "element.qp" => element.qp,
        "element.srq" => element.srq, "element.wq" => element.wq,
        "element.port_num" => element.port_num, "event_type" => event_type,
    });
    fields!(t, "struct ibv_pd", ibv_pd { "context" => context, "handle" => handle });
    fields!(t, "struct ibv_mr", ibv_mr {
        "context" => context, "pd" => pd, "addr" => addr, "length" => length,
        "handle" => handle, "lkey" => lkey, "rkey" => rkey,
    });
    fields!(t, "struct ibv_mw", ibv_mw {
        "context" => context, "pd" => pd, "rkey" => rkey, "handle" => handle, "type" => type_,
    });
    fields!(t, "struct ibv_comp_channel", ibv_comp_channel {
        "context" => context, "fd" => fd, "refcnt" => refcnt,
    });
    fields!(t, "struct ibv_cq", ibv_cq {
        "context" => context, "channel" => channel, "cq_context" => cq_context,
        "handle" => handle, "cqe" => cqe, "mutex" => mutex, "cond" => cond,
        "comp_events_completed" => comp_events_completed,
        "async_events_completed" => async_events_completed,
    });
    fields!(t, "struct ibv_cq_ex", ibv_cq_ex {
        "context" => context, "channel" => channel, "cq_context" => cq_context,
        "handle" => handle, "cqe" => cqe, "mutex" => mutex, "cond" => cond,
        "comp_events_completed" => comp_events_completed,
        "async_events_completed" => async_events_completed, "comp_mask" => comp_mask,
        "status" => status, "wr_id" => wr_id, "start_poll" => start_poll,
        "next_poll" => next_poll, "end_poll" => end_poll, "read_opcode" => read_opcode,
        "read_vendor_err" => read_vendor_err, "read_byte_len" => read_byte_len,
        "read_imm_data" => read_imm_data, "read_qp_num" => read_qp_num,
        "read_src_qp" => read_src_qp, "read_wc_flags" => read_wc_flags,
        "read_slid" => read_slid, "read_sl" => read_sl,
        "read_dlid_path_bits" => read_dlid_path_bits,
        "read_completion_ts" => read_completion_ts, "read_cvlan" => read_cvlan,
        "read_flow_tag" => read_flow_tag, "read_tm_info" => read_tm_info,
        "read_completion_wallclock_ns" => read_completion_wallclock_ns,
    });
    fields!(t, "struct ibv_poll_cq_attr", ibv_poll_cq_attr { "comp_mask" => comp_mask });
    fields!(t, "struct ibv_wc_tm_info", ibv_wc_tm_info { "tag" => tag, "priv" => priv_ });
    fields!(t, "struct ibv_cq_init_attr_ex", ibv_cq_init_attr_ex {
        "cqe" => cqe, "cq_context" => cq_context, "channel" => channel,
        "comp_vector" => comp_vector, "wc_flags" => wc_flags, "comp_mask" => comp_mask,
        "flags" => flags, "parent_domain" => parent_domain,
    });
    fields!(t, "struct ibv_qp", ibv_qp {
        "context" => context, "qp_context" => qp_context, "pd" => pd, "send_cq" => send_cq,
        "recv_cq" => recv_cq, "srq" => srq, "handle" => handle, "qp_num" => qp_num,
        "state" => state, "qp_type" => qp_type, "mutex" => mutex, "cond" => cond,
        "events_completed" => events_completed,
    });
    fields!(t, "struct ibv_qp_ex", ibv_qp_ex {
        "qp_base" => qp_base, "comp_mask" => comp_mask, "wr_id" => wr_id,
        "wr_flags" => wr_flags, "wr_atomic_cmp_swp" => wr_atomic_cmp_swp,
        "wr_atomic_fetch_add" => wr_atomic_fetch_add, "wr_bind_mw" => wr_bind_mw,
        "wr_local_inv" => wr_local_inv, "wr_rdma_read" => wr_rdma_read,
        "wr_rdma_write" => wr_rdma_write, "wr_rdma_write_imm" => wr_rdma_write_imm,
        "wr_send" => wr_send, "wr_send_imm" => wr_send_imm, "wr_send_inv" => wr_send_inv,
        "wr_send_tso" => wr_send_tso, "wr_set_ud_addr" => wr_set_ud_addr,
        "wr_set_xrc_srqn" => wr_set_xrc_srqn, "wr_set_inline_data" => wr_set_inline_data,
        "wr_set_inline_data_list" => wr_set_inline_data_list, "wr_set_sge" => wr_set_sge,
        "wr_set_sge_list" => wr_set_sge_list, "wr_start" => wr_start,
        "wr_complete" => wr_complete, "wr_abort" => wr_abort,
        "wr_atomic_write" => wr_atomic_write,
    });
    fields!(t, "struct ibv_data_buf", ibv_data_buf { "addr" => addr, "length" => length });
    fields!(t, "struct ibv_parent_domain_init_attr", ibv_parent_domain_init_attr {
        "pd" => pd, "td" => td, "comp_mask" => comp_mask, "alloc" => alloc, "free" => free,
        "pd_context" => pd_context,
    });
    fields!(t, "struct ibv_srq", ibv_srq {
        "context" => context, "srq_context" => srq_context, "pd" => pd, "handle" => handle,
        "mutex" => mutex, "cond" => cond, "events_completed" => events_completed,
    });
    fields!(t, "struct ibv_ah", ibv_ah { "context" => context, "pd" => pd, "handle" => handle });
    fields!(t, "struct ibv_sge", ibv_sge { "addr" => addr, "length" => length, "lkey" => lkey });
    fields!(t, "struct ibv_send_wr", ibv_send_wr {
        "wr_id" => wr_id, "next" => next, "sg_list" => sg_list, "num_sge" => num_sge,
        "opcode" => opcode, "send_flags" => send_flags, "imm_data" => imm_data,
        "invalidate_rkey" => imm_data, "wr" => wr,
        "wr.rdma.remote_addr" => wr.rdma.remote_addr, "wr.rdma.rkey" => wr.rdma.rkey,
        "wr.atomic.remote_addr" => wr.atomic.remote_addr,
        "wr.atomic.compare_add" => wr.atomic.compare_add,
        "wr.atomic.swap" => wr.atomic.swap, "wr.atomic.rkey" => wr.atomic.rkey,
        "wr.ud.ah" => wr.ud.ah, "wr.ud.remote_qpn" => wr.ud.remote_qpn,
        "wr.ud.remote_qkey" => wr.ud.remote_qkey,
        "qp_type.xrc.remote_srqn" => qp_type.xrc.remote_srqn,
        "bind_mw" => ext.bind_mw, "bind_mw.mw" => ext.bind_mw.mw,
        "bind_mw.rkey" => ext.bind_mw.rkey, "bind_mw.bind_info" => ext.bind_mw.bind_info,
        "tso" => ext.tso, "tso.hdr" => ext.tso.hdr, "tso.hdr_sz" => ext.tso.hdr_sz,
        "tso.mss" => ext.tso.mss,
    });
    fields!(t, "struct ibv_recv_wr", ibv_recv_wr {
        "wr_id" => wr_id, "next" => next, "sg_list" => sg_list, "num_sge" => num_sge,
    });
    fields!(t, "struct ibv_wc", ibv_wc {
        "wr_id" => wr_id, "status" => status, "opcode" => opcode, "vendor_err" => vendor_err,
        "byte_len" => byte_len, "imm_data" => imm_data, "invalidated_rkey" => imm_data,
        "qp_num" => qp_num, "src_qp" => src_qp, "wc_flags" => wc_flags,
        "pkey_index" => pkey_index, "slid" => slid, "sl" => sl,
        "dlid_path_bits" => dlid_path_bits,
    });
    fields!(t, "struct ibv_mw_bind_info", ibv_mw_bind_info {
        "mr" => mr, "addr" => addr, "length" => length, "mw_access_flags" => mw_access_flags,
    });
    fields!(t, "struct ibv_mw_bind", ibv_mw_bind {
        "wr_id" => wr_id, "send_flags" => send_flags, "bind_info" => bind_info,
    });
    fields!(t, "struct ibv_global_route", ibv_global_route {
        "dgid" => dgid, "flow_label" => flow_label, "sgid_index" => sgid_index,
        "hop_limit" => hop_limit, "traffic_class" => traffic_class,
    });
    fields!(t, "struct ibv_ah_attr", ibv_ah_attr {
        "grh" => grh, "dlid" => dlid, "sl" => sl, "src_path_bits" => src_path_bits,
        "static_rate" => static_rate, "is_global" => is_global, "port_num" => port_num,
    });
    fields!(t, "struct ibv_qp_cap", ibv_qp_cap {
        "max_send_wr" => max_send_wr, "max_recv_wr" => max_recv_wr,
        "max_send_sge" => max_send_sge, "max_recv_sge" => max_recv_sge,
        "max_inline_data" => max_inline_data,
    });
    fields!(t, "struct ibv_ece", ibv_ece {
        "vendor_id" => vendor_id, "options" => options, "comp_mask" => comp_mask,
    });
    fields!(t, "struct ibv_qp_attr", ibv_qp_attr {
        "qp_state" => qp_state, "cur_qp_state" => cur_qp_state, "path_mtu" => path_mtu,
        "path_mig_state" => path_mig_state, "qkey" => qkey, "rq_psn" => rq_psn,
        "sq_psn" => sq_psn, "dest_qp_num" => dest_qp_num,
        "qp_access_flags" => qp_access_flags, "cap" => cap, "ah_attr" => ah_attr,
        "alt_ah_attr" => alt_ah_attr, "pkey_index" => pkey_index,
        "alt_pkey_index" => alt_pkey_index, "en_sqd_async_notify" => en_sqd_async_notify,
        "sq_draining" => sq_draining, "max_rd_atomic" => max_rd_atomic,
        "max_dest_rd_atomic" => max_dest_rd_atomic, "min_rnr_timer" => min_rnr_timer,
        "port_num" => port_num, "timeout" => timeout, "retry_cnt" => retry_cnt,
        "rnr_retry" => rnr_retry, "alt_port_num" => alt_port_num,
        "alt_timeout" => alt_timeout, "rate_limit" => rate_limit,
    });
    fields!(t, "struct ibv_qp_init_attr", ibv_qp_init_attr {
        "qp_context" => qp_context, "send_cq" => send_cq, "recv_cq" => recv_cq,
        "srq" => srq, "cap" => cap, "qp_type" => qp_type, "sq_sig_all" => sq_sig_all,
    });
    fields!(t, "struct ibv_rx_hash_conf", ibv_rx_hash_conf {
        "rx_hash_function" => rx_hash_function, "rx_hash_key_len" => rx_hash_key_len,
        "rx_hash_key" => rx_hash_key, "rx_hash_fields_mask" => rx_hash_fields_mask,
    });
    fields!(t, "struct ibv_qp_init_attr_ex", ibv_qp_init_attr_ex {
        "qp_context" => qp_context, "send_cq" => send_cq, "recv_cq" => recv_cq,
        "srq" => srq, "cap" => cap, "qp_type" => qp_type, "sq_sig_all" => sq_sig_all,
        "comp_mask" => comp_mask, "pd" => pd, "xrcd" => xrcd, "create_flags" => create_flags,
        "max_tso_header" => max_tso_header, "rwq_ind_tbl" => rwq_ind_tbl,
        "rx_hash_conf" => rx_hash_conf, "source_qpn" => source_qpn,
        "send_ops_flags" => send_ops_flags,
    });
    fields!(t, "struct ibv_srq_attr", ibv_srq_attr {
        "max_wr" => max_wr, "max_sge" => max_sge, "srq_limit" => srq_limit,
    });
    fields!(t, "struct ibv_srq_init_attr", ibv_srq_init_attr {
        "srq_context" => srq_context, "attr" => attr,
    });
    ext(&mut t);
    t
}

/// Device memory, the extended device attributes, and softrdma's own `softrdma/sdv.h`.
fn ext(t: &mut Vec<FieldLayout>) {
    fields!(t, "struct ibv_dm", ibv_dm {
        "context" => context, "memcpy_to_dm" => memcpy_to_dm,
        "memcpy_from_dm" => memcpy_from_dm, "comp_mask" => comp_mask, "handle" => handle,
    });
    fields!(t, "struct ibv_alloc_dm_attr", ibv_alloc_dm_attr {
        "length" => length, "log_align_req" => log_align_req, "comp_mask" => comp_mask,
    });
    fields!(t, "struct ibv_query_device_ex_input", ibv_query_device_ex_input {
        "comp_mask" => comp_mask,
    });
    fields!(t, "struct ibv_odp_caps", ibv_odp_caps {
        "general_caps" => general_caps, "per_transport_caps" => per_transport_caps,
        "per_transport_caps.rc_odp_caps" => per_transport_caps.rc_odp_caps,
        "per_transport_caps.uc_odp_caps" => per_transport_caps.uc_odp_caps,
        "per_transport_caps.ud_odp_caps" => per_transport_caps.ud_odp_caps,
    });
    fields!(t, "struct ibv_tso_caps", ibv_tso_caps {
        "max_tso" => max_tso, "supported_qpts" => supported_qpts,
    });
    fields!(t, "struct ibv_rss_caps", ibv_rss_caps {
        "supported_qpts" => supported_qpts,
        "max_rwq_indirection_tables" => max_rwq_indirection_tables,
        "max_rwq_indirection_table_size" => max_rwq_indirection_table_size,
        "rx_hash_fields_mask" => rx_hash_fields_mask, "rx_hash_function" => rx_hash_function,
    });
    fields!(t, "struct ibv_packet_pacing_caps", ibv_packet_pacing_caps {
        "qp_rate_limit_min" => qp_rate_limit_min, "qp_rate_limit_max" => qp_rate_limit_max,
        "supported_qpts" => supported_qpts,
    });
    fields!(t, "struct ibv_tm_caps", ibv_tm_caps {
        "max_rndv_hdr_size" => max_rndv_hdr_size, "max_num_tags" => max_num_tags,
        "flags" => flags, "max_ops" => max_ops, "max_sge" => max_sge,
    });
    fields!(t, "struct ibv_cq_moderation_caps", ibv_cq_moderation_caps {
        "max_cq_count" => max_cq_count, "max_cq_period" => max_cq_period,
    });
    fields!(t, "struct ibv_pci_atomic_caps", ibv_pci_atomic_caps {
        "fetch_add" => fetch_add, "swap" => swap, "compare_swap" => compare_swap,
    });
    fields!(t, "struct ibv_device_attr_ex", ibv_device_attr_ex {
        "orig_attr" => orig_attr, "comp_mask" => comp_mask, "odp_caps" => odp_caps,
        "completion_timestamp_mask" => completion_timestamp_mask,
        "hca_core_clock" => hca_core_clock, "device_cap_flags_ex" => device_cap_flags_ex,
        "tso_caps" => tso_caps, "rss_caps" => rss_caps, "max_wq_type_rq" => max_wq_type_rq,
        "packet_pacing_caps" => packet_pacing_caps, "raw_packet_caps" => raw_packet_caps,
        "tm_caps" => tm_caps, "cq_mod_caps" => cq_mod_caps, "max_dm_size" => max_dm_size,
        "pci_atomic_caps" => pci_atomic_caps, "xrc_odp_caps" => xrc_odp_caps,
        "phys_port_cnt_ex" => phys_port_cnt_ex,
    });
    fields!(t, "struct softrdma_mr_coherence", softrdma_mr_coherence {
        "size" => size, "state" => state, "cause" => cause, "remap_policy" => remap_policy,
        "watched" => watched, "checked_copy" => checked_copy, "iova" => iova, "addr" => addr,
        "length" => length,
    });
    fields!(t, "struct softrdma_counters", softrdma_counters {
        "size" => size, "reserved" => reserved, "rx_datagrams" => rx_datagrams,
        "rx_packets" => rx_packets, "rx_bad" => rx_bad, "rx_icrc_solved" => rx_icrc_solved,
        "rx_unknown_qp" => rx_unknown_qp, "rx_wrong_peer" => rx_wrong_peer,
        "tx_datagrams" => tx_datagrams, "tx_packets" => tx_packets, "tx_errors" => tx_errors,
        "tx_zero_copy" => tx_zero_copy, "thread_wakeups" => thread_wakeups,
        "thread_receives" => thread_receives, "timer_scans" => timer_scans,
        "regions" => regions, "windows" => windows, "pds" => pds,
        "pinned_bytes" => pinned_bytes, "pin_refusals" => pin_refusals,
        "device_bytes" => device_bytes, "watched_regions" => watched_regions,
        "unwatched_regions" => unwatched_regions, "coherence_events" => coherence_events,
        "watch_invalidations" => watch_invalidations, "remaps_followed" => remaps_followed,
        "access_faults" => access_faults, "invalidations_dropped" => invalidations_dropped,
        "access_violations" => access_violations,
    });
    fields!(t, "struct softrdma_qp_counters", softrdma_qp_counters {
        "size" => size, "reserved" => reserved, "packets_sent" => packets_sent,
        "packets_received" => packets_received, "packets_dropped" => packets_dropped,
        "retransmits" => retransmits, "timeouts" => timeouts,
        "rnr_naks_received" => rnr_naks_received, "seq_naks_received" => seq_naks_received,
        "rerequests" => rerequests, "duplicates" => duplicates,
        "rnr_naks_sent" => rnr_naks_sent, "seq_naks_sent" => seq_naks_sent,
        "naks_sent" => naks_sent,
    });
}
