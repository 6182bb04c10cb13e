//! Scenario tests: every opcode, every NAK and error path, each asserting the exact
//! completions on both sides. Two hosts over the simulated network (lossless unless said).

use softrdma::mem::{Access, MemoryAccess};
use softrdma::rc::{
    Mtu, PostError, QpAttr, QpAttrMask, QpCap, QpState, RecvWr, SendFlags, SendWr, Sge, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};
use softrdma_sim::{ConnOpts, Faults, Partition, QpRef, World};

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0
        | Access::MW_BIND.0,
);

struct Pair {
    w: World,
    a: QpRef,
    b: QpRef,
}

impl Pair {
    fn new(opts: ConnOpts) -> Pair {
        Pair::with_faults(opts, Faults::NONE)
    }
    fn with_faults(opts: ConnOpts, f: Faults) -> Pair {
        let mut w = World::new(7, f);
        let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
        let a = w.create_qp(e0, QpCap::default(), None);
        let b = w.create_qp(e1, QpCap::default(), None);
        w.connect(a, b, opts);
        Pair { w, a, b }
    }
    fn mr(&mut self, at: QpRef, len: usize, access: Access) -> u32 {
        self.w.eps[at.ep].mem.reg_mr(1, 0x10000, len, access)
    }
    fn data_mr(&mut self, at: QpRef, data: &[u8]) -> u32 {
        let k = self.mr(at, data.len().max(1), ALL);
        self.w.eps[at.ep].mem.fill(k, 0, data);
        k
    }
    fn post(&mut self, at: QpRef, wr: SendWr<'_>) {
        self.w.qp(at).post_send(&wr).expect("post_send");
    }
    /// Post an RDMA READ of the peer's region `rkey` at `remote_addr` into `sg`.
    fn post_read(&mut self, at: QpRef, wr_id: u64, remote_addr: u64, rkey: u32, sg: &[Sge]) {
        let op = WrOpcode::RdmaRead { remote_addr, rkey };
        self.post(at, SendWr::new(wr_id, op).sg(sg));
    }
    fn recv(&mut self, at: QpRef, wr_id: u64, key: u32, len: u32) {
        let sge = [Sge {
            addr: 0x10000,
            length: len,
            lkey: key,
        }];
        self.w
            .qp(at)
            .post_recv(&RecvWr {
                wr_id,
                sg_list: &sge,
            })
            .expect("post_recv");
    }
    fn run(&mut self) {
        self.w.run(1_000_000);
    }
    fn wcs(&mut self, at: QpRef) -> Vec<WorkCompletion> {
        self.w.pump();
        self.w.take_completions(at)
    }
    fn contents(&self, at: QpRef, key: u32) -> Vec<u8> {
        self.w.eps[at.ep].mem.contents(key)
    }
}

fn sge_at(key: u32, off: u64, len: usize) -> [Sge; 1] {
    [Sge {
        addr: 0x10000 + off,
        length: len as u32,
        lkey: key,
    }]
}

fn sge(key: u32, len: usize) -> [Sge; 1] {
    [Sge {
        addr: 0x10000,
        length: len as u32,
        lkey: key,
    }]
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn ok(wc: &WorkCompletion, wr_id: u64, op: WcOpcode, len: u32) {
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (wr_id, WcStatus::Success, op, len),
        "{wc:?}"
    );
}

fn statuses(v: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    v.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn send_every_size_and_mtu() {
    for mtu in Mtu::ALL {
        for &n in &[0usize, 1, 255, 256, 257, 4096, 10_000] {
            let mut p = Pair::new(ConnOpts {
                mtu,
                ..ConnOpts::default()
            });
            let data = pattern(n, 3);
            let src = p.data_mr(p.a, &data);
            let dst = p.mr(p.b, n + 8, ALL);
            p.recv(p.b, 77, dst, n as u32 + 8);
            p.post(p.a, SendWr::new(1, WrOpcode::Send).sg(&sge(src, n)));
            p.run();
            let (sa, sb) = (p.wcs(p.a), p.wcs(p.b));
            assert_eq!(sa.len(), 1);
            ok(&sa[0], 1, WcOpcode::Send, n as u32);
            assert_eq!(sb.len(), 1);
            ok(&sb[0], 77, WcOpcode::Recv, n as u32);
            assert_eq!(sb[0].imm_data, None);
            assert_eq!(&p.contents(p.b, dst)[..n], &data[..]);
        }
    }
}

#[test]
fn send_with_imm_inline_and_sges() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        ..ConnOpts::default()
    });
    let dst = p.mr(p.b, 2000, ALL);
    p.recv(p.b, 1, dst, 2000);
    p.recv(p.b, 2, dst, 2000);
    // Two SGEs from two regions.
    let (d1, d2) = (pattern(300, 1), pattern(500, 2));
    let (k1, k2) = (p.data_mr(p.a, &d1), p.data_mr(p.a, &d2));
    let sg = [
        Sge {
            addr: 0x10000,
            length: 300,
            lkey: k1,
        },
        Sge {
            addr: 0x10000,
            length: 500,
            lkey: k2,
        },
    ];
    p.post(
        p.a,
        SendWr::new(10, WrOpcode::SendWithImm { imm: 0xdead_beef }).sg(&sg),
    );
    p.run();
    let rb = p.wcs(p.b);
    ok(&rb[0], 1, WcOpcode::Recv, 800);
    assert_eq!(rb[0].imm_data, Some(0xdead_beef));
    assert_eq!(
        p.contents(p.b, dst)[..800],
        [d1.clone(), d2.clone()].concat()[..]
    );
    // Inline data: copied at post time; the SGE list is ignored.
    let msg = b"inline payload".to_vec();
    p.post(p.a, SendWr::new(11, WrOpcode::Send).inline(&msg));
    p.run();
    let rb = p.wcs(p.b);
    ok(&rb[0], 2, WcOpcode::Recv, msg.len() as u32);
    assert_eq!(&p.contents(p.b, dst)[..msg.len()], &msg[..]);
    let ra = p.wcs(p.a);
    assert_eq!(
        statuses(&ra),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    // Inline longer than the cap is refused at post time.
    let big = vec![0u8; 1000];
    assert_eq!(
        p.w.qp(p.a)
            .post_send(&SendWr::new(12, WrOpcode::Send).inline(&big)),
        Err(PostError::InlineTooLong(1000))
    );
}

