//! The rules of UC and UD, one scenario each, through the simulated world: what is dropped,
//! what is counted, what completes, and that nothing is ever sent back (no ACK, no NAK, no
//! RNR) on the unreliable services.

use std::net::{IpAddr, Ipv4Addr};

use softrdma::mem::Access;
use softrdma::rc::unreliable::grh_source;
use softrdma::rc::{
    GRH_LEN, Mtu, NetworkHdr, PostError, QpCap, QpType, RecvWr, SendFlags, SendWr, Sge,
    UnrelCounters, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use softrdma_sim::{ConnOpts, Faults, QpRef, World};

const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
const VA: u64 = 0x10000;
const QKEY: u32 = 0x1111_2222;

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

fn mr(w: &World, at: QpRef, data: &[u8]) -> u32 {
    let k = w.eps[at.ep].mem.reg_mr(1, VA, data.len().max(1), ALL);
    w.eps[at.ep].mem.fill(k, 0, data);
    k
}

fn post_recv(w: &mut World, at: QpRef, wr_id: u64, len: usize) -> u32 {
    let k = w.eps[at.ep].mem.reg_mr(1, VA, len.max(1), ALL);
    let sge = [Sge {
        addr: VA,
        length: len as u32,
        lkey: k,
    }];
    w.qp(at)
        .post_recv(&RecvWr {
            wr_id,
            sg_list: &sge,
        })
        .expect("post_recv");
    k
}

fn wcs(w: &mut World, at: QpRef) -> Vec<WorkCompletion> {
    w.pump();
    w.take_completions(at)
}

fn uc_pair(mtu: Mtu, recv_wr: u32) -> (World, QpRef, QpRef) {
    let mut w = World::new(1, Faults::NONE);
    let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
    let cap = QpCap {
        max_recv_wr: recv_wr,
        ..QpCap::default()
    };
    let a = w.create_qp_of(e0, QpType::Uc, cap, None);
    let b = w.create_qp_of(e1, QpType::Uc, cap, None);
    let opts = ConnOpts {
        mtu,
        access: ALL,
        psn_a: 0x00ff_fffe, // the PSNs wrap inside the first message
        psn_b: 7,
        ..ConnOpts::default()
    };
    w.connect(a, b, opts);
    (w, a, b)
}

fn send(w: &mut World, from: QpRef, wr_id: u64, op: WrOpcode, data: &[u8]) {
    let k = mr(w, from, data);
    let sge = [Sge {
        addr: VA,
        length: data.len() as u32,
        lkey: k,
    }];
    w.qp(from)
        .post_send(&SendWr::new(wr_id, op).sg(&sge))
        .expect("post_send");
}

fn assert_sends_ok(w: &mut World, at: QpRef, ids: &[u64]) {
    let got = wcs(w, at);
    let want: Vec<(u64, WcStatus)> = ids.iter().map(|&i| (i, WcStatus::Success)).collect();
    let have: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(have, want, "send completions {got:?}");
}

/// The unreliable drops of a QP, with the given fields set.
fn drops(f: impl FnOnce(&mut UnrelCounters)) -> UnrelCounters {
    let mut c = UnrelCounters::default();
    f(&mut c);
    c
}

#[test]
fn uc_psn_gap_in_a_send_drops_it_and_the_next_message_completes_in_the_same_receive() {
    let (mut w, a, b) = uc_pair(Mtu::Mtu256, 8);
    let r = post_recv(&mut w, b, 7, 4096);
    let (m1, m2) = (pattern(3 * 256, 1), pattern(300, 2));
    send(&mut w, a, 1, WrOpcode::Send, &m1);
    send(&mut w, a, 2, WrOpcode::Send, &m2);
    w.net.drop_nth = vec![2]; // the middle packet of the first SEND
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[1, 2]);
    let got = wcs(&mut w, b);
    assert_eq!(got.len(), 1, "{got:?}");
    let c = got[0];
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 300)
    );
    assert!(c.grh.is_none());
    assert!(w.eps[b.ep].mem.equals(r, 0, &m2));
    let cb = *w.qp(b).counters();
    assert_eq!(cb.unrel, drops(|c| c.uc_gap_drops = 1));
    assert_eq!(cb.packets_sent, 0, "a UC receiver sends nothing");
    assert_eq!(w.net.stats.sent, 5);
    assert!(w.eps[b.ep].mem.check_guards().is_ok());
}

