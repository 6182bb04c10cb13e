//! Held acknowledgements: a driver may leave a lone positive ACK queued in the transport
//! (`hold_ack`), where newer ACKs replace it, and build it only when it sends it. Two QPs
//! over a real memory table, packets passed by hand.

use std::net::Ipv4Addr;

use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, MrInfo, PinMode};
use softrdma::rc::{Gather, Mtu, Qp, QpAttr, QpCap, QpInit, SendFlags, SendWr, WcStatus, WrOpcode};
use softrdma::wire::{IcrcContext, NakCode, OpKind, Packet, Psn, Syndrome};

const IA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PSN_A: u32 = 100;
const PSN_B: u32 = 5000;

struct World {
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
        av: Some(IcrcContext::v4(local, remote, port(q.qp_num()))),
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
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
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
        })
        .unwrap()
    };
    let (mut a, mut b) = (qp(0x11), qp(0x22));
    connect(&mut a, IA, IB, 0x22, PSN_A, PSN_B);
    connect(&mut b, IB, IA, 0x11, PSN_B, PSN_A);
    World {
        mem,
        a,
        b,
        mb,
        buf: vec![0u8; 8192],
        gather: Gather::default(),
    }
}

impl World {
    /// `a` writes `data` at `offset` into b's region (through `rkey`), signaled.
    fn post_write(&mut self, id: u64, offset: u64, rkey: u32, data: &[u8]) {
        let wr = SendWr::new(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: self.mb.iova + offset,
                rkey,
            },
        )
        .inline(data)
        .flags(SendFlags::INLINE | SendFlags::SIGNALED);
        self.a.post_send(&wr).unwrap();
    }

    /// Move every packet `a` has to `b`; returns how many.
    fn a_to_b(&mut self) -> usize {
        let mut n = 0;
        while let Some(len) = self.a.poll_transmit(0, &self.mem, &mut self.buf) {
            let ctx = IcrcContext::v4(IA, IB, port(0x11));
            let pkt = Packet::parse_verified(&ctx, &self.buf[..len]).unwrap();
            self.b.handle_packet(0, &pkt, &self.mem, None);
            n += 1;
        }
        n
    }

    /// b's next packet, built as a driver holding ACKs (`hold`) or not would; it is handed
    /// to `a`, and its opcode kind, PSN and AETH syndrome are returned.
    fn b_next(&mut self, hold: bool) -> Option<(OpKind, Psn, Option<Syndrome>)> {
        let len =
            self.b
                .poll_transmit_gather(0, &self.mem, &mut self.buf, &mut self.gather, hold)?;
        assert!(self.gather.pieces.is_empty(), "nothing here is lent");
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