#[test]
fn write_and_write_with_imm() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu4096] {
        let mut p = Pair::new(ConnOpts {
            mtu,
            ..ConnOpts::default()
        });
        let data = pattern(9000, 5);
        let src = p.data_mr(p.a, &data);
        let dst = p.mr(p.b, 9000, ALL);
        p.post(
            p.a,
            SendWr::new(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: 0x10000,
                    rkey: dst,
                },
            )
            .sg(&sge(src, 9000)),
        );
        p.run();
        ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaWrite, 9000);
        assert!(
            p.wcs(p.b).is_empty(),
            "a plain WRITE completes nothing at the responder"
        );
        assert_eq!(p.contents(p.b, dst), data);
        // WRITE with immediate consumes a receive (its SGEs unused).
        let data2 = pattern(3000, 9);
        let src2 = p.data_mr(p.a, &data2);
        p.recv(p.b, 5, dst, 0);
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: 0x10000 + 100,
            rkey: dst,
            imm: 42,
        };
        p.post(p.a, SendWr::new(2, op).sg(&sge(src2, 3000)));
        p.run();
        ok(&p.wcs(p.a)[0], 2, WcOpcode::RdmaWrite, 3000);
        let rb = p.wcs(p.b);
        ok(&rb[0], 5, WcOpcode::RecvRdmaWithImm, 3000);
        assert_eq!(rb[0].imm_data, Some(42));
        assert_eq!(&p.contents(p.b, dst)[100..3100], &data2[..]);
        // Zero-length WRITE: no key check at all.
        p.post(
            p.a,
            SendWr::new(
                3,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0xbad,
                },
            ),
        );
        p.run();
        ok(&p.wcs(p.a)[0], 3, WcOpcode::RdmaWrite, 0);
    }
}

#[test]
fn read_multi_packet_and_empty() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu512,
        ..ConnOpts::default()
    });
    let data = pattern(5000, 11);
    let remote = p.data_mr(p.b, &data);
    let local = p.mr(p.a, 5000, ALL);
    p.post_read(p.a, 1, 0x10000, remote, &sge(local, 5000));
    p.post(
        p.a,
        SendWr::new(
            2,
            WrOpcode::RdmaRead {
                remote_addr: 0x10000,
                rkey: remote,
            },
        ),
    );
    p.run();
    let ra = p.wcs(p.a);
    ok(&ra[0], 1, WcOpcode::RdmaRead, 5000);
    ok(&ra[1], 2, WcOpcode::RdmaRead, 0);
    assert_eq!(p.contents(p.a, local), data);
    assert!(p.wcs(p.b).is_empty());
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let mut p = Pair::new(ConnOpts::default());
    let target = p.mr(p.b, 16, ALL);
    p.w.eps[1].mem.fill(target, 8, &100u64.to_ne_bytes());
    let res = p.mr(p.a, 8, ALL);
    let s = sge(res, 8);
    let cas = |compare, swap| WrOpcode::AtomicCmpAndSwp {
        remote_addr: 0x10008,
        rkey: target,
        compare,
        swap,
    };
    p.post(p.a, SendWr::new(1, cas(100, 7)).sg(&s));
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::CompSwap, 8);
    assert_eq!(p.w.eps[0].mem.read_u64(res, 0), 100);
    assert_eq!(p.w.eps[1].mem.read_u64(target, 8), 7);
    p.post(p.a, SendWr::new(2, cas(100, 9)).sg(&s));
    p.run();
    ok(&p.wcs(p.a)[0], 2, WcOpcode::CompSwap, 8);
    assert_eq!(
        p.w.eps[0].mem.read_u64(res, 0),
        7,
        "compare failed: original returned, nothing swapped"
    );
    assert_eq!(p.w.eps[1].mem.read_u64(target, 8), 7);
    p.post(
        p.a,
        SendWr::new(
            3,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: 0x10008,
                rkey: target,
                add: 5,
            },
        )
        .sg(&s),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 3, WcOpcode::FetchAdd, 8);
    assert_eq!(p.w.eps[0].mem.read_u64(res, 0), 7);
    assert_eq!(p.w.eps[1].mem.read_u64(target, 8), 12);
    // An atomic without exactly one 8-byte SGE is refused at post time.
    let bad = sge(res, 4);
    assert!(matches!(
        p.w.qp(p.a).post_send(&SendWr::new(4, cas(0, 0)).sg(&bad)),
        Err(PostError::InvalidArgument(_))
    ));
}

