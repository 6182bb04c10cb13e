//! The QP-fatal report of `ibv_poll_cq` against a concurrent `ibv_destroy_qp`.
//!
//! `ibv_poll_cq` reports `IBV_EVENT_QP_FATAL` for an error completion (`verbs::Cq::poll`
//! raises `AsyncEvent::QpFatal`, whose hook, `report_async`, finds the QP by number and
//! touches it); the C API lets another thread destroy that QP meanwhile. The
//! library's test seam (feature `race-window`) holds the window between "found" and "touched"
//! open for a while and this test runs `ibv_destroy_qp` inside it: `ibv_destroy_qp` must wait
//! until the report is done with the QP, and the report must name the QP. When the destroy
//! does not wait (the QP freed while the report still holds a pointer to it: a use after
//! free), the test fails deterministically, with or without AddressSanitizer (which then
//! reports the heap-use-after-free in `report_async`); `scripts/test` runs it as
//! `cargo test -p softrdma-ibverbs --features race-window --test fatal_race`.
#![cfg(feature = "race-window")]

use core::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ibverbs::abi::*;
use ibverbs::{context as ctxm, cq, device as dv, mr, open as op, qp, query as q};

const IBV_QPS_INIT: i32 = 1;
const IBV_QPS_RTR: i32 = 2;
const IBV_QPS_RTS: i32 = 3;
const IBV_QP_STATE: i32 = 1;
const IBV_QP_ACCESS_FLAGS: i32 = 1 << 3;
const IBV_QP_PKEY_INDEX: i32 = 1 << 4;
const IBV_QP_PORT: i32 = 1 << 5;
const IBV_QP_AV: i32 = 1 << 7;
const IBV_QP_PATH_MTU: i32 = 1 << 8;
const IBV_QP_TIMEOUT: i32 = 1 << 9;
const IBV_QP_RETRY_CNT: i32 = 1 << 10;
const IBV_QP_RNR_RETRY: i32 = 1 << 11;
const IBV_QP_RQ_PSN: i32 = 1 << 12;
const IBV_QP_MAX_QP_RD_ATOMIC: i32 = 1 << 13;
const IBV_QP_MIN_RNR_TIMER: i32 = 1 << 15;
const IBV_QP_SQ_PSN: i32 = 1 << 16;
const IBV_QP_MAX_DEST_RD_ATOMIC: i32 = 1 << 17;
const IBV_QP_DEST_QPN: i32 = 1 << 20;
const IBV_MTU_1024: i32 = 3;
const IBV_WR_SEND: i32 = 2;
const IBV_SEND_SIGNALED: u32 = 2;
const IBV_WC_LOC_PROT_ERR: i32 = 4;
const IBV_ACCESS_LOCAL_WRITE: i32 = 1;

/// How long the seam holds the window open.
const WINDOW: Duration = Duration::from_millis(300);

/// The report is inside its window.
static IN_WINDOW: AtomicBool = AtomicBool::new(false);
/// `ibv_destroy_qp` has been called.
static DESTROYING: AtomicBool = AtomicBool::new(false);
/// `ibv_destroy_qp` has returned.
static DESTROYED: AtomicBool = AtomicBool::new(false);
/// `ibv_destroy_qp` was called while the report was inside its window.
static DESTROY_IN_WINDOW: AtomicBool = AtomicBool::new(false);
/// `ibv_destroy_qp` returned while the report was still inside its window.
static FREED_IN_WINDOW: AtomicBool = AtomicBool::new(false);

