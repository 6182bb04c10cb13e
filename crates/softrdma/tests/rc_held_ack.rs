//! Acknowledgements: when the requester asks for them (AckReq), when the responder sends
//! those nobody asked for (lazily, `LAZY_ACK_NS`), and held ones: a driver may leave a lone
//! positive ACK queued in the transport (`hold_ack`), where newer ACKs replace it, and build
//! it only when it sends it. Two QPs over a real memory table, packets passed by hand.

use std::net::Ipv4Addr;

use softrdma::mem::{
    Access, AccessCtx, MemConfig, MemSource, MemoryAccess, MemoryTable, MrInfo, PinMode,
};
use softrdma::rc::{
    Gather, LAZY_ACK_NS, Mtu, Qp, QpAttr, QpCap, QpInit, SendFlags, SendWr, Sge, WcStatus, WrOpcode,
};
use softrdma::wire::{AddressVector, IcrcContext, NakCode, OpKind, Packet, Psn, Syndrome};

const IA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PSN_A: u32 = 100;
const PSN_B: u32 = 5000;

struct World {
    pd: u32,
    mem: MemoryTable,
    a: Qp,
    b: Qp,
    mb: MrInfo,
    buf: Vec<u8>,
    gather: Gather,
}

fn port(qpn: u32) -> u16 {
    0xc000 | (qpn as u16 & 0x3fff)
}

fn connect(q: &mut Qp, local: Ipv4Addr, remote: Ipv4Addr, dest: u32, sq: u32, rq: u32) {
    q.connect(&QpAttr {
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        av: Some(AddressVector::from_context(IcrcContext::v4(
            local,
            remote,
            port(q.qp_num()),
        ))),
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        rq_psn: rq,
        sq_psn: sq,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        dest_qp_num: dest,
        ..QpAttr::default()
    })
    .unwrap();
}

fn world() -> World {
    let mem = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = mem.alloc_pd().unwrap();
    let mb = mem
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 4096]),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            None,
        )
        .unwrap();
    let qp = |qpn| {
        Qp::new(QpInit {
            qp_num: qpn,
            pd,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            srq: None,
            sq_sig_all: false,
            qp_type: Default::default(),
        })
        .unwrap()
    };
    let (mut a, mut b) = (qp(0x11), qp(0x22));
    connect(&mut a, IA, IB, 0x22, PSN_A, PSN_B);
    connect(&mut b, IB, IA, 0x11, PSN_B, PSN_A);
    World {
        pd,
        mem,
        a,
        b,
        mb,
        buf: vec![0u8; 8192],
        gather: Gather::default(),
    }
}

impl World {
    /// `len` bytes of b's region from `offset`.
    fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        let ctx = AccessCtx {
            pd: self.pd,
            qpn: 0x22,
        };
        self.mem
            .read(
                ctx,
                self.mb.lkey,
                self.mb.iova + offset,
                &mut v,
                Access::NONE,
            )
            .unwrap();
        v
    }

    /// `a` writes `data` at `offset` into b's region (through `rkey`), signaled.
    fn post_write(&mut self, id: u64, offset: u64, rkey: u32, data: &[u8]) {
        self.post_write_flags(id, offset, rkey, data, SendFlags::SIGNALED);
    }

    /// [`World::post_write`] with these flags (INLINE is added).
    fn post_write_flags(&mut self, id: u64, offset: u64, rkey: u32, data: &[u8], f: SendFlags) {
        let wr = SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: self.mb.iova + offset,
                rkey,
            },
        )
        .inline(data)
        .flags(SendFlags::INLINE | f);
        self.a.post_send(&wr).unwrap();
    }

    /// Move every packet `a` has to `b`; returns how many.
    fn a_to_b(&mut self) -> usize {
        self.a_to_b_at(0).len()
    }

    /// Move every packet `a` has to `b` at time `now`; returns their AckReq bits.
    fn a_to_b_at(&mut self, now: u64) -> Vec<bool> {
        let mut ack_reqs = Vec::new();
        while let Some(len) = self.a.poll_transmit(now, &self.mem, &mut self.buf) {
            let ctx = IcrcContext::v4(IA, IB, port(0x11));
            let pkt = Packet::parse_verified(&ctx, &self.buf[..len]).unwrap();
            ack_reqs.push(pkt.hdr.bth.ack_req);
            self.b.handle_packet(now, &pkt, &self.mem, None);
        }
        ack_reqs
    }

    /// Drop every packet `a` has ready; returns their AckReq bits.
    fn a_lose_all(&mut self, now: u64) -> Vec<bool> {
        let mut ack_reqs = Vec::new();
        while let Some(len) = self.a.poll_transmit(now, &self.mem, &mut self.buf) {
            let ctx = IcrcContext::v4(IA, IB, port(0x11));
            ack_reqs.push(
                Packet::parse_verified(&ctx, &self.buf[..len])
                    .unwrap()
                    .hdr
                    .bth
                    .ack_req,
            );
        }
        ack_reqs
    }

    /// b's next packet, built as a driver holding ACKs (`hold`) or not would; it is handed
    /// to `a`, and its opcode kind, PSN and AETH syndrome are returned.
    fn b_next(&mut self, hold: bool) -> Option<(OpKind, Psn, Option<Syndrome>)> {
        let len =
            self.b
                .poll_transmit_gather(0, &self.mem, &mut self.buf, &mut self.gather, hold)?;
        assert!(self.gather.is_empty(), "nothing here is lent");
        let ctx = IcrcContext::v4(IB, IA, port(0x22));
        let pkt = Packet::parse_verified(&ctx, &self.buf[..len]).unwrap();
        let kind = pkt.hdr.bth.opcode.info().unwrap().kind;
        let out = (kind, pkt.hdr.bth.psn, pkt.hdr.aeth.map(|a| a.syndrome));
        self.a.handle_packet(0, &pkt, &self.mem, None);
        Some(out)
    }
}