#[test]
fn misaligned_atomic_is_invalid_request() {
    let mut p = Pair::new(ConnOpts::default());
    let target = p.mr(p.b, 16, ALL);
    let res = p.mr(p.a, 8, ALL);
    p.recv(p.b, 9, target, 16);
    let op = WrOpcode::AtomicFetchAndAdd {
        remote_addr: 0x10004,
        rkey: target,
        add: 1,
    };
    p.post(p.a, SendWr::new(1, op).sg(&sge(res, 8)));
    p.post(p.a, SendWr::new(2, WrOpcode::Send));
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(statuses(&p.wcs(p.b)), vec![(9, WcStatus::WrFlushErr)]);
    assert_eq!(p.w.qp(p.a).state(), QpState::Err);
    assert_eq!(p.w.qp(p.b).state(), QpState::Err);
}

#[test]
fn remote_access_error_flushes_both_sides() {
    let mut p = Pair::new(ConnOpts::default());
    let data = pattern(100, 1);
    let src = p.data_mr(p.a, &data);
    let dst = p.mr(p.b, 50, ALL);
    p.recv(p.b, 7, dst, 50);
    // Out of bounds: 100 bytes into a 50-byte region.
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: dst,
            },
        )
        .sg(&sge(src, 100)),
    );
    p.post(p.a, SendWr::new(2, WrOpcode::Send).flags(SendFlags::NONE));
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(statuses(&p.wcs(p.b)), vec![(7, WcStatus::WrFlushErr)]);
    assert_eq!(p.contents(p.b, dst), vec![0u8; 50], "nothing placed");
    // Posting to a QP in error completes with a flush.
    p.post(p.a, SendWr::new(3, WrOpcode::Send));
    p.recv(p.b, 8, dst, 50);
    assert_eq!(statuses(&p.wcs(p.a)), vec![(3, WcStatus::WrFlushErr)]);
    assert_eq!(statuses(&p.wcs(p.b)), vec![(8, WcStatus::WrFlushErr)]);
}

#[test]
fn bad_rkey_read_and_missing_qp_rights() {
    let mut p = Pair::new(ConnOpts {
        access: Access::REMOTE_WRITE,
        ..ConnOpts::default()
    });
    let remote = p.data_mr(p.b, &[1u8; 64]);
    let local = p.mr(p.a, 64, ALL);
    p.post_read(p.a, 1, 0x10000, remote, &sge(local, 64));
    p.run();
    assert_eq!(statuses(&p.wcs(p.a)), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.contents(p.a, local), vec![0u8; 64]);
}

