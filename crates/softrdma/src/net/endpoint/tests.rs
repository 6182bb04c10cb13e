//! The endpoint without an engine: two (or three) endpoints, each driven by a recording
//! [`EndpointIo`] with a hand-set clock, their datagrams moved by the test. What the engine's
//! socket and thread would do is spelled out here step by step.

use std::cell::{Cell, RefCell};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::{ACK_DELAY, Endpoint, EndpointIo, QpCell, RxWork, TIMER_SLACK_PER_QP};
use crate::mem::{Access, AccessCtx, MemConfig, MemSource, MemoryAccess, MemoryTable, MrInfo};
use crate::net::cq::CqCore;
use crate::net::udp::{Received, TxBatch};
use crate::rc::{
    Mtu, Qp, QpAttr, QpCap, QpInit, SendFlags, SendWr, Sge, WcStatus, WorkCompletion, WrOpcode,
};
use crate::wire::{AddressVector, ROCE_PORT};

const LEN: usize = 8192;

/// A driver that records what it is asked to do.
#[derive(Default)]
struct Recorder {
    now: Cell<u64>,
    /// Datagrams sent: destination, bytes, segment size.
    sent: RefCell<Vec<(SocketAddr, Vec<u8>, usize)>>,
    wakes: Cell<u32>,
    lowered: Cell<Option<u64>>,
}

impl EndpointIo for Recorder {
    fn now(&self) -> u64 {
        self.now.get()
    }

    fn send(&self, tx: &mut TxBatch) -> std::io::Result<()> {
        self.sent.borrow_mut().extend(tx.take_datagrams());
        Ok(())
    }

    fn wake(&self) {
        self.wakes.set(self.wakes.get() + 1);
    }

    fn deadline_lowered(&self, t: u64) {
        self.lowered.set(Some(t));
    }
}

/// One host: an endpoint with one RC QP and one region.
struct Host {
    ep: Endpoint,
    io: Recorder,
    work: RxWork,
    cell: Arc<QpCell>,
    cq: Arc<CqCore>,
    mr: MrInfo,
    addr: SocketAddr,
}

