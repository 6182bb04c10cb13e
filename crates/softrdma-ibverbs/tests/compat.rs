//! The functions answered without the feature behind them (docs/IBVERBS.md, "Functions
//! without the feature"): through verbs.h against the built library (tests/c/compat.c), and
//! the pure ones compared with Debian's own libibverbs.so.1 on the same inputs.

mod common;

use core::ffi::{c_int, c_void};
use std::ffi::CString;
use std::path::Path;

use ibverbs::abi::{ibv_ah_attr, ibv_qp_attr};
use ibverbs::marshall::{
    self, ib_user_path_rec, ib_uverbs_ah_attr, ib_uverbs_qp_attr, ibv_sa_path_rec,
};
use ibverbs::rate;

const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

/// Rates, ECE, data-in-order, imports, L2 resolution, the copy helpers and
/// `ibv_register_driver@IBVERBS_1.1`, with NULL and foreign pointers (tests/c/compat.c).
#[test]
fn unsupported_features_answer_as_documented_through_verbs_h() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/compat.c");
    let out = common::run_c_program(
        &src,
        "softrdma0=127.0.0.67,softrdma1=127.0.0.68",
        Some("on-demand"),
        &[],
    );
    eprintln!("{out}");
}

/// Debian's library, opened privately (`RTLD_LOCAL`: nothing of it is visible to this
/// process's other lookups); None where it is not installed.
fn debian() -> Option<*mut c_void> {
    if !Path::new(DEBIAN_LIB).exists() {
        eprintln!("{DEBIAN_LIB} is not installed (libibverbs1): comparison skipped");
        return None;
    }
    let path = CString::new(DEBIAN_LIB).unwrap();
    // SAFETY: a valid C string; loading libibverbs runs no code that needs devices.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {DEBIAN_LIB} failed");
    Some(h)
}

/// The address of `name` (at its default version) in `h`.
fn sym(h: *mut c_void, name: &str) -> *mut c_void {
    let n = CString::new(name).unwrap();
    // SAFETY: a live handle and a valid C string.
    let p = unsafe { libc::dlsym(h, n.as_ptr()) };
    assert!(!p.is_null(), "{name} not found in {DEBIAN_LIB}");
    p
}

#[test]
fn rate_conversions_match_debians_library() {
    let Some(h) = debian() else { return };
    type F = extern "C" fn(c_int) -> c_int;
    let ours: [(&str, F); 4] = [
        ("ibv_rate_to_mult", rate::ibv_rate_to_mult),
        ("mult_to_ibv_rate", rate::mult_to_ibv_rate),
        ("ibv_rate_to_mbps", rate::ibv_rate_to_mbps),
        ("mbps_to_ibv_rate", rate::mbps_to_ibv_rate),
    ];
    for (name, f) in ours {
        // SAFETY: the symbol is this C function (verbs.h: int f(int) or an enum of int size).
        let theirs: F = unsafe { core::mem::transmute::<*mut c_void, F>(sym(h, name)) };
        let inputs = (-1000..1_300_000).chain([c_int::MIN, c_int::MAX, -1, 1 << 20]);
        for x in inputs {
            assert_eq!(f(x), theirs(x), "{name}({x})");
        }
    }
}

/// Deterministic filler (xorshift) so a failure reproduces.
fn fill(bytes: &mut [u8], seed: &mut u64) {
    for b in bytes {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *b = *seed as u8;
    }
}

/// Call our `f` and Debian's `name` on the same random source (and on destinations holding the
/// same bytes) and compare the destinations byte for byte, padding included: the untouched
/// bytes must stay untouched.
fn compare_copy<D, S>(h: *mut c_void, name: &str, ours: unsafe extern "C" fn(*mut D, *const S)) {
    // SAFETY: the symbol is this C function: void f(D *dst, S *src).
    let theirs: unsafe extern "C" fn(*mut D, *const S) =
        unsafe { core::mem::transmute::<*mut c_void, _>(sym(h, name)) };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        let mut src = vec![0u8; size_of::<S>()];
        let mut a = vec![0u8; size_of::<D>()];
        fill(&mut src, &mut seed);
        fill(&mut a, &mut seed);
        let mut b = a.clone();
        // SAFETY: byte buffers of the structs' sizes; both functions only read `src` and write
        // `dst` field by field (unaligned buffers are fine on x86_64, and these structs hold no
        // pointers).
        unsafe {
            ours(a.as_mut_ptr().cast(), src.as_ptr().cast());
            theirs(b.as_mut_ptr().cast(), src.as_ptr().cast());
        }
        assert_eq!(a, b, "{name}: destinations differ");
    }
}

#[test]
fn copy_helpers_match_debians_library() {
    let Some(h) = debian() else { return };
    assert_eq!(size_of::<ib_uverbs_ah_attr>(), 32);
    assert_eq!(size_of::<ib_uverbs_qp_attr>(), 144);
    assert_eq!(size_of::<ib_user_path_rec>(), 64);
    assert_eq!(size_of::<ibv_sa_path_rec>(), 64);
    compare_copy::<ibv_ah_attr, ib_uverbs_ah_attr>(
        h,
        "ibv_copy_ah_attr_from_kern",
        marshall::ibv_copy_ah_attr_from_kern,
    );
    compare_copy::<ibv_qp_attr, ib_uverbs_qp_attr>(
        h,
        "ibv_copy_qp_attr_from_kern",
        marshall::ibv_copy_qp_attr_from_kern,
    );
    compare_copy::<ibv_sa_path_rec, ib_user_path_rec>(
        h,
        "ibv_copy_path_rec_from_kern",
        marshall::ibv_copy_path_rec_from_kern,
    );
    compare_copy::<ib_user_path_rec, ibv_sa_path_rec>(
        h,
        "ibv_copy_path_rec_to_kern",
        marshall::ibv_copy_path_rec_to_kern,
    );
}