#[test]
fn receive_too_small_is_invalid_request_and_loc_len_err() {
    let mut p = Pair::new(ConnOpts::default());
    let src = p.data_mr(p.a, &pattern(2000, 1));
    let dst = p.mr(p.b, 2000, ALL);
    p.recv(p.b, 5, dst, 1000);
    p.post(p.a, SendWr::new(1, WrOpcode::Send).sg(&sge(src, 2000)));
    p.run();
    assert_eq!(statuses(&p.wcs(p.a)), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(statuses(&p.wcs(p.b)), vec![(5, WcStatus::LocLenErr)]);
}

#[test]
fn faulting_receive_buffer_is_remote_operational_error() {
    let mut p = Pair::new(ConnOpts::default());
    let src = p.data_mr(p.a, &pattern(100, 1));
    let dst = p.mr(p.b, 100, ALL);
    p.w.eps[1].mem.set_fault(dst, true);
    p.recv(p.b, 5, dst, 100);
    p.post(p.a, SendWr::new(1, WrOpcode::Send).sg(&sge(src, 100)));
    p.run();
    assert_eq!(statuses(&p.wcs(p.a)), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(statuses(&p.wcs(p.b)), vec![(5, WcStatus::LocProtErr)]);
}

#[test]
fn local_protection_error() {
    let mut p = Pair::new(ConnOpts::default());
    p.post(
        p.a,
        SendWr::new(1, WrOpcode::Send).sg(&sge(0xdead_0001, 10)),
    );
    p.post(p.a, SendWr::new(2, WrOpcode::Send));
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.w.qp(p.a).state(), QpState::Err);
}

#[test]
fn send_with_invalidate_and_local_inv_and_bind_mw() {
    let mut p = Pair::new(ConnOpts::default());
    // B binds a type 2 window over its region, through its own QP.
    let parent = p.mr(p.b, 4096, ALL);
    let mw = p.w.eps[1].mem.alloc_mw(1);
    let new_rkey = (mw & !0xff) | 0x42;
    let bind = WrOpcode::BindMw {
        mw_rkey: mw,
        new_rkey,
        mr_lkey: parent,
        addr: 0x10000 + 1024,
        length: 1024,
        access: Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    };
    p.post(p.b, SendWr::new(1, bind));
    p.run();
    ok(&p.wcs(p.b)[0], 1, WcOpcode::BindMw, 0);
    // A writes through the window.
    let data = pattern(512, 4);
    let src = p.data_mr(p.a, &data);
    p.post(
        p.a,
        SendWr::new(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000 + 1024,
                rkey: new_rkey,
            },
        )
        .sg(&sge(src, 512)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 2, WcOpcode::RdmaWrite, 512);
    assert_eq!(&p.contents(p.b, parent)[1024..1536], &data[..]);
    // A sends with invalidate: B's window is invalidated before the receive completes.
    let rbuf = p.mr(p.b, 64, ALL);
    p.recv(p.b, 3, rbuf, 64);
    p.post(
        p.a,
        SendWr::new(4, WrOpcode::SendWithInv { rkey: new_rkey }).sg(&sge(src, 10)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 4, WcOpcode::Send, 10);
    let rb = p.wcs(p.b);
    ok(&rb[0], 3, WcOpcode::Recv, 10);
    assert_eq!(rb[0].invalidated_rkey, Some(new_rkey));
    assert!(!p.w.eps[1].mem.is_valid(new_rkey));
    // LOCAL_INV of another key on B.
    let k = p.mr(p.b, 64, ALL);
    p.post(p.b, SendWr::new(5, WrOpcode::LocalInv { rkey: k }));
    p.run();
    ok(&p.wcs(p.b)[0], 5, WcOpcode::LocalInv, 0);
    assert!(!p.w.eps[1].mem.is_valid(k));
    // Writing through the invalidated window is a remote access error.
    p.post(
        p.a,
        SendWr::new(
            6,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000 + 1024,
                rkey: new_rkey,
            },
        )
        .sg(&sge(src, 8)),
    );
    p.run();
    assert_eq!(statuses(&p.wcs(p.a)), vec![(6, WcStatus::RemAccessErr)]);
}

#[test]
fn bind_mw_without_rights_is_mw_bind_err() {
    let mut p = Pair::new(ConnOpts::default());
    let parent = p.mr(p.b, 4096, Access::LOCAL_WRITE);
    let mw = p.w.eps[1].mem.alloc_mw(1);
    let bind = WrOpcode::BindMw {
        mw_rkey: mw,
        new_rkey: mw + 1,
        mr_lkey: parent,
        addr: 0x10000,
        length: 16,
        access: Access::REMOTE_READ,
    };
    p.post(p.b, SendWr::new(1, bind));
    p.post(p.b, SendWr::new(2, WrOpcode::Send));
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.b)),
        vec![(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn unsignaled_completions_keep_posting_order() {
    let mut p = Pair::new(ConnOpts::default());
    let dst = p.mr(p.b, 64, ALL);
    let src = p.data_mr(p.a, &[9u8; 64]);
    for i in 0..3 {
        p.recv(p.b, 100 + i, dst, 64);
    }
    p.post(
        p.a,
        SendWr::new(1, WrOpcode::Send)
            .sg(&sge(src, 8))
            .flags(SendFlags::NONE),
    );
    p.post_read(p.a, 2, 0x10000, dst, &sge(src, 8));
    p.post(
        p.a,
        SendWr::new(3, WrOpcode::Send)
            .sg(&sge(src, 8))
            .flags(SendFlags::NONE),
    );
    p.post(
        p.a,
        SendWr::new(4, WrOpcode::Send)
            .sg(&sge(src, 8))
            .flags(SendFlags::SIGNALED | SendFlags::FENCE),
    );
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(2, WcStatus::Success), (4, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&p.wcs(p.b)),
        vec![
            (100, WcStatus::Success),
            (101, WcStatus::Success),
            (102, WcStatus::Success)
        ]
    );
}

#[test]
fn fence_waits_for_earlier_reads() {
    let mut p = Pair::new(ConnOpts::default());
    let remote = p.data_mr(p.b, &pattern(8192, 1));
    let local = p.mr(p.a, 8192, ALL);
    let rbuf = p.mr(p.b, 64, ALL);
    p.recv(p.b, 1, rbuf, 64);
    p.post_read(p.a, 1, 0x10000, remote, &sge(local, 8192));
    p.post(
        p.a,
        SendWr::new(2, WrOpcode::Send).flags(SendFlags::SIGNALED | SendFlags::FENCE),
    );
    // Pump once: the READ goes out, the fenced SEND must not.
    p.w.pump();
    assert_eq!(p.w.net.stats.sent, 1);
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn psn_sequence_error_nak_and_go_back_n() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        ..ConnOpts::default()
    });
    p.w.net.drop_nth = vec![3];
    let data = pattern(2560, 8);
    let src = p.data_mr(p.a, &data);
    let dst = p.mr(p.b, 2560, ALL);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: dst,
            },
        )
        .sg(&sge(src, 2560)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaWrite, 2560);
    assert_eq!(p.contents(p.b, dst), data);
    let c = *p.w.qp(p.a).counters();
    assert_eq!(c.comp.seq_naks_received, 1);
    assert_eq!(
        p.w.qp(p.b).counters().resp.seq_naks_sent,
        1,
        "one NAK per gap"
    );
    assert_eq!(c.comp.timeouts, 0);
}