impl Host {
    fn new(ip: Ipv4Addr, qpn: u32, gso: bool, fill: u8) -> Host {
        let addr = SocketAddr::from((ip, ROCE_PORT));
        let mem = Arc::new(MemoryTable::new(MemConfig::default()).unwrap());
        let pd = mem.alloc_pd().unwrap();
        let bytes: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(fill)).collect();
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = mem
            .reg_mr(pd, MemSource::owned(bytes), rights, None)
            .unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = Qp::new(QpInit {
            qp_num: qpn,
            pd,
            cap,
            srq: None,
            sq_sig_all: false,
            qp_type: Default::default(),
        })
        .unwrap();
        let cq = Arc::new(CqCore::new(64, None));
        let cell = Arc::new(QpCell::new(qp, pd, Arc::clone(&cq), Arc::clone(&cq), None));
        let ep = Endpoint::new(addr, mem, gso);
        ep.add_qp(Arc::clone(&cell));
        let io = Recorder {
            now: Cell::new(1_000_000),
            ..Recorder::default()
        };
        Host {
            ep,
            io,
            work: RxWork::default(),
            cell,
            cq,
            mr,
            addr,
        }
    }

    /// Connect the QP to `peer`'s QP `dest` (PSNs 100 out, 100 in).
    fn connect(&self, peer: SocketAddr, dest: u32) {
        let av = AddressVector::new(self.addr.ip(), peer.ip(), self.addr.port(), peer.port());
        let mut body = self.cell.lock();
        body.qp
            .connect(&QpAttr {
                qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
                av: Some(av),
                path_mtu: Mtu::Mtu1024,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                rq_psn: 100,
                sq_psn: 100,
                max_rd_atomic: 4,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                dest_qp_num: dest,
                ..QpAttr::default()
            })
            .unwrap();
        body.peer = Some(peer);
    }

    /// Post a signaled WRITE of `len` bytes of this host's region (from offset 0) to `to`'s
    /// region at `at`, and drive the QP as a post does.
    fn write_to(&self, to: &Host, at: u64, len: u32) {
        let mut body = self.cell.lock();
        self.post_write(to, 7, at, len, |wr| {
            self.ep.post_locked(&self.cell, &mut body, wr).unwrap()
        });
        self.ep
            .drive(&self.cell, &mut body, self.io.now(), &self.io);
    }

    /// Make the signaled WRITE `id` of `len` bytes of this host's region (from offset 0) to
    /// `to`'s region at `at`, and hand it to `post`.
    fn post_write<R>(
        &self,
        to: &Host,
        id: u64,
        at: u64,
        len: u32,
        post: impl FnOnce(&SendWr<'_>) -> R,
    ) -> R {
        let sge = [Sge {
            addr: self.mr.iova,
            length: len,
            lkey: self.mr.lkey,
        }];
        let wr = SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: to.mr.iova + at,
                rkey: to.mr.rkey,
            },
        )
        .sg(&sge)
        .flags(SendFlags::SIGNALED);
        post(&wr)
    }

    /// `len` bytes of this host's region from `at`.
    fn bytes(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let ctx = AccessCtx {
            pd: self.mr.pd,
            qpn: self.cell.qpn,
        };
        self.ep
            .mem()
            .read(ctx, self.mr.lkey, self.mr.iova + at, &mut v, Access::NONE)
            .unwrap();
        v
    }

    /// Take what this host sent.
    fn take_sent(&self) -> Vec<(SocketAddr, Vec<u8>, usize)> {
        std::mem::take(&mut *self.io.sent.borrow_mut())
    }

    /// Hand one datagram from `src` to this host at its clock, as a receive batch does, with
    /// acknowledgements held (`flush_all`: then sent at the batch's end, as in blocking
    /// mode). Returns the packets it held.
    fn receive(&mut self, src: SocketAddr, data: &[u8], segment: usize, flush_all: bool) -> usize {
        let now = self.io.now();
        let d = Received { src, data, segment };
        let n = self.ep.handle_datagram(now, &d, &mut self.work, &self.io);
        if flush_all {
            self.ep
                .flush_pending_at(&mut self.work, true, now, &self.io);
        }
        n
    }

    fn completions(&self) -> Vec<WorkCompletion> {
        let mut out = vec![crate::verbs::EMPTY_WC; 16];
        let n = self.cq.poll(&mut out);
        out.truncate(n);
        out
    }
}

/// A and B, connected.
fn pair(gso: bool) -> (Host, Host) {
    let a = Host::new(Ipv4Addr::new(10, 0, 0, 1), 0x11, gso, 3);
    let b = Host::new(Ipv4Addr::new(10, 0, 0, 2), 0x22, gso, 5);
    a.connect(b.addr, 0x22);
    b.connect(a.addr, 0x11);
    // A driver's first pass scans the timers (the device's deadline starts at 0).
    a.ep.run_timers(&a.io);
    b.ep.run_timers(&b.io);
    (a, b)
}

/// Move everything `from` sent to `to` (each datagram whole, acknowledgements flushed at the
/// end of each); returns the datagrams moved.
fn deliver(from: &Host, to: &mut Host) -> usize {
    let sent = from.take_sent();
    for (dst, data, seg) in &sent {
        assert_eq!(*dst, to.addr);
        to.receive(from.addr, data, *seg, true);
    }
    sent.len()
}

#[test]
fn a_write_is_placed_acknowledged_and_completed() {
    let (mut a, mut b) = pair(false);
    a.write_to(&b, 100, 3000);
    // Three packets at a 1024-byte MTU, each its own datagram without GSO.
    assert_eq!(deliver(&a, &mut b), 3);
    assert_eq!(b.bytes(100, 3000), a.bytes(0, 3000));
    assert!(a.completions().is_empty(), "completed before the ACK");
    assert_eq!(deliver(&b, &mut a), 1, "one ACK for the message");
    let wcs = a.completions();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::Success));
    assert_eq!(a.ep.counters.tx_packets.load(Relaxed), 3);
    assert_eq!(b.ep.counters.tx_packets.load(Relaxed), 1);
}