#[test]
fn uc_write_with_immediate_cut_by_a_gap_completes_nothing() {
    let (mut w, a, b) = uc_pair(Mtu::Mtu512, 8);
    post_recv(&mut w, b, 9, 0);
    let data = pattern(3 * 512 + 5, 3);
    let t1 = w.eps[b.ep].mem.reg_mr(1, VA, data.len(), ALL);
    let t2 = w.eps[b.ep].mem.reg_mr(1, VA, data.len(), ALL);
    for (id, t) in [(1, t1), (2, t2)] {
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: VA,
            rkey: t,
            imm: id as u32,
        };
        send(&mut w, a, id, op, &data);
    }
    w.net.drop_nth = vec![3]; // the third packet of the first WRITE
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[1, 2]);
    let got = wcs(&mut w, b);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (
            got[0].wr_id,
            got[0].opcode,
            got[0].imm_data,
            got[0].byte_len
        ),
        (9, WcOpcode::RecvRdmaWithImm, Some(2), data.len() as u32)
    );
    let first = w.eps[b.ep].mem.contents(t1);
    assert_eq!(
        &first[..1024],
        &data[..1024],
        "the packets before the gap are placed"
    );
    assert!(first[1024..].iter().all(|&x| x == 0), "nothing after it");
    assert!(w.eps[b.ep].mem.equals(t2, 0, &data));
    assert_eq!(w.qp(b).counters().unrel, drops(|c| c.uc_gap_drops = 1));
}

#[test]
fn uc_send_without_a_receive_is_dropped_and_counted_without_rnr() {
    let (mut w, a, b) = uc_pair(Mtu::Mtu1024, 8);
    send(&mut w, a, 1, WrOpcode::Send, &pattern(2000, 4));
    send(&mut w, a, 2, WrOpcode::Send, &[]);
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[1, 2]);
    assert!(wcs(&mut w, b).is_empty());
    let cb = *w.qp(b).counters();
    assert_eq!(cb.unrel, drops(|c| c.no_recv_drops = 2));
    assert_eq!((cb.packets_sent, w.net.stats.sent), (0, 3));
    // A receive posted now serves the next message.
    let r = post_recv(&mut w, b, 5, 100);
    send(&mut w, a, 3, WrOpcode::Send, &pattern(100, 5));
    w.run(10_000);
    let got = wcs(&mut w, b);
    assert_eq!((got.len(), got[0].wr_id, got[0].byte_len), (1, 5, 100));
    assert!(w.eps[b.ep].mem.equals(r, 0, &pattern(100, 5)));
}

/// A receive that a UC message had started is never lost when the message is cut: it keeps
/// its slot in the receive queue while the message is in progress (a post that would fill the
/// queue behind it is refused, as in rxe), and goes back to the head of the queue when the
/// message is cut, to take the next message.
#[test]
fn uc_receive_started_by_a_cut_message_survives_a_full_receive_queue() {
    let (mut w, a, b) = uc_pair(Mtu::Mtu256, 2);
    post_recv(&mut w, b, 1, 4096);
    send(&mut w, a, 1, WrOpcode::Send, &pattern(3 * 256, 6));
    w.net.drop_nth = vec![2];
    while w.qp(b).counters().packets_received == 0 {
        assert!(w.step());
    }
    // The first packet took receive 1, which still counts: one more fits, not two.
    post_recv(&mut w, b, 2, 4096);
    let k = w.eps[b.ep].mem.reg_mr(1, VA, 4096, ALL);
    let full = w.qp(b).post_recv(&RecvWr {
        wr_id: 3,
        sg_list: &[Sge {
            addr: VA,
            length: 4096,
            lkey: k,
        }],
    });
    assert_eq!(full, Err(softrdma::rc::PostError::QueueFull));
    w.run(10_000);
    assert_eq!(w.qp(b).counters().unrel, drops(|c| c.uc_gap_drops = 1));
    send(&mut w, a, 2, WrOpcode::Send, &pattern(10, 7));
    send(&mut w, a, 3, WrOpcode::Send, &pattern(20, 8));
    w.run(10_000);
    post_recv(&mut w, b, 3, 4096);
    send(&mut w, a, 4, WrOpcode::Send, &pattern(30, 9));
    w.run(10_000);
    let got: Vec<(u64, u32)> = wcs(&mut w, b)
        .iter()
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    assert_eq!(
        got,
        [(1, 10), (2, 20), (3, 30)],
        "receives in posting order"
    );
}