#[test]
fn lost_ack_recovers_by_timeout_and_duplicate_is_re_acked() {
    let mut p = Pair::new(ConnOpts::default());
    p.w.net.drop_nth = vec![2]; // the ACK
    let src = p.data_mr(p.a, &[1u8; 100]);
    let dst = p.mr(p.b, 100, ALL);
    p.recv(p.b, 9, dst, 100);
    p.post(p.a, SendWr::new(1, WrOpcode::Send).sg(&sge(src, 100)));
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::Send, 100);
    assert_eq!(
        statuses(&p.wcs(p.b)),
        vec![(9, WcStatus::Success)],
        "the duplicate consumed no receive"
    );
    assert_eq!(p.w.qp(p.a).counters().comp.timeouts, 1);
    assert_eq!(p.w.qp(p.b).counters().resp.duplicates, 1);
}

#[test]
fn atomic_replayed_from_cache_not_executed_twice() {
    let mut p = Pair::new(ConnOpts::default());
    p.w.net.drop_nth = vec![2]; // the atomic ACK
    let target = p.mr(p.b, 8, ALL);
    let res = p.mr(p.a, 8, ALL);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::AtomicFetchAndAdd {
                remote_addr: 0x10000,
                rkey: target,
                add: 3,
            },
        )
        .sg(&sge(res, 8)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::FetchAdd, 8);
    assert_eq!(
        p.w.eps[1].mem.read_u64(target, 0),
        3,
        "executed exactly once"
    );
    assert_eq!(p.w.eps[0].mem.read_u64(res, 0), 0);
    assert_eq!(p.w.qp(p.b).counters().resp.atomic_replays, 1);
}

#[test]
fn lost_read_response_is_re_read() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        ..ConnOpts::default()
    });
    p.w.net.drop_nth = vec![4]; // the third response packet
    let data = pattern(2000, 2);
    let remote = p.data_mr(p.b, &data);
    let local = p.mr(p.a, 2000, ALL);
    p.post_read(p.a, 1, 0x10000, remote, &sge(local, 2000));
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaRead, 2000);
    assert_eq!(p.contents(p.a, local), data);
    let c = p.w.qp(p.a).counters().comp;
    // The packets after the hole were kept; only the hole was asked for again.
    assert_eq!(
        (c.rerequests, c.timeouts, c.retransmits),
        (1, 0, 0),
        "{c:?}"
    );
}

/// After a retransmission timeout the requester goes back with a small window (8 PSNs, the
/// last asking for an ACK) that doubles with every acknowledgement, instead of re-sending its
/// whole window into a responder that may be the reason for the silence.
#[test]
fn timeout_restarts_with_a_small_window() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        ..ConnOpts::default()
    });
    p.w.net.drop_nth = (1..=64).collect(); // the whole first transmission
    p.w.net.tap = Some(Vec::new());
    let data = pattern(64 * 256, 3);
    let src = p.data_mr(p.a, &data);
    let dst = p.mr(p.b, 64 * 256, ALL);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: dst,
            },
        )
        .sg(&sge(src, 64 * 256)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaWrite, 64 * 256);
    assert_eq!(p.contents(p.b, dst), data);
    assert_eq!(p.w.qp(p.a).counters().comp.timeouts, 1);
    // Bursts from the requester between the responder's ACKs, after the lost first 64.
    let tap = p.w.net.tap.take().unwrap_or_default();
    let from_a = tap[0].0;
    let mut bursts = vec![];
    let mut n = 0;
    for (src, _) in &tap[64..] {
        if *src == from_a {
            n += 1;
        } else if n > 0 {
            bursts.push(n);
            n = 0;
        }
    }
    if n > 0 {
        bursts.push(n);
    }
    assert_eq!(bursts[0], 8, "bursts {bursts:?}");
    assert!(
        bursts.len() >= 3,
        "the window grows back in steps: {bursts:?}"
    );
}