#[test]
fn strangers_unknown_qps_and_corrupted_packets_are_counted_and_change_nothing() {
    let (a, mut b) = pair(false);
    let before = b.bytes(0, LEN);
    // A third host connected to B's QP number, but B's QP is connected to A.
    let c = Host::new(Ipv4Addr::new(10, 0, 0, 3), 0x33, false, 7);
    c.connect(b.addr, 0x22);
    c.write_to(&b, 0, 1000);
    for (_, data, seg) in c.take_sent() {
        assert_eq!(b.receive(c.addr, &data, seg, true), 1);
    }
    assert_eq!(b.ep.counters.rx_wrong_peer.load(Relaxed), 1);
    // A's genuine packet, bit-flipped.
    a.write_to(&b, 0, 1000);
    let (_, mut data, seg) = a.take_sent().remove(0);
    data[40] ^= 1;
    b.receive(a.addr, &data, seg, true);
    assert_eq!(b.ep.counters.rx_bad.load(Relaxed), 1);
    // And intact, once B's QP has left the table.
    data[40] ^= 1;
    let cell = b.ep.remove_qp(0x22).unwrap();
    b.receive(a.addr, &data, seg, true);
    assert_eq!(b.ep.counters.rx_unknown_qp.load(Relaxed), 1);
    assert_eq!(b.bytes(0, LEN), before, "a dropped packet changed memory");
    assert!(b.take_sent().is_empty(), "a dropped packet was answered");
    // The same packet is accepted once the QP is back.
    b.ep.add_qp(cell);
    b.receive(a.addr, &data, seg, true);
    assert_eq!(b.bytes(0, 1000), a.bytes(0, 1000));
}

#[test]
fn a_held_acknowledgement_goes_when_due() {
    let (mut a, mut b) = pair(false);
    a.write_to(&b, 0, 512);
    let sent = a.take_sent();
    let t0 = b.io.now();
    for (_, data, seg) in &sent {
        b.receive(a.addr, data, *seg, false);
    }
    assert!(b.take_sent().is_empty(), "the ACK was not held");
    assert_eq!(b.work.held_ack_due(), Some(t0 + ACK_DELAY));
    // Not yet due: still held.
    b.ep.flush_pending_at(&mut b.work, false, t0 + ACK_DELAY - 1, &b.io);
    assert!(b.take_sent().is_empty());
    b.ep.flush_pending_at(&mut b.work, false, t0 + ACK_DELAY, &b.io);
    assert_eq!(b.work.held_ack_due(), None);
    assert_eq!(deliver(&b, &mut a), 1);
    assert_eq!(a.completions().len(), 1);
}

#[test]
fn a_lost_request_is_sent_again_by_the_timer_scan() {
    let (mut a, mut b) = pair(false);
    a.write_to(&b, 0, 2000);
    assert_eq!(a.take_sent().len(), 2, "lost");
    // The post armed the retransmission timer (67 ms at timeout 14); the device's deadline
    // stays at the first scan's rescan (50 ms), which was earlier.
    let due = a
        .cell
        .lock()
        .qp
        .poll_timeout()
        .expect("no retransmission timer");
    assert!(a.ep.next_timer() < due);
    a.io.now.set(due - 1);
    a.ep.run_timers(&a.io);
    assert!(a.take_sent().is_empty(), "resent before the timer");
    // That scan found the QP's deadline and told the driver (held back by the scan's slack:
    // one QP's worth after it).
    let next = due - 1 + TIMER_SLACK_PER_QP;
    assert_eq!((a.ep.next_timer(), a.io.lowered.get()), (next, Some(next)));
    a.io.now.set(next);
    a.ep.run_timers(&a.io);
    b.io.now.set(next);
    assert_eq!(deliver(&a, &mut b), 2);
    assert_eq!(b.bytes(0, 2000), a.bytes(0, 2000));
    deliver(&b, &mut a);
    let wcs = a.completions();
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert!(a.ep.counters.timer_scans.load(Relaxed) >= 2);
}