fn ud_world(qkeys: &[u32], mtu: Mtu) -> (World, Vec<QpRef>) {
    let mut w = World::new(1, Faults::NONE);
    let mut qps = Vec::new();
    for (i, &q) in qkeys.iter().enumerate() {
        let e = w.add_endpoint();
        let r = w.create_qp_of(e, QpType::Ud, QpCap::default(), None);
        w.bring_up_ud(r, q, mtu, 100 * i as u32);
        qps.push(r);
    }
    (w, qps)
}

fn send_ud(w: &mut World, from: QpRef, to: QpRef, wr_id: u64, qkey: u32, data: &[u8]) {
    let d = w.ud_dest(from, to, qkey);
    let k = mr(w, from, data);
    let sge = [Sge {
        addr: VA,
        length: data.len() as u32,
        lkey: k,
    }];
    w.qp(from)
        .post_send(&SendWr::new(wr_id, WrOpcode::Send).sg(&sge).ud(d))
        .expect("post_send");
}

#[test]
fn ud_wrong_qkey_is_dropped_and_counted_and_the_high_bit_sends_the_qps_own() {
    let (mut w, q) = ud_world(&[QKEY, QKEY, 0x0bad_0bad], Mtu::Mtu1024);
    let (a, b, c) = (q[0], q[1], q[2]);
    let r = post_recv(&mut w, b, 40, GRH_LEN + 100);
    let data = pattern(100, 10);
    send_ud(&mut w, a, b, 1, 0x2222_1111, &data); // wrong
    send_ud(&mut w, c, b, 1, 0x8000_0000, &data); // c's own Q_Key: wrong
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[1]);
    assert_sends_ok(&mut w, c, &[1]);
    assert!(wcs(&mut w, b).is_empty());
    assert_eq!(w.qp(b).counters().unrel, drops(|c| c.qkey_drops = 2));
    assert_eq!(w.qp(b).recv_queue_len(), 1, "the receive is still posted");
    send_ud(&mut w, a, b, 2, 0x8000_1234, &data); // a's own Q_Key: right
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[2]);
    let got = wcs(&mut w, b);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(
        (
            wc.wr_id,
            wc.status,
            wc.opcode,
            wc.byte_len,
            wc.src_qp,
            wc.grh
        ),
        (
            40,
            WcStatus::Success,
            WcOpcode::Recv,
            (GRH_LEN + 100) as u32,
            w.qp(a).qp_num(),
            Some(NetworkHdr::Ipv4)
        )
    );
    let buf = w.eps[b.ep].mem.contents(r);
    let grh: [u8; GRH_LEN] = buf[..GRH_LEN].try_into().unwrap();
    let (ia, ib) = (w.eps[a.ep].ip, w.eps[b.ep].ip);
    assert_eq!(grh_source(&grh), Some((IpAddr::V4(ia), IpAddr::V4(ib))));
    assert_eq!(&buf[GRH_LEN..], &data[..]);
    assert_eq!(w.qp(b).counters().packets_sent, 0);
}

#[test]
fn ud_receive_exhaustion_drops_and_counts_and_sends_nothing_back() {
    let (mut w, q) = ud_world(&[QKEY, QKEY], Mtu::Mtu512);
    let (a, b) = (q[0], q[1]);
    for i in 0..3 {
        send_ud(&mut w, a, b, i, QKEY, &pattern(512, i as u8));
    }
    w.run(10_000);
    assert_sends_ok(&mut w, a, &[0, 1, 2]);
    assert!(wcs(&mut w, b).is_empty());
    assert_eq!(w.qp(b).counters().unrel, drops(|c| c.no_recv_drops = 3));
    assert_eq!((w.qp(b).counters().packets_sent, w.net.stats.sent), (0, 3));
    let r = post_recv(&mut w, b, 8, GRH_LEN + 512);
    send_ud(&mut w, a, b, 3, QKEY, &pattern(512, 3));
    w.run(10_000);
    let got = wcs(&mut w, b);
    assert_eq!((got.len(), got[0].wr_id), (1, 8));
    assert!(w.eps[b.ep].mem.equals(r, GRH_LEN, &pattern(512, 3)));
}

#[test]
fn ud_too_short_receive_drops_the_datagram_and_stays_posted() {
    let (mut w, q) = ud_world(&[QKEY, QKEY], Mtu::Mtu1024);
    let (a, b) = (q[0], q[1]);
    let r = post_recv(&mut w, b, 3, GRH_LEN + 10);
    send_ud(&mut w, a, b, 1, QKEY, &pattern(11, 1));
    send_ud(&mut w, a, b, 2, QKEY, &pattern(10, 2));
    w.run(10_000);
    let got = wcs(&mut w, b);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (3, (GRH_LEN + 10) as u32));
    assert!(w.eps[b.ep].mem.equals(r, GRH_LEN, &pattern(10, 2)));
    assert_eq!(w.qp(b).counters().unrel, drops(|c| c.len_drops = 1));
}