/// Linux rxe narrows a READ's replayable range to the start of the latest re-request: the
/// requester must never ask for an earlier part of a READ after a later one, even when a
/// re-request's answer is lost too.
#[test]
fn read_re_requests_never_move_backwards() {
    for drops in [
        vec![4, 12],
        vec![4, 12, 19],
        vec![4, 12, 20],
        vec![3, 4, 9, 15, 19, 21],
    ] {
        let mut p = Pair::new(ConnOpts {
            mtu: Mtu::Mtu256,
            ..ConnOpts::default()
        });
        p.w.net.drop_nth = drops.clone();
        p.w.net.tap = Some(Vec::new());
        let data = pattern(16 * 256, 9);
        let remote = p.data_mr(p.b, &data);
        let local = p.mr(p.a, 16 * 256, ALL);
        p.post_read(p.a, 1, 0x10000, remote, &sge(local, 16 * 256));
        p.run();
        ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaRead, 16 * 256);
        assert_eq!(p.contents(p.a, local), data, "drops {drops:?}");
        let tap = p.w.net.tap.take().unwrap_or_default();
        let vas: Vec<u64> = tap
            .iter()
            .filter_map(|(_, b)| {
                softrdma::wire::Packet::parse(b)
                    .ok()?
                    .hdr
                    .reth
                    .map(|r| r.va)
            })
            .collect();
        assert!(vas.len() >= 2, "drops {drops:?}: {vas:x?}");
        assert!(
            vas.windows(2).all(|w| w[0] <= w[1]),
            "drops {drops:?}: READ requests went back: {vas:x?}"
        );
    }
}

#[test]
fn holes_in_a_stream_of_reads_are_re_read_alone() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        max_rd_atomic: 8,
        ..ConnOpts::default()
    });
    // 8 READs of 8 packets each (one request each, then 64 responses): lose responses in
    // the first, the middle and the last READ (packet numbers count both directions).
    p.w.net.drop_nth = vec![10, 30, 31, 70];
    let data = pattern(8 * 2048, 5);
    let remote = p.data_mr(p.b, &data);
    let local = p.mr(p.a, 8 * 2048, ALL);
    for i in 0..8u64 {
        p.post_read(
            p.a,
            i,
            0x10000 + i * 2048,
            remote,
            &sge_at(local, i * 2048, 2048),
        );
    }
    p.run();
    let wcs = p.wcs(p.a);
    assert_eq!(wcs.len(), 8);
    for (i, wc) in wcs.iter().enumerate() {
        ok(wc, i as u64, WcOpcode::RdmaRead, 2048);
    }
    assert_eq!(p.contents(p.a, local), data);
    let c = p.w.qp(p.a).counters().comp;
    assert_eq!(c.timeouts, 0, "{c:?}");
    assert!(c.rerequests >= 1 && c.rerequests <= 4, "{c:?}");
    // Only the missing packets were sent again, not the READs behind them.
    let r = p.w.qp(p.b).counters().resp;
    assert!(r.duplicates <= 4, "{r:?}");
}

#[test]
fn rnr_waits_forever_with_rnr_retry_7_until_a_receive_is_posted() {
    let mut p = Pair::new(ConnOpts {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..ConnOpts::default()
    });
    let src = p.data_mr(p.a, &[5u8; 10]);
    p.post(p.a, SendWr::new(1, WrOpcode::Send).sg(&sge(src, 10)));
    // Wait 10,000 RNR rounds of virtual time without a receive.
    for _ in 0..40_000 {
        p.w.step();
    }
    assert!(p.wcs(p.a).is_empty(), "still waiting");
    assert!(p.w.qp(p.a).counters().comp.rnr_naks_received > 1000);
    let dst = p.mr(p.b, 10, ALL);
    p.recv(p.b, 2, dst, 10);
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::Send, 10);
    ok(&p.wcs(p.b)[0], 2, WcOpcode::Recv, 10);
}

#[test]
fn rnr_retry_exhausted() {
    let mut p = Pair::new(ConnOpts {
        rnr_retry: 2,
        ..ConnOpts::default()
    });
    p.post(p.a, SendWr::new(1, WrOpcode::Send));
    p.post(p.a, SendWr::new(2, WrOpcode::Send));
    p.run();
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.w.qp(p.a).counters().comp.rnr_naks_received, 3);
}

#[test]
fn suspended_region_rnr_naks_then_resumes() {
    let mut p = Pair::new(ConnOpts::default());
    let data = pattern(3000, 3);
    let src = p.data_mr(p.a, &data);
    let dst = p.mr(p.b, 3000, ALL);
    p.w.eps[1].mem.set_suspended(dst, true);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: dst,
            },
        )
        .sg(&sge(src, 3000)),
    );
    for _ in 0..200 {
        p.w.step();
    }
    assert_eq!(p.wcs(p.a), vec![]);
    assert!(p.w.qp(p.b).counters().resp.rnr_naks_sent > 10);
    p.w.eps[1].mem.set_suspended(dst, false);
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaWrite, 3000);
    assert_eq!(p.contents(p.b, dst), data);
}

