//! `ibv_*_str`: names of enum values, as static C strings (never NULL).

use core::ffi::{c_char, c_int};

fn s(b: &'static [u8]) -> *const c_char {
    b.as_ptr().cast()
}

/// `ibv_wc_status_str`.
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: [&[u8]; 23] = [
        b"success\0",
        b"local length error\0",
        b"local QP operation error\0",
        b"local EE context operation error\0",
        b"local protection error\0",
        b"Work Request Flushed Error\0",
        b"memory bind operation error\0",
        b"bad response error\0",
        b"local access error\0",
        b"remote invalid request error\0",
        b"remote access error\0",
        b"remote operation error\0",
        b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0",
        b"local RDD violation error\0",
        b"remote invalid RD request\0",
        b"aborted error\0",
        b"invalid EE context number\0",
        b"invalid EE context state\0",
        b"fatal error\0",
        b"response timeout error\0",
        b"general error\0",
        b"TM error\0",
    ];
    s(usize::try_from(status)
        .ok()
        .and_then(|i| T.get(i))
        .copied()
        .unwrap_or(b"unknown\0"))
}

/// `ibv_node_type_str`.
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    s(match node_type {
        1 => b"InfiniBand channel adapter\0",
        2 => b"InfiniBand switch\0",
        3 => b"InfiniBand router\0",
        4 => b"iWARP NIC\0",
        5 => b"usNIC\0",
        6 => b"usNIC UDP\0",
        7 => b"unspecified\0",
        _ => b"unknown\0",
    })
}

/// `ibv_port_state_str`.
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    s(match port_state {
        0 => b"PORT_NOP\0",
        1 => b"PORT_DOWN\0",
        2 => b"PORT_INIT\0",
        3 => b"PORT_ARMED\0",
        4 => b"PORT_ACTIVE\0",
        5 => b"PORT_ACTIVE_DEFER\0",
        _ => b"invalid state\0",
    })
}

/// `ibv_event_type_str`.
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: [&[u8]; 20] = [
        b"CQ error\0",
        b"local work queue catastrophic error\0",
        b"invalid request local work queue error\0",
        b"local access violation work queue error\0",
        b"communication established\0",
        b"send queue drained\0",
        b"path migrated\0",
        b"path migration request error\0",
        b"local catastrophic error\0",
        b"port active\0",
        b"port error\0",
        b"LID change\0",
        b"P_Key change\0",
        b"SM change\0",
        b"SRQ catastrophic error\0",
        b"SRQ limit reached\0",
        b"last WQE reached\0",
        b"client reregistration\0",
        b"GID table change\0",
        b"WQ fatal\0",
    ];
    s(usize::try_from(event)
        .ok()
        .and_then(|i| T.get(i))
        .copied()
        .unwrap_or(b"unknown\0"))
}
