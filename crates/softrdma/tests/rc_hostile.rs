//! A connected but hostile peer against the sans-IO responder, over a real memory table:
//! requests crafted with `wire`, handed to the victim QP by hand, and everything the victim
//! answers inspected. The victim has an advertised region and a secret one (never
//! advertised) in its PD, and a region in another PD.

use std::net::Ipv4Addr;

use softrdma::mem::{
    Access, AccessCtx, MemConfig, MemSource, MemoryAccess, MemoryTable, MrInfo, PinMode,
};
use softrdma::rc::{Mtu, NAK_SEQ_WINDOW, Qp, QpAttr, QpCap, QpInit, RecvWr, Sge, WcStatus};
use softrdma::wire::{
    AddressVector, AtomicEthRepr, BthRepr, HeaderRepr, IcrcContext, NakCode, OpKind, Opcode,
    Packet, Psn, RethRepr, Syndrome,
};

const VICTIM: u32 = 0x22;
const PEER: u32 = 0x11;
const EPSN: u32 = 7000;
const SECRET: u8 = 0x5e;
const PUBLIC: u8 = 0xa0;

struct Victim {
    mem: MemoryTable,
    pd: u32,
    qp: Qp,
    public: MrInfo,
    secret: MrInfo,
    other_pd: MrInfo,
    buf: Vec<u8>,
}

/// What the victim sent: kind, PSN, syndrome, payload.
type Out = (OpKind, Psn, Option<Syndrome>, Vec<u8>);

fn victim(max_dest_rd_atomic: u8) -> Victim {
    let mem = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = mem.alloc_pd().unwrap();
    let pd2 = mem.alloc_pd().unwrap();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let public = mem
        .reg_mr(pd, MemSource::owned(vec![PUBLIC; 4096]), all, None)
        .unwrap();
    let secret = mem
        .reg_mr(pd, MemSource::owned(vec![SECRET; 8192]), all, None)
        .unwrap();
    let other_pd = mem
        .reg_mr(pd2, MemSource::owned(vec![SECRET; 4096]), all, None)
        .unwrap();
    let mut qp = Qp::new(QpInit {
        qp_num: VICTIM,
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
    .unwrap();
    qp.connect(&QpAttr {
        qp_access_flags: all,
        av: Some(AddressVector::from_context(IcrcContext::v4(
            Ipv4Addr::new(127, 0, 0, 2),
            Ipv4Addr::new(127, 0, 0, 1),
            0xc022,
        ))),
        path_mtu: Mtu::Mtu1024,
        rq_psn: EPSN,
        sq_psn: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic,
        min_rnr_timer: 1,
        dest_qp_num: PEER,
        ..QpAttr::default()
    })
    .unwrap();
    Victim {
        mem,
        pd,
        qp,
        public,
        secret,
        other_pd,
        buf: vec![0u8; 8192],
    }
}

fn request(op: Opcode, psn: u32) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, VICTIM, Psn::new(psn)));
    h.bth.ack_req = true;
    h
}

fn read_req(psn: u32, va: u64, rkey: u32, dma_len: u32) -> HeaderRepr {
    let mut h = request(Opcode::RC_READ_REQUEST, psn);
    h.reth = Some(RethRepr { va, rkey, dma_len });
    h
}

impl Victim {
    fn inject(&mut self, hdr: HeaderRepr, payload: &[u8]) {
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        self.qp.handle_packet(0, &pkt, &self.mem, None);
    }

    /// Everything the victim has to send.
    fn drain(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        while let Some(len) = self.qp.poll_transmit(0, &self.mem, &mut self.buf) {
            let pkt = Packet::parse(&self.buf[..len]).unwrap();
            let kind = pkt.hdr.bth.opcode.info().unwrap().kind;
            let syn = pkt.hdr.aeth.map(|a| a.syndrome);
            out.push((kind, pkt.hdr.bth.psn, syn, pkt.payload.to_vec()));
            assert!(out.len() < 10_000, "the victim does not stop sending");
        }
        out
    }

    fn counters(&self) -> softrdma::rc::RespCounters {
        self.qp.counters().resp
    }

    fn region_ok(&self, mr: &MrInfo) -> bool {
        let ctx = AccessCtx {
            pd: self.pd,
            qpn: VICTIM,
        };
        self.mem
            .check(ctx, mr.rkey, mr.iova, 1, Access::REMOTE_READ)
            .is_ok()
    }
}

fn no_secret(out: &[Out]) {
    for (kind, psn, _, payload) in out {
        assert!(
            !payload.contains(&SECRET),
            "secret bytes left in a {kind:?} at PSN {psn:?}"
        );
    }
}