fn pause() {
    IN_WINDOW.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while start.elapsed() < WINDOW {
        if DESTROYED.load(Ordering::SeqCst) {
            FREED_IN_WINDOW.store(true, Ordering::SeqCst);
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    DESTROY_IN_WINDOW.store(DESTROYING.load(Ordering::SeqCst), Ordering::SeqCst);
}

/// The QP in a `usize`, to move it to the destroying thread.
struct QpPtr(usize);

#[test]
fn destroy_qp_waits_for_the_fatal_report() {
    // SAFETY: the only test of this binary; nothing reads the environment concurrently.
    unsafe { std::env::set_var("SOFTRDMA_DEVICES", "softrdma0=127.0.9.1") };
    let d = &dv::devices().unwrap()[0];
    // SAFETY: every call below passes objects this test created and still owns, with the
    // argument shapes verbs.h gives them.
    unsafe {
        let ctx = op::ibv_open_device((&d.dev as *const ibv_device).cast_mut());
        assert!(!ctx.is_null());
        let pd = mr::ibv_alloc_pd(ctx);
        let cq = cq::ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        let mut buf = vec![0u8; 64];
        let m = mr::ibv_reg_mr(pd, buf.as_mut_ptr().cast(), 64, IBV_ACCESS_LOCAL_WRITE);
        assert!(!pd.is_null() && !cq.is_null() && !m.is_null());
        let mut init: ibv_qp_init_attr = core::mem::zeroed();
        init.send_cq = cq;
        init.recv_cq = cq;
        init.cap.max_send_wr = 4;
        init.cap.max_recv_wr = 4;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = qp::IBV_QPT_RC;
        let qpp = qp::ibv_create_qp(pd, &mut init);
        assert!(!qpp.is_null());

        // RESET → INIT → RTR → RTS toward its own device (nothing is sent: the bad lkey fails
        // the request before any packet).
        let mut gid: ibv_gid = core::mem::zeroed();
        assert_eq!(q::ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        let mut a: ibv_qp_attr = core::mem::zeroed();
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE as u32;
        let m1 = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(qp::ibv_modify_qp(qpp, &mut a, m1), 0);
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = (*qpp).qp_num;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = 1;
        let m2 = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(qp::ibv_modify_qp(qpp, &mut a, m2), 0);
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.sq_psn = 0;
        a.max_rd_atomic = 1;
        let m3 = IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(qp::ibv_modify_qp(qpp, &mut a, m3), 0);

        *qp::race_window::PAUSE.lock().unwrap() = Some(pause);
        let victim = QpPtr(qpp as usize);
        let destroyer = std::thread::spawn(move || {
            let victim = victim;
            let start = Instant::now();
            while !IN_WINDOW.load(Ordering::SeqCst) {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the report never ran"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            DESTROYING.store(true, Ordering::SeqCst);
            // The QP this test created; nothing else destroys it (inside the outer unsafe).
            let rc = qp::ibv_destroy_qp(victim.0 as *mut ibv_qp);
            DESTROYED.store(true, Ordering::SeqCst);
            rc
        });

        // A SEND through a bad lkey: completes with IBV_WC_LOC_PROT_ERR, and polling it
        // reports QP_FATAL (the seam pauses inside that report).
        let mut sge = ibv_sge {
            addr: buf.as_mut_ptr() as u64,
            length: 16,
            lkey: (*m).lkey ^ 0x5a5a00,
        };
        let mut wr: ibv_send_wr = core::mem::zeroed();
        wr.wr_id = 7;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        let mut bad: *mut ibv_send_wr = null_mut();
        let post = (*ctx).ops.post_send.unwrap();
        assert_eq!(post(qpp, &mut wr, &mut bad), 0);
        let poll = (*ctx).ops.poll_cq.unwrap();
        let mut wc: ibv_wc = core::mem::zeroed();
        let start = Instant::now();
        while poll(cq, 1, &mut wc) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "no completion");
        }
        assert_eq!((wc.wr_id, wc.status), (7, IBV_WC_LOC_PROT_ERR));
        assert_eq!(destroyer.join().unwrap(), 0, "ibv_destroy_qp");
        assert!(IN_WINDOW.load(Ordering::SeqCst));
        assert!(
            DESTROY_IN_WINDOW.load(Ordering::SeqCst),
            "ibv_destroy_qp did not start inside the window: the test proved nothing"
        );
        assert!(
            !FREED_IN_WINDOW.load(Ordering::SeqCst),
            "ibv_destroy_qp freed the QP while the QP-fatal report was about to touch it"
        );

        // The report went out, once, naming the QP (its pointer, now freed, only compared).
        // The async fd is made non-blocking so that a missing event fails instead of hanging.
        let fd = (*ctx).async_fd;
        let fl = libc::fcntl(fd, libc::F_GETFL);
        assert!(fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0);
        let mut ev: ibv_async_event = core::mem::zeroed();
        assert_eq!(ctxm::ibv_get_async_event(ctx, &mut ev), 0, "no async event");
        assert_eq!(ev.event_type, cq::IBV_EVENT_QP_FATAL);
        assert_eq!(ev.element.qp, qpp, "the event names another QP");
        ctxm::ibv_ack_async_event(&mut ev);
        assert_eq!(
            ctxm::ibv_get_async_event(ctx, &mut ev),
            -1,
            "a second event"
        );

        assert_eq!(mr::ibv_dereg_mr(m), 0);
        assert_eq!(cq::ibv_destroy_cq(cq), 0);
        assert_eq!(mr::ibv_dealloc_pd(pd), 0);
        assert_eq!(op::ibv_close_device(ctx), 0);
    }
}