#[test]
fn gso_segments_verify_whole_and_split_apart() {
    // Whole: segment k of a GSO datagram carries the ICRC for identification k. 4000 bytes
    // at a 1024-byte MTU: FIRST (with its RETH) and the shorter MIDDLE in one datagram, then
    // MIDDLE and the shorter LAST.
    let (a, mut b) = pair(true);
    a.write_to(&b, 0, 4000);
    let sent = a.take_sent();
    let segments: Vec<usize> = sent.iter().map(|(_, d, s)| d.len().div_ceil(*s)).collect();
    assert_eq!(segments, [2, 2]);
    for (_, data, seg) in &sent {
        b.receive(a.addr, data, *seg, true);
    }
    assert_eq!(b.bytes(0, 4000), a.bytes(0, 4000));
    assert_eq!(b.ep.counters.rx_bad.load(Relaxed), 0);
    assert_eq!(b.ep.counters.rx_icrc_solved.load(Relaxed), 0);
    // Split apart (a path that segments): the second and third segments arrive as lone
    // packets whose identification is not the one their ICRC was computed for; it is solved
    // for.
    let (a, mut b) = pair(true);
    a.write_to(&b, 0, 4000);
    for (_, data, seg) in a.take_sent() {
        for piece in data.chunks(seg) {
            assert_eq!(b.receive(a.addr, piece, piece.len(), true), 1);
        }
    }
    assert_eq!(b.bytes(0, 4000), a.bytes(0, 4000));
    assert_eq!(b.ep.counters.rx_icrc_solved.load(Relaxed), 2);
    assert_eq!(b.ep.counters.rx_bad.load(Relaxed), 0);
}

#[test]
fn a_post_while_the_qp_is_held_waits_in_its_inbox_and_leaves_with_the_holders_drive() {
    let (mut a, mut b) = pair(false);
    // Another thread (the engine, sending) holds A's QP.
    let mut held = a.cell.lock();
    assert!(a.post_write(&b, 1, 0, 1000, |wr| a.cell.inbox_post(wr)));
    assert!(a.post_write(&b, 2, 1000, 1000, |wr| a.cell.inbox_post(wr)));
    assert_eq!(a.cell.inbox_len(), 2);
    assert!(a.take_sent().is_empty(), "sent without the QP");
    // The holder posts too: after the inbox's requests, in order.
    a.post_write(&b, 3, 2000, 1000, |wr| {
        a.ep.post_locked(&a.cell, &mut held, wr).unwrap()
    });
    assert_eq!(a.cell.inbox_len(), 0);
    a.ep.drive(&a.cell, &mut held, a.io.now(), &a.io);
    drop(held);
    assert_eq!(deliver(&a, &mut b), 3);
    assert_eq!(b.bytes(0, 3000), [a.bytes(0, 1000).repeat(3)].concat());
    deliver(&b, &mut a);
    let ids: Vec<u64> = a.completions().iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [1, 2, 3]);
}

#[test]
fn the_inbox_takes_no_more_than_the_send_queue_holds() {
    let (mut a, mut b) = pair(false);
    let held = a.cell.lock();
    // Depth 16: 16 requests fit, the 17th is left to the lock, where a full queue answers.
    for id in 0..16 {
        assert!(
            a.post_write(&b, id, 0, 8, |wr| a.cell.inbox_post(wr)),
            "{id}"
        );
    }
    assert!(!a.post_write(&b, 16, 0, 8, |wr| a.cell.inbox_post(wr)));
    drop(held);
    let mut body = a.cell.lock();
    let full = a.post_write(&b, 16, 0, 8, |wr| a.ep.post_locked(&a.cell, &mut body, wr));
    assert_eq!(full, Err(crate::rc::PostError::QueueFull));
    a.ep.drive(&a.cell, &mut body, a.io.now(), &a.io);
    drop(body);
    deliver(&a, &mut b);
    deliver(&b, &mut a);
    assert_eq!(a.completions().len(), 16);
    // Their slots came back before their completions reached the CQ.
    let held = a.cell.lock();
    for id in 0..16 {
        assert!(
            a.post_write(&b, id, 0, 8, |wr| a.cell.inbox_post(wr)),
            "{id}"
        );
    }
    drop(held);
}