/// A duplicate READ (a PSN behind the expected one) is served again only as the READ that
/// was executed at that PSN: same R_Key, a subset of its bytes. On the old code every one of
/// the forged duplicates below returned the secret region's bytes, and a bad key drew no NAK.
#[test]
fn duplicate_reads_are_served_only_as_the_read_they_repeat() {
    let mut v = victim(4);
    let (pub_va, pub_key) = (v.public.iova, v.public.rkey);
    let (sec_va, sec_key) = (v.secret.iova, v.secret.rkey);
    // A legitimate READ of 2 KiB of the advertised region (2 response packets).
    v.inject(read_req(EPSN, pub_va, pub_key, 2048), &[]);
    let out = v.drain();
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|o| o.0 == OpKind::ReadResponse));
    assert!(out.iter().all(|o| o.3.iter().all(|b| *b == PUBLIC)));

    let dropped = v.counters().duplicates_dropped;
    let forged = [
        // A PSN where no READ ever ran, naming the secret region.
        read_req(EPSN - 5, sec_va, sec_key, 64),
        // The READ's own PSN with another key.
        read_req(EPSN, sec_va, sec_key, 64),
        // Its second PSN with another key.
        read_req(EPSN + 1, sec_va, sec_key, 1024),
        // The same key, more bytes than the READ asked for.
        read_req(EPSN, pub_va, pub_key, 4096),
        // The same key, bytes before the READ's range.
        read_req(EPSN, pub_va - 1, pub_key, 16),
        // The other PD's region, and a key nobody has.
        read_req(EPSN - 1, v.other_pd.iova, v.other_pd.rkey, 64),
        read_req(EPSN - 2, 0x1000, 0x1234_5678, 1 << 30),
    ];
    let n = forged.len() as u64;
    for h in forged {
        v.inject(h, &[]);
    }
    let out = v.drain();
    assert!(out.is_empty(), "forged duplicates were answered: {out:?}");
    assert_eq!(v.counters().duplicates_dropped, dropped + n);

    // A genuine re-request of the second half is served again, from the memory.
    v.inject(read_req(EPSN + 1, pub_va + 1024, pub_key, 1024), &[]);
    let out = v.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].0, out[0].1),
        (OpKind::ReadResponse, Psn::new(EPSN + 1))
    );
    assert_eq!(out[0].3, vec![PUBLIC; 1024]);
    no_secret(&out);
    // The QP is healthy: a new request at the expected PSN is served.
    v.inject(read_req(EPSN + 2, pub_va, pub_key, 8), &[]);
    let out = v.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].3, vec![PUBLIC; 8]);
}

/// A request far ahead of the expected PSN cannot come from the peer's send window: it is
/// dropped and counted, and no NAK-sequence makes the real requester resend its window. On
/// the old code any PSN ahead drew a NAK-sequence.
#[test]
fn far_ahead_requests_draw_no_nak_sequence() {
    let mut v = victim(4);
    let (va, key) = (v.public.iova, v.public.rkey);
    for ahead in [NAK_SEQ_WINDOW as u32 + 1, 5000, 1 << 22, (1 << 23) - 1] {
        let mut h = request(Opcode::RC_WRITE_ONLY, EPSN + ahead);
        h.reth = Some(RethRepr {
            va,
            rkey: key,
            dma_len: 8,
        });
        v.inject(h, &[1; 8]);
    }
    assert!(v.drain().is_empty());
    assert_eq!(v.counters().far_ahead_dropped, 4);
    assert_eq!(v.counters().seq_naks_sent, 0);
    // Just ahead (a packet lost in the window): one NAK-sequence, for the expected PSN.
    let mut h = request(Opcode::RC_WRITE_ONLY, EPSN + 3);
    h.reth = Some(RethRepr {
        va,
        rkey: key,
        dma_len: 8,
    });
    v.inject(h, &[1; 8]);
    let out = v.drain();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].1, out[0].2),
        (
            Psn::new(EPSN),
            Some(Syndrome::Nak(NakCode::PsnSequenceError))
        )
    );
}

fn atomic_req(psn: u32, va: u64, rkey: u32) -> HeaderRepr {
    let mut h = request(Opcode::RC_FETCH_ADD, psn);
    h.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: 1,
        compare: 0,
    });
    h
}

/// The NAK for a misaligned atomic does not tell whether its key exists: both are Invalid
/// Request. On the old code a valid key drew Invalid Request and a bad one Remote Access
/// Error.
#[test]
fn misaligned_atomic_naks_do_not_reveal_keys() {
    let mut naks = Vec::new();
    for good in [true, false] {
        let mut v = victim(4);
        let key = if good { v.secret.rkey } else { 0x0bad_0b00 };
        let va = v.secret.iova + 4;
        v.inject(atomic_req(EPSN, va, key), &[]);
        let out = v.drain();
        assert_eq!(out.len(), 1);
        naks.push(out[0].2);
    }
    assert_eq!(naks[0], naks[1], "the NAK depends on the key");
    assert_eq!(naks[0], Some(Syndrome::Nak(NakCode::InvalidRequest)));
}