#[test]
fn retry_exceeded_flushes_and_never_hangs() {
    let mut p = Pair::new(ConnOpts {
        retry_cnt: 3,
        timeout: 8,
        ..ConnOpts::default()
    });
    p.w.net.partitions.push(Partition {
        a: 0,
        b: 1,
        from: 0,
        until: u64::MAX,
    });
    let src = p.data_mr(p.a, &[1u8; 5000]);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: 1,
            },
        )
        .sg(&sge(src, 5000)),
    );
    p.post(p.a, SendWr::new(2, WrOpcode::Send).flags(SendFlags::NONE));
    p.post(
        p.a,
        SendWr::new(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 1,
            },
        ),
    );
    let steps = p.w.run(1_000_000);
    assert!(steps < 1_000, "ends quickly: {steps} steps");
    assert_eq!(
        statuses(&p.wcs(p.a)),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let c = p.w.qp(p.a).counters().comp;
    assert_eq!(c.timeouts, 4, "retry_cnt retries after the first attempt");
    // 4 x 4.096us x 2^8 ~ 4.2 ms of virtual time.
    assert!(p.w.now < 10_000_000, "{}", p.w.now);
}

#[test]
fn srq_is_shared_by_two_qps() {
    let mut w = World::new(1, Faults::NONE);
    let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
    let srq = w.add_srq(e1, 16);
    let a1 = w.create_qp(e0, QpCap::default(), None);
    let a2 = w.create_qp(e0, QpCap::default(), None);
    let b1 = w.create_qp(e1, QpCap::default(), Some(srq));
    let b2 = w.create_qp(e1, QpCap::default(), Some(srq));
    w.connect(a1, b1, ConnOpts::default());
    w.connect(a2, b2, ConnOpts::default());
    let dst = w.eps[1].mem.reg_mr(1, 0x10000, 64, ALL);
    for i in 0..3 {
        let s = sge(dst, 64);
        w.eps[1].srqs[srq]
            .post_recv(&RecvWr {
                wr_id: 50 + i,
                sg_list: &s,
            })
            .unwrap();
    }
    assert!(matches!(
        w.qp(b1).post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[]
        }),
        Err(PostError::InvalidArgument(_))
    ));
    w.qp(a1).post_send(&SendWr::new(1, WrOpcode::Send)).unwrap();
    w.qp(a2).post_send(&SendWr::new(2, WrOpcode::Send)).unwrap();
    w.run(10_000);
    let r1 = w.take_completions(b1);
    let r2 = w.take_completions(b2);
    assert_eq!(r1.len() + r2.len(), 2);
    let mut ids: Vec<u64> = r1.iter().chain(&r2).map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(ids, vec![50, 51]);
    assert_eq!(w.eps[1].srqs[srq].len(), 1);
}

#[test]
fn state_machine_refuses_posts_and_sqd_drains() {
    let mut p = Pair::new(ConnOpts::default());
    let qp = p.w.qp(p.a);
    let to = |s| QpAttr {
        qp_state: s,
        ..QpAttr::default()
    };
    assert!(
        qp.modify(&to(QpState::Init), QpAttrMask::STATE).is_err(),
        "RTS -> INIT does not exist"
    );
    qp.modify(&to(QpState::Sqd), QpAttrMask::STATE).unwrap();
    // In SQD posting is accepted but nothing new starts.
    let dst = p.mr(p.b, 8, ALL);
    p.recv(p.b, 1, dst, 8);
    p.post(p.a, SendWr::new(1, WrOpcode::Send));
    p.run();
    assert!(p.wcs(p.a).is_empty());
    p.w.qp(p.a)
        .modify(&to(QpState::Rts), QpAttrMask::STATE)
        .unwrap();
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::Send, 0);
    // A QP in INIT refuses sends; RESET refuses receives.
    let mut w = World::new(1, Faults::NONE);
    let e = w.add_endpoint();
    let q = w.create_qp(e, QpCap::default(), None);
    assert_eq!(
        w.qp(q).post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[]
        }),
        Err(PostError::InvalidState(QpState::Reset))
    );
    let init = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    w.qp(q)
        .modify(
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    assert_eq!(
        w.qp(q).post_send(&SendWr::new(1, WrOpcode::Send)),
        Err(PostError::InvalidState(QpState::Init))
    );
    w.qp(q)
        .post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[],
        })
        .unwrap();
    // To ERR: the posted receive is flushed.
    w.qp(q)
        .modify(&to(QpState::Err), QpAttrMask::STATE)
        .unwrap();
    assert_eq!(
        w.qp(q).poll_completion().map(|c| c.status),
        Some(WcStatus::WrFlushErr)
    );
}