#[test]
fn the_inbox_leaves_what_it_cannot_check_to_the_lock() {
    let (a, b) = pair(false);
    // Two SGEs where the QP takes one: the lock's answer is the exact error.
    let sge = [Sge {
        addr: a.mr.iova,
        length: 8,
        lkey: a.mr.lkey,
    }; 2];
    let wr = SendWr::new(
        9,
        WrOpcode::RdmaWrite {
            remote_addr: b.mr.iova,
            rkey: b.mr.rkey,
        },
    )
    .sg(&sge);
    let held = a.cell.lock();
    assert!(!a.cell.inbox_post(&wr));
    drop(held);
    // A QP not yet connected: its rules (RESET) refuse any post.
    let c = Host::new(Ipv4Addr::new(10, 0, 0, 3), 0x33, false, 7);
    let held = c.cell.lock();
    assert!(!c.post_write(&b, 1, 0, 8, |wr| c.cell.inbox_post(wr)));
    drop(held);
    // A QP never unlocked since it was made has published no rules at all.
    let qp = Qp::new(QpInit {
        qp_num: 0x44,
        pd: a.mr.pd,
        cap: QpCap::default(),
        srq: None,
        sq_sig_all: false,
        qp_type: Default::default(),
    })
    .unwrap();
    let fresh = QpCell::new(qp, a.mr.pd, Arc::clone(&a.cq), Arc::clone(&a.cq), None);
    assert!(!a.post_write(&b, 1, 0, 8, |wr| fresh.inbox_post(wr)));
}

#[test]
fn an_inbox_the_holder_did_not_see_is_sent_from_the_pending_transmit_queue() {
    let (mut a, mut b) = pair(false);
    let held = a.cell.lock();
    assert!(a.post_write(&b, 4, 0, 2000, |wr| a.cell.inbox_post(wr)));
    // The poster could not take the QP: it queues it and wakes the driver (once).
    a.ep.queue_inbox(&a.cell, &a.io);
    a.ep.queue_inbox(&a.cell, &a.io);
    assert_eq!((a.io.wakes.get(), a.ep.pending_transmit_len()), (1, 1));
    // The holder was only reading the QP's counters: it unlocks without driving.
    drop(held);
    assert!(a.take_sent().is_empty());
    assert_eq!(a.ep.serve_pending_transmit(&a.io), 1);
    assert_eq!(deliver(&a, &mut b), 2);
    assert_eq!(b.bytes(0, 2000), a.bytes(0, 2000));
    deliver(&b, &mut a);
    assert_eq!(a.completions()[0].wr_id, 4);
}

#[test]
fn a_request_the_qp_no_longer_takes_is_dropped_counted_and_gives_its_slot_back() {
    let (a, b) = pair(false);
    let mut held = a.cell.lock();
    assert!(a.post_write(&b, 5, 0, 8, |wr| a.cell.inbox_post(wr)));
    // The holder resets the QP before it takes the inbox in (the application raced a post
    // with a reset).
    let reset = QpAttr {
        qp_state: crate::rc::QpState::Reset,
        ..*held.qp.attr()
    };
    held.qp
        .modify(&reset, crate::rc::QpAttrMask::STATE)
        .unwrap();
    assert_eq!(a.ep.absorb_inbox(&a.cell, &mut held), 1);
    assert_eq!(a.ep.counters.posts_dropped.load(Relaxed), 1);
    assert_eq!(held.qp.send_queue_len(), 0);
    drop(held);
    assert_eq!(a.cell.sq_used.load(Relaxed), 0);
}

/// Move everything `from` sent to `to` with acknowledgements held, as a busy-poll receive
/// batch leaves them for the application's next poll.
fn deliver_held(from: &Host, to: &mut Host) {
    for (_, data, seg) in from.take_sent() {
        to.receive(from.addr, &data, seg, false);
    }
}

/// Packets in each datagram `from` sent, delivered to `to` (acknowledgements flushed).
fn segments_sent(from: &Host, to: &mut Host) -> Vec<usize> {
    let sent = from.take_sent();
    for (_, data, seg) in &sent {
        to.receive(from.addr, data, *seg, true);
    }
    sent.iter()
        .map(|(_, d, seg)| d.len().div_ceil(*seg))
        .collect()
}

/// One round of a ping-pong whose answer comes several polls after the message (RxM's): A's
/// signaled WRITE reaches B, whose ACK is held; B's application polls and finds nothing
/// `idle` ns later; then B answers with a WRITE of its own. Returns the packets of each
/// datagram B sent: at the poll, and with its answer.
fn slow_answer_round(a: &mut Host, b: &mut Host, idle: u64) -> (Vec<usize>, Vec<usize>) {
    let t = b.io.now() + 100_000;
    a.io.now.set(t);
    b.io.now.set(t);
    a.write_to(b, 0, 256);
    deliver_held(a, b);
    b.io.now.set(t + idle);
    b.ep.flush_held_early(&mut b.work, t + idle, &b.io);
    let at_poll = segments_sent(b, a);
    b.write_to(a, 0, 256);
    let with_answer = segments_sent(b, a);
    // A's ACK of B's WRITE (B then waits for none), and both sides' completions.
    segments_sent(a, b);
    a.completions();
    b.completions();
    (at_poll, with_answer)
}

