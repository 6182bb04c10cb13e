//! Misuse of the C entry points, called directly (the rlib), and the completion channel's
//! bookkeeping (the full event path runs in tests/c/datapath.c).

use core::ffi::c_void;
use core::ptr::null_mut;
use std::sync::Once;

use ibverbs::abi::*;
use ibverbs::channel;
use ibverbs::errno::errno;
use ibverbs::{device as dv, mr, open as op, query as q};

fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: every test calls init() first and nothing reads the environment before the
        // Once completes (the device table is loaded inside it).
        unsafe {
            std::env::set_var(
                "SOFTRDMA_DEVICES",
                "softrdma0=127.0.0.1,softrdma1=127.0.0.2",
            );
            std::env::set_var("SOFTRDMA_PIN", "on-demand");
        }
        assert_eq!(dv::devices().unwrap().len(), 2);
    });
}

fn open(i: usize) -> *mut ibv_context {
    init();
    let d = &dv::devices().unwrap()[i];
    // SAFETY: a device of ours.
    let ctx = unsafe { op::ibv_open_device((&d.dev as *const ibv_device).cast_mut()) };
    assert!(!ctx.is_null());
    ctx
}

#[test]
fn null_and_foreign_pointers_are_einval() {
    init();
    let mut junk = [0u64; 64];
    let junk_ptr = junk.as_mut_ptr().cast::<c_void>();
    // SAFETY: every call below must refuse its pointer without dereferencing it.
    unsafe {
        assert!(op::ibv_open_device(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(op::ibv_open_device(junk_ptr.cast()).is_null());
        assert_eq!(op::ibv_close_device(junk_ptr.cast()), -1);
        assert!(dv::ibv_get_device_name(null_mut()).is_null());
        assert_eq!(dv::ibv_get_device_guid(null_mut()), 0);
        assert!(mr::ibv_alloc_pd(junk_ptr.cast()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(mr::ibv_reg_mr(null_mut(), junk_ptr, 8, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(mr::ibv_reg_mr(junk_ptr.cast(), junk_ptr, 8, 1).is_null());
        assert_eq!(mr::ibv_dereg_mr(junk_ptr.cast()), libc::EINVAL);
        assert_eq!(mr::ibv_dealloc_pd(null_mut()), libc::EINVAL);
        assert_eq!(q::ibv_query_device(null_mut(), null_mut()), libc::EINVAL);
        assert_eq!(
            q::ibv_query_port(junk_ptr.cast(), 1, null_mut()),
            libc::EINVAL
        );
        assert_eq!(q::ibv_query_gid(null_mut(), 1, 0, null_mut()), -1);
        assert_eq!(
            channel::ibv_destroy_comp_channel(junk_ptr.cast()),
            libc::EINVAL
        );
        assert!(channel::ibv_create_comp_channel(null_mut()).is_null());
        channel::ibv_ack_cq_events(junk_ptr.cast(), 3);
        dv::ibv_free_device_list(junk_ptr.cast());
        assert_eq!(ibverbs::cq::ibv_destroy_cq(junk_ptr.cast()), libc::EINVAL);
        assert_eq!(ibverbs::qp::ibv_destroy_qp(junk_ptr.cast()), libc::EINVAL);
        assert_eq!(ibverbs::srq::ibv_destroy_srq(null_mut()), libc::EINVAL);
    }
    assert!(
        junk.iter().all(|w| *w == 0),
        "a refused pointer was written through"
    );
}

#[test]
fn pd_mr_lifecycle_and_errors() {
    let ctx = open(0);
    let mut buf = vec![0u8; 1 << 16];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: live context, PD and buffer (which outlives the registrations).
    unsafe {
        let pd = mr::ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        assert!(mr::ibv_reg_mr(pd, p, 0, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(
            mr::ibv_reg_mr(pd, p, 16, 1 << 15).is_null(),
            "unknown access bit"
        );
        assert_eq!(errno(), libc::EINVAL);
        let m = mr::ibv_reg_mr_iova2(pd, p, buf.len(), 0x1000, 0x100003);
        assert!(!m.is_null());
        assert_eq!((*m).lkey, (*m).rkey);
        assert_eq!(mr::ibv_dealloc_pd(pd), libc::EBUSY);
        let pd2 = mr::ibv_alloc_pd(ctx);
        let old_key = (*m).rkey;
        let r = mr::ibv_rereg_mr(
            m,
            IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_TRANSLATION,
            pd2,
            p.cast::<u8>().add(8).cast(),
            64,
            0,
        );
        assert_eq!(r, 0);
        assert_ne!((*m).rkey, old_key, "re-registration issues new keys");
        assert_eq!((*m).lkey, (*m).rkey);
        assert_eq!((*m).pd, pd2);
        assert_eq!((*m).length, 64);
        assert_eq!(mr::ibv_dealloc_pd(pd), 0, "the region moved to pd2");
        // A PD of another context is refused.
        let other = open(1);
        let opd = mr::ibv_alloc_pd(other);
        assert_eq!(
            mr::ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, opd, null_mut(), 0, 0),
            mr::IBV_REREG_MR_ERR_INPUT
        );
        assert_eq!(mr::ibv_dereg_mr(m), 0);
        assert_eq!(mr::ibv_dereg_mr(m), libc::EINVAL);
        assert_eq!(mr::ibv_dealloc_pd(pd2), 0);
        // Closing a context with a live PD: the PD stays usable until deallocated.
        assert_eq!(op::ibv_close_device(other), 0);
        assert_eq!(mr::ibv_dealloc_pd(opd), 0);
        assert_eq!(op::ibv_close_device(ctx), 0);
        assert_eq!(op::ibv_close_device(ctx), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
}

#[test]
fn completion_channel_delivers_events_through_its_fd() {
    let ctx = open(0);
    // SAFETY: live contexts, channel and CQ, each destroyed once.
    unsafe {
        let ch = channel::ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let fd = (*ch).fd;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 0), 0);
        // A CQ on the channel: the channel is busy until the CQ is gone.
        let cq = ibverbs::cq::ibv_create_cq(ctx, 8, 0x1234 as *mut c_void, ch, 0);
        assert!(!cq.is_null());
        assert_eq!((*cq).channel, ch);
        assert_eq!(channel::ibv_destroy_comp_channel(ch), libc::EBUSY);
        assert_eq!(libc::poll(&mut pfd, 1, 0), 0);
        let mut got: *mut ibv_cq = null_mut();
        let mut got_ctx: *mut c_void = null_mut();
        // Non-blocking fd and nothing queued: EAGAIN, as libibverbs.
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(fl & libc::O_NONBLOCK, 0, "the fd starts blocking");
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        assert_eq!(channel::ibv_get_cq_event(ch, &mut got, &mut got_ctx), -1);
        assert_eq!(errno(), libc::EAGAIN);
        assert_eq!(channel::ibv_get_cq_event(ch, null_mut(), &mut got_ctx), -1);
        assert_eq!(errno(), libc::EINVAL);
        // A CQ of another context cannot use this channel.
        let other = open(1);
        assert!(ibverbs::cq::ibv_create_cq(other, 8, null_mut(), ch, 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(op::ibv_close_device(other), 0);
        assert_eq!(ibverbs::cq::ibv_destroy_cq(cq), 0);
        assert_eq!(ibverbs::cq::ibv_destroy_cq(cq), libc::EINVAL);
        assert_eq!(channel::ibv_destroy_comp_channel(ch), 0);
        assert_eq!(op::ibv_close_device(ctx), 0);
    }
}

#[test]
fn device_list_and_queries() {
    init();
    let mut n = 0;
    // SAFETY: valid out-pointers; the list is freed once.
    unsafe {
        let list = dv::ibv_get_device_list(&mut n);
        assert_eq!(n, 2);
        assert!((*list.add(2)).is_null());
        let name = core::ffi::CStr::from_ptr(dv::ibv_get_device_name(*list.add(1)));
        assert_eq!(name.to_str().unwrap(), "softrdma1");
        assert_eq!(
            dv::ibv_get_device_guid(*list).to_ne_bytes(),
            [0x02, 0x73, 0x6f, 0x66, 127, 0, 0, 1]
        );
        dv::ibv_free_device_list(list);
        dv::ibv_free_device_list(list); // ignored, not a double free
        let ctx = open(1);
        let mut attr: ibv_device_attr = core::mem::zeroed();
        assert_eq!(q::ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.atomic_cap, IBV_ATOMIC_HCA);
        assert_eq!(attr.phys_port_cnt, 1);
        let mut ty = 0;
        assert_eq!(q::ibv_query_gid_type(ctx, 1, 0, &mut ty), 0);
        assert_eq!(ty, IBV_GID_TYPE_SYSFS_ROCE_V2);
        let mut entries: [ibv_gid_entry; 4] = core::mem::zeroed();
        let got = q::_ibv_query_gid_table(
            ctx,
            entries.as_mut_ptr(),
            4,
            0,
            core::mem::size_of::<ibv_gid_entry>(),
        );
        assert_eq!(got, 2);
        assert_eq!(entries[1].gid.raw[12..], [127, 0, 0, 2]);
        assert_eq!(op::ibv_close_device(ctx), 0);
    }
}