#[test]
fn send_queue_full_is_refused() {
    let mut w = World::new(1, Faults::NONE);
    let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
    let cap = QpCap {
        max_send_wr: 4,
        ..QpCap::default()
    };
    let a = w.create_qp(e0, cap, None);
    let b = w.create_qp(e1, QpCap::default(), None);
    w.connect(a, b, ConnOpts::default());
    for i in 0..4 {
        w.qp(a)
            .post_send(&SendWr::new(
                i,
                WrOpcode::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
            ))
            .unwrap();
    }
    assert_eq!(
        w.qp(a).post_send(&SendWr::new(9, WrOpcode::Send)),
        Err(PostError::QueueFull)
    );
    w.run(10_000);
    assert_eq!(w.take_completions(a).len(), 4);
}

#[test]
fn psn_wraps_around_the_24_bit_space() {
    let mut p = Pair::new(ConnOpts {
        mtu: Mtu::Mtu256,
        psn_a: 0xff_fffd,
        ..ConnOpts::default()
    });
    let data = pattern(4000, 6);
    let src = p.data_mr(p.a, &data);
    let dst = p.mr(p.b, 4000, ALL);
    p.post(
        p.a,
        SendWr::new(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: 0x10000,
                rkey: dst,
            },
        )
        .sg(&sge(src, 4000)),
    );
    p.run();
    ok(&p.wcs(p.a)[0], 1, WcOpcode::RdmaWrite, 4000);
    assert_eq!(p.contents(p.b, dst), data);
}

#[test]
fn memory_checks_are_enforced_by_the_sim_memory() {
    // The test memory itself: PD, bounds and rights.
    let m = softrdma_sim::SimMemory::new();
    let k = m.reg_mr(1, 0x1000, 16, Access::REMOTE_READ);
    let ctx = softrdma::mem::AccessCtx { pd: 1, qpn: 1 };
    assert!(m.check(ctx, k, 0x1000, 16, Access::REMOTE_READ).is_ok());
    assert!(m.check(ctx, k, 0x1001, 16, Access::REMOTE_READ).is_err());
    assert!(m.check(ctx, k, 0x1000, 16, Access::REMOTE_WRITE).is_err());
    assert!(
        m.check(
            softrdma::mem::AccessCtx { pd: 2, qpn: 1 },
            k,
            0x1000,
            1,
            Access::NONE
        )
        .is_err()
    );
    assert!(m.check_guards().is_ok());
}

/// Where the next message would land (the receive path warms that buffer's cache lines
/// while it waits): the first entry of the head of the QP's own receive queue, or of its
/// SRQ's; nothing for an empty queue, an empty first entry, or an SRQ the QP does not use.
#[test]
fn the_next_receive_buffer_is_the_head_of_the_qps_queue_or_of_its_srq() {
    let mut w = World::new(3, Faults::NONE);
    let ep = w.add_endpoint();
    let s = w.add_srq(ep, 8);
    w.add_srq(ep, 8);
    let own = w.create_qp(ep, QpCap::default(), None);
    let shared = w.create_qp(ep, QpCap::default(), Some(s));
    let far = w.add_endpoint();
    for q in [own, shared] {
        let peer = w.create_qp(far, QpCap::default(), None);
        w.connect(q, peer, ConnOpts::default());
    }
    let sge = |lkey: u32, addr: u64, length: u32| Sge { addr, length, lkey };
    assert!(w.qp(own).next_recv_buffer(None).is_none());
    for (id, e) in [(1, sge(5, 0x1000, 64)), (2, sge(5, 0x2000, 64))] {
        w.qp(own)
            .post_recv(&RecvWr {
                wr_id: id,
                sg_list: &[e, sge(6, 0x9000, 8)],
            })
            .unwrap();
    }
    let qpn = w.qp(own).qp_num();
    let (ctx, first) = w.qp(own).next_recv_buffer(None).unwrap();
    assert_eq!((ctx.pd, ctx.qpn, first), (1, qpn, sge(5, 0x1000, 64)));

    // The SRQ's head, only for its own QPs (the world numbers its SRQs from 1).
    let mut srq = softrdma::rc::Srq::new(1, 8, 4);
    let other = softrdma::rc::Srq::new(2, 8, 4);
    assert!(w.qp(shared).next_recv_buffer(Some(&srq)).is_none());
    srq.post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &[sge(7, 0x3000, 128)],
    })
    .unwrap();
    assert_eq!(
        w.qp(shared).next_recv_buffer(Some(&srq)).map(|n| n.1),
        Some(sge(7, 0x3000, 128))
    );
    assert!(w.qp(shared).next_recv_buffer(Some(&other)).is_none());
    assert!(w.qp(shared).next_recv_buffer(None).is_none());

    // An empty first entry names no buffer.
    let mut zero = softrdma::rc::Srq::new(srq.id(), 4, 4);
    zero.post_recv(&RecvWr {
        wr_id: 4,
        sg_list: &[sge(7, 0x4000, 0)],
    })
    .unwrap();
    assert!(w.qp(shared).next_recv_buffer(Some(&zero)).is_none());
}