#[test]
fn a_lone_ack_is_held_and_replaced_by_newer_ones() {
    let mut w = world();
    let rkey = w.mb.rkey;
    for i in 0..3u64 {
        w.post_write(i, i * 8, rkey, &[i as u8 + 1; 8]);
        assert_eq!(w.a_to_b(), 1);
        assert!(w.b.holds_ack(), "WRITE {i} left no ACK to hold");
        assert_eq!(w.b_next(true), None, "a held ACK was sent");
    }
    // The three WRITEs are placed, but unacknowledged: a has no completion yet.
    assert!(w.a.poll_completion().is_none());
    // Released: one ACK, for the newest PSN, and nothing else.
    let (kind, psn, syn) = w.b_next(false).expect("no ACK released");
    assert_eq!(kind, OpKind::Ack);
    assert_eq!(psn, Psn::new(PSN_A + 2));
    assert!(matches!(syn, Some(Syndrome::Ack { .. })));
    assert!(!w.b.holds_ack());
    assert_eq!(w.b_next(false), None);
    // The cumulative ACK completes all three, in order.
    for i in 0..3 {
        let wc = w.a.poll_completion().expect("WRITE not completed");
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
}

#[test]
fn requests_go_out_past_a_held_ack() {
    let mut w = world();
    let rkey = w.mb.rkey;
    w.post_write(1, 0, rkey, b"abcdefgh");
    w.a_to_b();
    assert!(w.b.holds_ack());
    // b's own request (a WRITE into its own region: a has no region of its own here, so the
    // answer is a NAK; what matters is that the request leaves while the ACK stays held).
    let wr = SendWr::new(
        9,
        WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0x1234_5600,
        },
    )
    .inline(b"xy")
    .flags(SendFlags::INLINE | SendFlags::SIGNALED);
    w.b.post_send(&wr).unwrap();
    let (kind, psn, _) = w.b_next(true).expect("the request did not go out");
    assert_eq!((kind, psn), (OpKind::Write, Psn::new(PSN_B)));
    assert!(w.b.holds_ack(), "the ACK went out with the request");
    assert_eq!(w.b_next(true), None);
    let (kind, psn, _) = w.b_next(false).expect("no ACK released");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A)));
}

#[test]
fn negative_acknowledgements_are_never_held() {
    let mut w = world();
    w.post_write(1, 0, 0xdead_be00, b"abcdefgh");
    w.a_to_b();
    assert!(!w.b.holds_ack(), "a NAK counted as a holdable ACK");
    let (kind, psn, syn) = w.b_next(true).expect("the NAK was held");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A)));
    assert_eq!(syn, Some(Syndrome::Nak(NakCode::RemoteAccessError)));
    let wc =
        w.a.poll_completion()
            .expect("no completion for the refused WRITE");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
}

#[test]
fn unsignaled_messages_ask_for_no_ack_and_are_acknowledged_lazily() {
    let mut w = world();
    let rkey = w.mb.rkey;
    let t0 = 1_000_000;
    for i in 0..3u64 {
        w.post_write_flags(i, i * 8, rkey, &[i as u8 + 1; 8], SendFlags::NONE);
        assert_eq!(
            w.a_to_b_at(t0 + i),
            vec![false],
            "unsignaled WRITE {i} asked for an ACK"
        );
    }
    // Placed, but nothing answers yet: b waits for a requested ACK to cover them.
    assert_eq!(w.bytes(0, 24), [[1u8; 8], [2; 8], [3; 8]].concat());
    assert_eq!(w.b_next(false), None, "an unrequested ACK went out at once");
    // The timer runs from the first unacknowledged request, not the newest.
    assert_eq!(w.b.poll_timeout(), Some(t0 + LAZY_ACK_NS));
    w.b.handle_timeout(t0 + LAZY_ACK_NS - 1);
    assert_eq!(w.b_next(false), None, "the lazy ACK went out early");
    assert_eq!(w.a.send_queue_len(), 3);
    w.b.handle_timeout(t0 + LAZY_ACK_NS);
    let (kind, psn, syn) = w.b_next(false).expect("no lazy ACK");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A + 2)));
    assert!(matches!(syn, Some(Syndrome::Ack { .. })));
    assert_eq!(w.b_next(false), None);
    assert_eq!(w.b.poll_timeout(), None, "b still has a timer");
    // The one ACK retires all three (silently: unsignaled) and stops a's retransmission timer.
    assert_eq!(w.a.send_queue_len(), 0);
    assert!(w.a.poll_completion().is_none());
    assert_eq!(w.a.poll_timeout(), None);
}