/// A responder that negotiated no READ/atomic depth refuses them (as rxe), rather than
/// serving one at a time.
#[test]
fn zero_responder_depth_refuses_reads_and_atomics() {
    for atomic in [false, true] {
        let mut v = victim(0);
        let h = if atomic {
            atomic_req(EPSN, v.public.iova, v.public.rkey)
        } else {
            read_req(EPSN, v.public.iova, v.public.rkey, 8)
        };
        v.inject(h, &[]);
        let out = v.drain();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].2, Some(Syndrome::Nak(NakCode::InvalidRequest)));
    }
}

/// A SEND with Invalidate naming a region's R_Key (which is also its L_Key) is refused: the
/// receive completes in error and the region stays valid. On the old code the peer
/// invalidated the region, denying its owner local use of it.
#[test]
fn send_with_invalidate_cannot_revoke_a_region() {
    let mut v = victim(4);
    let sge = [Sge {
        addr: v.secret.iova,
        length: 64,
        lkey: v.secret.lkey,
    }];
    v.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &sge,
    })
    .unwrap();
    let mut h = request(Opcode::RC_SEND_ONLY_INV, EPSN);
    h.ieth = Some(v.public.rkey);
    v.inject(h, &[7; 8]);
    let out = v.drain();
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0].2, Some(Syndrome::Nak(_))), "{out:?}");
    let wc = v.qp.poll_completion().expect("no receive completion");
    assert_eq!(wc.wr_id, 9);
    assert_ne!(wc.status, WcStatus::Success);
    assert_eq!(wc.invalidated_rkey, None);
    assert!(v.region_ok(&v.public), "the peer revoked a region");
    assert!(v.region_ok(&v.secret));
}

/// Duplicates do not use up the depth new requests are judged by: a requester that resent
/// its READs (a timeout while the originals were still queued) and posts a new READ as soon
/// as the first completes has no more than the negotiated depth outstanding, and must be
/// served. The old code counted the queued duplicates against the depth and answered the new
/// READ with a fatal Invalid Request NAK (first seen on the wire, after a storm of duplicate
/// READs in `tests/adversary.rs`).
#[test]
fn queued_duplicates_do_not_refuse_a_new_read_within_the_depth() {
    let mut v = victim(4);
    let (va, key) = (v.public.iova, v.public.rkey);
    // Four READs of four packets each, then the same four again.
    for _ in 0..2 {
        for r in 0..4 {
            v.inject(read_req(EPSN + 4 * r, va, key, 4096), &[]);
        }
    }
    // The first READ's stream goes out; the requester completes it and posts a fifth.
    for _ in 0..4 {
        assert!(v.qp.poll_transmit(0, &v.mem, &mut v.buf).is_some());
    }
    v.inject(read_req(EPSN + 16, va, key, 64), &[]);
    let out = v.drain();
    assert!(
        out.iter().all(|o| !matches!(o.2, Some(Syndrome::Nak(_)))),
        "{:?}",
        out.iter().map(|o| (o.1, o.2)).collect::<Vec<_>>()
    );
    assert!(
        out.iter()
            .any(|o| o.1 == Psn::new(EPSN + 16) && o.3 == vec![PUBLIC; 64])
    );
    assert_eq!(v.counters().naks_sent, 0);
}

/// Memory that accepts every access and keeps nothing: lets a test feed the responder a
/// message of gigabytes without holding them.
struct Sink;

impl MemoryAccess for Sink {
    fn check(
        &self,
        _: AccessCtx,
        _: u32,
        _: u64,
        _: u64,
        _: Access,
    ) -> Result<(), softrdma::mem::AccessError> {
        Ok(())
    }
    fn write(
        &self,
        _: AccessCtx,
        _: u32,
        _: u64,
        _: &[u8],
        _: Access,
    ) -> Result<(), softrdma::mem::AccessError> {
        Ok(())
    }
    fn read(
        &self,
        _: AccessCtx,
        _: u32,
        _: u64,
        out: &mut [u8],
        _: Access,
    ) -> Result<(), softrdma::mem::AccessError> {
        out.fill(0);
        Ok(())
    }
    fn atomic(
        &self,
        _: AccessCtx,
        _: u32,
        _: u64,
        _: softrdma::mem::AtomicOp,
    ) -> Result<u64, softrdma::mem::AccessError> {
        Ok(0)
    }
    fn invalidate(
        &self,
        _: AccessCtx,
        _: u32,
        _: softrdma::mem::Invalidator,
    ) -> Result<(), softrdma::mem::AccessError> {
        Ok(())
    }
    fn bind_mw(
        &self,
        _: AccessCtx,
        _: softrdma::mem::MwBind,
    ) -> Result<(), softrdma::mem::AccessError> {
        Ok(())
    }
}