#[test]
fn an_ack_sent_early_for_nothing_is_held_longer_next_time() {
    let (mut a, mut b) = pair(true);
    let grace = crate::params::ACK_GRACE;
    // The first time the grace runs out, the ACK goes alone; the answer follows it.
    assert_eq!(
        slow_answer_round(&mut a, &mut b, grace + 500),
        (vec![1], vec![1])
    );
    // B answered before A sent anything more: the early ACK was needless, the grace doubles.
    // The same idle poll lets it ride with the answer (two segments, one datagram).
    assert_eq!(
        slow_answer_round(&mut a, &mut b, grace + 500),
        (vec![], vec![2])
    );
    // Past the doubled grace it goes early again, and again for nothing: doubled again.
    assert_eq!(
        slow_answer_round(&mut a, &mut b, 2 * grace + 500),
        (vec![1], vec![1])
    );
    assert_eq!(
        slow_answer_round(&mut a, &mut b, 2 * grace + 500),
        (vec![], vec![2])
    );
    // Never past ACK_DELAY, when a held ACK is due anyway.
    for _ in 0..8 {
        slow_answer_round(&mut a, &mut b, ACK_DELAY + 500);
    }
    assert_eq!(b.cell.lock().held_ack.grace(), ACK_DELAY);
}

/// Two rounds whose early ACKs prove needless: B's grace becomes 4 x ACK_GRACE. Returns a
/// clock reading past them, set on both hosts.
fn grace_raised_twice(a: &mut Host, b: &mut Host) -> u64 {
    let grace = crate::params::ACK_GRACE;
    slow_answer_round(a, b, grace + 500);
    slow_answer_round(a, b, 2 * grace + 500);
    assert_eq!(b.cell.lock().held_ack.grace(), 4 * grace);
    let t = b.io.now() + 100_000;
    a.io.now.set(t);
    b.io.now.set(t);
    t
}

#[test]
fn an_ack_the_peer_waited_for_goes_early_again() {
    let (mut a, mut b) = pair(true);
    let grace = crate::params::ACK_GRACE;
    // Now B's application answers nothing: the ACK goes when the grace runs out, and A's next
    // request follows (A waited for the completion it brought, as a blocking zero-copy
    // sender does).
    let t = grace_raised_twice(&mut a, &mut b);
    a.write_to(&b, 0, 256);
    deliver_held(&a, &mut b);
    b.io.now.set(t + 4 * grace);
    b.ep.flush_held_early(&mut b.work, t + 4 * grace, &b.io);
    assert_eq!(segments_sent(&b, &mut a), vec![1]);
    a.write_to(&b, 0, 256);
    deliver_held(&a, &mut b);
    // The peer's request after an early ACK: back to ACK_GRACE.
    assert_eq!(b.cell.lock().held_ack.grace(), grace);
    b.io.now.set(t + 5 * grace + 500);
    b.ep.flush_held_early(&mut b.work, t + 5 * grace + 500, &b.io);
    assert_eq!(segments_sent(&b, &mut a), vec![1]);
}

#[test]
fn an_ack_that_goes_while_this_side_waits_for_the_peers_goes_early_again() {
    let (mut a, mut b) = pair(true);
    let grace = crate::params::ACK_GRACE;
    // Both post at once (an MPI exchange of zero-copy sends): each WRITE arrives with no ACK
    // riding on it, and each side holds the other's ACK while it waits for its own.
    let t = grace_raised_twice(&mut a, &mut b);
    b.write_to(&a, 0, 256);
    a.write_to(&b, 0, 256);
    deliver_held(&b, &mut a);
    deliver_held(&a, &mut b);
    b.io.now.set(t + 4 * grace);
    b.ep.flush_held_early(&mut b.work, t + 4 * grace, &b.io);
    assert_eq!(segments_sent(&b, &mut a), vec![1]);
    assert_eq!(b.cell.lock().held_ack.grace(), grace);
}