#[test]
fn a_signaled_message_asks_for_the_ack_that_covers_the_unsignaled_ones_before_it() {
    let mut w = world();
    let rkey = w.mb.rkey;
    w.post_write_flags(1, 0, rkey, b"aaaaaaaa", SendFlags::NONE);
    w.post_write_flags(2, 8, rkey, b"bbbbbbbb", SendFlags::NONE);
    w.post_write_flags(3, 16, rkey, b"cccccccc", SendFlags::SIGNALED);
    assert_eq!(w.a_to_b_at(5), vec![false, false, true]);
    assert_eq!(
        w.b.poll_timeout(),
        None,
        "a lazy ACK is pending behind a requested one"
    );
    let (kind, psn, _) = w.b_next(false).expect("no ACK for the signaled WRITE");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A + 2)));
    assert_eq!(w.b_next(false), None);
    let wc =
        w.a.poll_completion()
            .expect("the signaled WRITE did not complete");
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    assert!(w.a.poll_completion().is_none());
    assert_eq!(w.a.send_queue_len(), 0);
}

#[test]
fn a_read_response_acknowledges_the_unsignaled_writes_before_it() {
    let mut w = world();
    let rkey = w.mb.rkey;
    w.post_write_flags(1, 0, rkey, b"12345678", SendFlags::NONE);
    let sge = [Sge {
        addr: w.mb.iova + 2048,
        length: 8,
        lkey: w.mb.lkey,
    }];
    let read = SendWr::new(
        2,
        WrOpcode::RdmaRead {
            remote_addr: w.mb.iova,
            rkey,
        },
    )
    .sg(&sge);
    w.a.post_send(&read).unwrap();
    // READ requests always ask (their responses are what the requester waits for).
    assert_eq!(w.a_to_b_at(5), vec![false, true]);
    assert_eq!(
        w.b.poll_timeout(),
        None,
        "the READ response leaves nothing to ACK lazily"
    );
    let (kind, _, _) = w.b_next(false).expect("no READ response");
    assert_eq!(kind, OpKind::ReadResponse);
    assert_eq!(w.b_next(false), None, "an ACK beside the READ response");
    assert_eq!(
        w.a.send_queue_len(),
        0,
        "the WRITE was not retired by the response"
    );
    assert_eq!(w.bytes(2048, 8), b"12345678");
}

#[test]
fn half_a_send_queue_of_unacknowledged_wqes_asks_for_an_ack() {
    // max_send_wr is 16: the 8th outstanding unsignaled WQE asks, so the queue never fills
    // with WQEs that only a lazy ACK would retire.
    let mut w = world();
    let rkey = w.mb.rkey;
    let mut asked = Vec::new();
    for i in 0..12u64 {
        w.post_write_flags(i, i * 8, rkey, &[7; 8], SendFlags::NONE);
        asked.extend(w.a_to_b_at(i));
        if let Some((kind, _, _)) = w.b_next(false) {
            assert_eq!(kind, OpKind::Ack);
        }
    }
    let want: Vec<bool> = (0..12).map(|i| i == 7).collect();
    assert_eq!(asked, want);
    assert_eq!(
        w.a.send_queue_len(),
        4,
        "the requested ACK did not retire the first eight"
    );
}

#[test]
fn a_retransmitted_message_asks_for_an_ack() {
    let mut w = world();
    let rkey = w.mb.rkey;
    w.post_write_flags(1, 0, rkey, b"lostlost", SendFlags::NONE);
    assert_eq!(w.a_lose_all(0), vec![false]);
    // Nothing arrived, so nothing will ever acknowledge it lazily: the retransmission asks.
    let t = w.a.poll_timeout().expect("no retransmission timer");
    w.a.handle_timeout(t);
    assert_eq!(
        w.a_to_b_at(t),
        vec![true],
        "the retransmission did not ask for an ACK"
    );
    let (kind, psn, _) = w.b_next(false).expect("no ACK for the retransmission");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A)));
    assert_eq!(w.a.send_queue_len(), 0);
}

#[test]
fn a_destroyed_responder_qp_sends_its_lazy_ack_first() {
    let mut w = world();
    let rkey = w.mb.rkey;
    w.post_write_flags(1, 0, rkey, b"abcdefgh", SendFlags::NONE);
    assert_eq!(w.a_to_b_at(0), vec![false]);
    assert_eq!(w.b_next(false), None);
    // What a driver does before the QP goes away (softrdma's `Qp` drop).
    w.b.ack_now();
    let (kind, psn, _) = w.b_next(false).expect("ack_now sent nothing");
    assert_eq!((kind, psn), (OpKind::Ack, Psn::new(PSN_A)));
    assert_eq!(w.b.poll_timeout(), None);
    assert_eq!(w.a.send_queue_len(), 0);
}