#[test]
fn ud_message_longer_than_the_port_mtu_is_refused_at_posting() {
    let (mut w, q) = ud_world(&[QKEY, QKEY], Mtu::Mtu256);
    let d = w.ud_dest(q[0], q[1], QKEY);
    let k = mr(&w, q[0], &pattern(257, 0));
    let sge = [Sge {
        addr: VA,
        length: 257,
        lkey: k,
    }];
    let wr = SendWr::new(1, WrOpcode::Send)
        .sg(&sge)
        .ud(d)
        .flags(SendFlags::SIGNALED);
    assert_eq!(
        w.qp(q[0]).post_send(&wr),
        Err(PostError::MessageTooLong { len: 257, max: 256 })
    );
}

#[test]
fn ud_datagram_to_an_address_no_host_has_goes_nowhere_and_completes() {
    let (mut w, q) = ud_world(&[QKEY, QKEY], Mtu::Mtu1024);
    let d = w.ud_dest_ip(q[0], Ipv4Addr::new(10, 9, 9, 9), 0x11, QKEY);
    let k = mr(&w, q[0], &pattern(8, 0));
    let sge = [Sge {
        addr: VA,
        length: 8,
        lkey: k,
    }];
    let wr = SendWr::new(1, WrOpcode::Send).sg(&sge).ud(d);
    w.qp(q[0]).post_send(&wr).expect("post");
    w.run(100);
    assert_sends_ok(&mut w, q[0], &[1]);
    assert_eq!((w.stats.no_route, w.net.stats.sent), (1, 0));
}

/// A network duplicate is a new datagram to UD (nothing numbers datagrams for the receiver):
/// with a receive for each copy, it is delivered twice.
#[test]
fn ud_network_duplicate_is_delivered_again() {
    let mut w = World::new(
        1,
        Faults {
            duplicate: 1.0,
            ..Faults::NONE
        },
    );
    let mut q = Vec::new();
    for _ in 0..2 {
        let e = w.add_endpoint();
        let r = w.create_qp_of(e, QpType::Ud, QpCap::default(), None);
        w.bring_up_ud(r, QKEY, Mtu::Mtu1024, 0);
        q.push(r);
    }
    let (a, b) = (q[0], q[1]);
    let r1 = post_recv(&mut w, b, 1, GRH_LEN + 64);
    let r2 = post_recv(&mut w, b, 2, GRH_LEN + 64);
    post_recv(&mut w, b, 3, GRH_LEN + 64);
    send_ud(&mut w, a, b, 1, QKEY, &pattern(64, 1));
    w.run(10_000);
    assert_eq!(w.net.stats.duplicated, 1);
    let got: Vec<u64> = wcs(&mut w, b).iter().map(|c| c.wr_id).collect();
    assert_eq!(got, [1, 2]);
    for r in [r1, r2] {
        assert!(w.eps[b.ep].mem.equals(r, GRH_LEN, &pattern(64, 1)));
    }
    assert_eq!(w.qp(b).recv_queue_len(), 1);
}

/// UC resynchronises at any first or only packet, whatever its PSN: a late duplicate of a
/// one-packet message starts, and completes, that message again (as rxe does).
#[test]
fn uc_late_duplicate_of_a_one_packet_message_completes_again() {
    let mut w = World::new(
        1,
        Faults {
            duplicate: 1.0,
            reorder_delay_ns: 50_000,
            ..Faults::NONE
        },
    );
    let (e0, e1) = (w.add_endpoint(), w.add_endpoint());
    let a = w.create_qp_of(e0, QpType::Uc, QpCap::default(), None);
    let b = w.create_qp_of(e1, QpType::Uc, QpCap::default(), None);
    w.connect(a, b, ConnOpts::default());
    for i in 0..2 {
        post_recv(&mut w, b, i, 64);
    }
    send(&mut w, a, 1, WrOpcode::Send, &pattern(64, 2));
    w.run(10_000);
    let got: Vec<(u64, u32)> = wcs(&mut w, b)
        .iter()
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    assert_eq!(got, [(0, 64), (1, 64)]);
    assert_eq!(w.qp(b).counters().unrel, UnrelCounters::default());
}