/// A SEND longer than the largest message (2 GiB) into receive buffers larger still (two
/// SGEs of 4 GiB - 1 each): the packet that takes it past 2 GiB completes the receive with
/// LOC_LEN_ERR and draws an Invalid Request NAK, before the message's 32-bit offset could
/// wrap and place its bytes back at the start of the buffer. 524,289 packets of 4 KiB into
/// memory that keeps nothing.
#[test]
fn a_send_past_the_largest_message_is_refused_before_its_offset_wraps() {
    const MTU: usize = 4096;
    let mut qp = Qp::new(QpInit {
        qp_num: VICTIM,
        pd: 1,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        srq: None,
        sq_sig_all: false,
        qp_type: Default::default(),
    })
    .unwrap();
    qp.connect(&QpAttr {
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        av: Some(AddressVector::from_context(IcrcContext::v4(
            Ipv4Addr::new(127, 0, 0, 2),
            Ipv4Addr::new(127, 0, 0, 1),
            0xc022,
        ))),
        path_mtu: Mtu::Mtu4096,
        rq_psn: EPSN,
        sq_psn: 1,
        dest_qp_num: PEER,
        ..QpAttr::default()
    })
    .unwrap();
    let huge = |addr| Sge {
        addr,
        length: u32::MAX,
        lkey: 0x100,
    };
    qp.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: &[huge(0), huge(1 << 32)],
    })
    .unwrap();
    let payload = vec![0x42u8; MTU];
    let feed = |qp: &mut Qp, op: Opcode, psn: u32| {
        let mut h = HeaderRepr::new(BthRepr::new(op, VICTIM, Psn::new(psn)));
        h.bth.ack_req = false;
        let pkt = Packet {
            hdr: h,
            payload: &payload,
            icrc: 0,
        };
        qp.handle_packet(0, &pkt, &Sink, None);
    };
    let within = (softrdma::rc::MAX_MSG_SIZE / MTU as u64) as u32;
    feed(&mut qp, Opcode::RC_SEND_FIRST, EPSN);
    for i in 1..within {
        feed(&mut qp, Opcode::RC_SEND_MIDDLE, EPSN + i);
    }
    assert_eq!(qp.expected_psn(), Psn::new(EPSN + within), "2 GiB accepted");
    assert!(qp.poll_recv_completion().is_none());
    // One packet more: past 2 GiB.
    feed(&mut qp, Opcode::RC_SEND_MIDDLE, EPSN + within);
    let wc = qp.poll_recv_completion().expect("the receive completes");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::LocLenErr));
    let mut buf = vec![0u8; 8192];
    let mut naks = Vec::new();
    while let Some(n) = qp.poll_transmit(0, &Sink, &mut buf) {
        let p = Packet::parse(&buf[..n]).unwrap();
        naks.push((p.hdr.bth.psn, p.hdr.aeth.map(|a| a.syndrome)));
    }
    assert!(
        naks.contains(&(
            Psn::new(EPSN + within),
            Some(Syndrome::Nak(NakCode::InvalidRequest))
        )),
        "{naks:?}"
    );
    assert_eq!(qp.state(), softrdma::rc::QpState::Err);
}

/// A request refused with a fatal NAK (here a WRITE through a key that does not exist) ends
/// the QP in the error state; the NAK may be lost like any packet, and the requester then
/// sends the request again. The resend draws the same NAK (at its own PSN only), so that the
/// requester's WR ends in a remote access error, not a retry error after its timeouts. On the
/// old code the QP in the error state answered nothing.
#[test]
fn a_lost_fatal_nak_is_sent_again_for_the_resent_request() {
    let mut v = victim(4);
    let mut write = request(Opcode::RC_WRITE_ONLY, EPSN);
    write.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x0bad_0b00,
        dma_len: 8,
    });
    let nak = Some(Syndrome::Nak(NakCode::RemoteAccessError));
    v.inject(write, &[1; 8]);
    let out = v.drain();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!((out[0].1, out[0].2), (Psn::new(EPSN), nak));
    // Lost: the requester resends; the QP is in the error state by now.
    for _ in 0..2 {
        v.inject(write, &[1; 8]);
        let out = v.drain();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].1, out[0].2), (Psn::new(EPSN), nak));
    }
    // Another PSN draws nothing.
    let mut other = write;
    other.bth.psn = Psn::new(EPSN + 1);
    v.inject(other, &[1; 8]);
    assert!(v.drain().is_empty());
}
