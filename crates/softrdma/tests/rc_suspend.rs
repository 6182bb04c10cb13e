//! A region suspended in the middle of a message, against the sans-IO responder over a real
//! memory table (the seeds' "suspend … resume … at a Memory Region scope"): the peer sees only
//! RNR waits (or, for a READ response stream, silence until it asks again) and successes,
//! never an error, and everything lands once the region is resumed. And a region invalidated
//! in the middle of a message ("declare an access violation and tear all the connections using
//! it down"): the QP that uses it ends at once, with the NAK that ends the peer's message.

use std::net::Ipv4Addr;

use softrdma::mem::{
    Access, AccessCtx, MemConfig, MemSource, MemoryAccess, MemoryTable, MrInfo, PinMode,
};
use softrdma::rc::{Mtu, Qp, QpAttr, QpCap, QpInit, QpState, RecvWr, Sge, WcOpcode, WcStatus};
use softrdma::wire::{
    AddressVector, AtomicEthRepr, BthRepr, HeaderRepr, IcrcContext, OpKind, Opcode, Packet, Psn,
    RethRepr, Syndrome,
};

const RESPONDER: u32 = 0x22;
const PEER: u32 = 0x11;
const EPSN: u32 = 500;
const MTU: usize = 1024;

struct Responder {
    mem: MemoryTable,
    pd: u32,
    qp: Qp,
    region: MrInfo,
    buf: Vec<u8>,
}

/// What the responder sent: kind, PSN, syndrome, payload.
type Out = (OpKind, Psn, Option<Syndrome>, Vec<u8>);

fn responder() -> Responder {
    let mem = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = mem.alloc_pd().unwrap();
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let region = mem
        .reg_mr(pd, MemSource::owned(vec![0u8; 4096]), all, None)
        .unwrap();
    let mut qp = Qp::new(QpInit {
        qp_num: RESPONDER,
        pd,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
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
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        dest_qp_num: PEER,
        ..QpAttr::default()
    })
    .unwrap();
    Responder {
        mem,
        pd,
        qp,
        region,
        buf: vec![0u8; 8192],
    }
}

fn request(op: Opcode, psn: u32) -> HeaderRepr {
    let mut h = HeaderRepr::new(BthRepr::new(op, RESPONDER, Psn::new(psn)));
    h.bth.ack_req = true;
    h
}

impl Responder {
    /// Hand the responder a READ request for `len` bytes at `offset` into the region (its
    /// responses stay queued).
    fn read(&mut self, psn: u32, offset: u64, len: u32) {
        let mut h = request(Opcode::RC_READ_REQUEST, psn);
        h.reth = Some(RethRepr {
            va: self.region.iova + offset,
            rkey: self.region.rkey,
            dma_len: len,
        });
        let pkt = Packet {
            hdr: h,
            payload: &[],
            icrc: 0,
        };
        self.qp.handle_packet(0, &pkt, &self.mem, None);
    }

    fn inject(&mut self, hdr: HeaderRepr, payload: &[u8]) -> Vec<Out> {
        let pkt = Packet {
            hdr,
            payload,
            icrc: 0,
        };
        self.qp.handle_packet(0, &pkt, &self.mem, None);
        self.drain()
    }

    fn drain(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        while let Some(len) = self.qp.poll_transmit(0, &self.mem, &mut self.buf) {
            let pkt = Packet::parse(&self.buf[..len]).unwrap();
            let kind = pkt.hdr.bth.opcode.info().unwrap().kind;
            let syn = pkt.hdr.aeth.map(|a| a.syndrome);
            out.push((kind, pkt.hdr.bth.psn, syn, pkt.payload.to_vec()));
            assert!(out.len() < 1000, "the responder does not stop sending");
        }
        out
    }

    fn ctx(&self) -> AccessCtx {
        AccessCtx {
            pd: self.pd,
            qpn: RESPONDER,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; 4096];
        self.mem
            .read(
                self.ctx(),
                self.region.rkey,
                self.region.iova,
                &mut v,
                Access::REMOTE_READ,
            )
            .unwrap();
        v
    }

    fn fill(&self, bytes: &[u8]) {
        self.mem
            .write(
                self.ctx(),
                self.region.rkey,
                self.region.iova,
                bytes,
                Access::REMOTE_WRITE,
            )
            .unwrap();
    }

    fn healthy(&self) {
        assert_eq!(self.qp.state(), QpState::Rts, "the QP must stay connected");
    }
}

fn is_rnr_at(out: &[Out], psn: u32) -> bool {
    out.len() == 1
        && out[0].0 == OpKind::Ack
        && out[0].1 == Psn::new(psn)
        && matches!(out[0].2, Some(Syndrome::RnrNak { .. }))
}

fn is_ack_at(out: &[Out], psn: u32) -> bool {
    out.last().is_some_and(|o| {
        o.0 == OpKind::Ack && o.1 == Psn::new(psn) && matches!(o.2, Some(Syndrome::Ack { .. }))
    })
}

/// A SEND whose receive buffer is suspended after its first packet: the next packet draws an
/// RNR NAK (the message stays in progress in its receive), and after resume the retried
/// packets complete it with every byte in place. Before, the second packet completed the
/// receive with LOC_PROT_ERR and a fatal NAK tore the connection down.
#[test]
fn a_send_suspended_mid_message_waits_and_completes_after_resume() {
    let mut r = responder();
    let sge = [Sge {
        addr: r.region.iova,
        length: 4096,
        lkey: r.region.lkey,
    }];
    r.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &sge,
    })
    .unwrap();
    let part = |k: u8| vec![k; MTU];
    let out = r.inject(request(Opcode::RC_SEND_FIRST, EPSN), &part(1));
    assert!(is_ack_at(&out, EPSN), "{out:?}");
    r.mem.suspend_mr(r.region.lkey).unwrap();
    for _ in 0..3 {
        let out = r.inject(request(Opcode::RC_SEND_MIDDLE, EPSN + 1), &part(2));
        assert!(is_rnr_at(&out, EPSN + 1), "{out:?}");
        assert!(r.qp.poll_recv_completion().is_none());
        r.healthy();
    }
    r.mem.resume_mr(r.region.lkey, None).unwrap();
    let out = r.inject(request(Opcode::RC_SEND_MIDDLE, EPSN + 1), &part(2));
    assert!(is_ack_at(&out, EPSN + 1), "{out:?}");
    let out = r.inject(request(Opcode::RC_SEND_LAST, EPSN + 2), &part(3));
    assert!(is_ack_at(&out, EPSN + 2), "{out:?}");
    let wc = r.qp.poll_recv_completion().expect("the receive completes");
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (9, WcStatus::Success, WcOpcode::Recv, 3 * MTU as u32)
    );
    let b = r.bytes();
    assert!(b[..MTU].iter().all(|&x| x == 1));
    assert!(b[MTU..2 * MTU].iter().all(|&x| x == 2));
    assert!(b[2 * MTU..3 * MTU].iter().all(|&x| x == 3));
    r.healthy();
}

/// A READ response stream from a region suspended after the request: the stream stops with an
/// RNR NAK at its next PSN (no error, nothing from the suspended region), a repeat of the READ
/// while the region is still suspended draws an RNR NAK too (the requester waits as
/// `rnr_retry` allows instead of spending its timeouts: it used to be dropped silently, and a
/// suspension longer than seven timeouts failed the READ with RETRY_EXC_ERR), and the repeat
/// after resume is served with the region's bytes.
#[test]
fn a_read_from_a_suspended_region_is_served_after_resume() {
    let mut r = responder();
    r.fill(&[0x77; 4096]);
    let mut h = request(Opcode::RC_READ_REQUEST, EPSN);
    h.reth = Some(RethRepr {
        va: r.region.iova,
        rkey: r.region.rkey,
        dma_len: 2 * MTU as u32,
    });
    // Suspended between the request and its responses.
    let pkt = Packet {
        hdr: h,
        payload: &[],
        icrc: 0,
    };
    r.qp.handle_packet(0, &pkt, &r.mem, None);
    r.mem.suspend_mr(r.region.lkey).unwrap();
    let out = r.drain();
    assert!(
        is_rnr_at(&out, EPSN),
        "nothing is read from a suspended region, nothing fails, the requester waits: {out:?}"
    );
    r.healthy();
    for _ in 0..3 {
        let out = r.inject(h, &[]);
        assert!(is_rnr_at(&out, EPSN), "a repeat while suspended: {out:?}");
        r.healthy();
    }
    r.mem.resume_mr(r.region.lkey, None).unwrap();
    // The requester times out and asks again (a duplicate of the READ at its PSN).
    let out = r.inject(h, &[]);
    let data: Vec<u8> = out
        .iter()
        .filter(|o| o.0 == OpKind::ReadResponse)
        .flat_map(|o| o.3.clone())
        .collect();
    assert_eq!(data, vec![0x77; 2 * MTU], "{out:?}");
    r.healthy();
}

/// An atomic on a suspended region draws an RNR NAK and executes (once) on the retry after
/// resume.
#[test]
fn an_atomic_on_a_suspended_region_waits_and_executes_once() {
    let mut r = responder();
    r.fill(&40u64.to_le_bytes());
    let mut h = request(Opcode::RC_FETCH_ADD, EPSN);
    h.atomic_eth = Some(AtomicEthRepr {
        va: r.region.iova,
        rkey: r.region.rkey,
        swap_add: 2,
        compare: 0,
    });
    r.mem.suspend_mr(r.region.lkey).unwrap();
    let out = r.inject(h, &[]);
    assert!(is_rnr_at(&out, EPSN), "{out:?}");
    r.healthy();
    r.mem.resume_mr(r.region.lkey, None).unwrap();
    let out = r.inject(h, &[]);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, OpKind::AtomicAck);
    // A retransmission of the same atomic is answered from the replay cache.
    let again = r.inject(h, &[]);
    assert!(again.iter().all(|o| o.0 == OpKind::AtomicAck), "{again:?}");
    assert_eq!(u64::from_le_bytes(r.bytes()[..8].try_into().unwrap()), 42);
    r.healthy();
}

/// The region's keys (its own, or a window bound to it), as the engine names them.
macro_rules! names {
    ($r:expr) => {
        &|k: u32| $r.mem.key_reaches_region(k, $r.region.lkey)
    };
}

fn is_nak_at(out: &[Out], psn: u32, code: softrdma::wire::NakCode) -> bool {
    out.len() == 1
        && out[0].0 == OpKind::Ack
        && out[0].1 == Psn::new(psn)
        && out[0].2 == Some(Syndrome::Nak(code))
}

/// A WRITE in progress when its region goes: the QP uses the region, ends with a remote access
/// error NAK at the expected PSN (the message's next packet), and NAKs that packet again when
/// it comes (the requester may not have sent it when the first NAK arrived); other PSNs draw
/// nothing.
#[test]
fn a_write_cut_short_by_an_invalidation_ends_with_a_nak_at_its_next_packet() {
    use softrdma::wire::NakCode;
    let mut r = responder();
    let unrelated = |_k: u32| false;
    assert!(!r.qp.uses_region(names!(r)), "an idle QP uses nothing");
    let mut h = request(Opcode::RC_WRITE_FIRST, EPSN);
    h.reth = Some(RethRepr {
        va: r.region.iova,
        rkey: r.region.rkey,
        dma_len: 3 * MTU as u32,
    });
    let out = r.inject(h, &vec![1u8; MTU]);
    assert!(is_ack_at(&out, EPSN), "{out:?}");
    assert!(r.qp.uses_region(names!(r)));
    assert!(!r.qp.uses_region(&unrelated));
    let nak = r.qp.access_violation(names!(r));
    assert!(nak);
    assert_eq!(r.qp.state(), QpState::Err);
    let out = r.drain();
    assert!(
        is_nak_at(&out, EPSN + 1, NakCode::RemoteAccessError),
        "{out:?}"
    );
    // The next packet of the message draws the NAK again; a stray PSN does not.
    let out = r.inject(request(Opcode::RC_WRITE_MIDDLE, EPSN + 2), &vec![2u8; MTU]);
    assert!(out.is_empty(), "{out:?}");
    let out = r.inject(request(Opcode::RC_WRITE_MIDDLE, EPSN + 1), &vec![2u8; MTU]);
    assert!(
        is_nak_at(&out, EPSN + 1, NakCode::RemoteAccessError),
        "{out:?}"
    );
    assert!(
        r.bytes()[MTU..].iter().all(|&x| x == 0),
        "nothing placed after the invalidation"
    );
    // A QP in error uses nothing any more.
    assert!(!r.qp.uses_region(names!(r)));
}

/// A SEND in progress into a receive buffer of the region: remote operational error NAK, and
/// the receive in progress completes (flushed) instead of vanishing with the message.
#[test]
fn a_send_cut_short_by_an_invalidation_flushes_its_receive() {
    use softrdma::wire::NakCode;
    let mut r = responder();
    let sge = [Sge {
        addr: r.region.iova,
        length: 4096,
        lkey: r.region.lkey,
    }];
    for id in [7, 8] {
        r.qp.post_recv(&RecvWr {
            wr_id: id,
            sg_list: &sge,
        })
        .unwrap();
    }
    let out = r.inject(request(Opcode::RC_SEND_FIRST, EPSN), &vec![1u8; MTU]);
    assert!(is_ack_at(&out, EPSN), "{out:?}");
    assert!(r.qp.uses_region(names!(r)));
    assert!(r.qp.access_violation(names!(r)));
    let out = r.drain();
    assert!(
        is_nak_at(&out, EPSN + 1, NakCode::RemoteOperationalError),
        "{out:?}"
    );
    let wcs: Vec<_> = std::iter::from_fn(|| r.qp.poll_recv_completion())
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(wcs, [(7, WcStatus::WrFlushErr), (8, WcStatus::WrFlushErr)]);
}

/// A READ response stream out of the region, and one stopped while the region was suspended:
/// the QP uses the region until a repeat of the READ is answered, and the invalidation NAKs
/// the stream's next response PSN (inside the READ's range, which the requester sent).
#[test]
fn a_read_stream_cut_short_by_an_invalidation_ends_with_a_nak_in_its_range() {
    use softrdma::wire::NakCode;
    for stopped in [false, true] {
        let mut r = responder();
        r.read(EPSN, 0, 4 * MTU as u32);
        let mut first = 0;
        if stopped {
            r.mem.suspend_mr(r.region.lkey).unwrap();
            let out = r.drain();
            assert!(out.iter().all(|o| o.0 != OpKind::ReadResponse), "{out:?}");
        } else {
            // One response out, the rest queued.
            let len = r.qp.poll_transmit(0, &r.mem, &mut r.buf).unwrap();
            assert_eq!(
                Packet::parse(&r.buf[..len]).unwrap().hdr.bth.psn,
                Psn::new(EPSN)
            );
            first = 1;
        }
        assert!(r.qp.uses_region(names!(r)), "stopped {stopped}");
        assert!(r.qp.access_violation(names!(r)));
        let out = r.drain();
        assert!(
            is_nak_at(&out, EPSN + first, NakCode::RemoteAccessError),
            "stopped {stopped}: {out:?}"
        );
    }
}

/// The NAK that ends a READ stream cut short may be lost like any packet: the requester then
/// times out and resends the READ from the first response it is missing, and the QP, in the
/// error state by then, must answer that too (with the NAK at the resent request's PSN), or
/// the requester retries into silence until RETRY_EXC_ERR instead of REM_ACCESS_ERR.
#[test]
fn a_read_resent_after_its_streams_nak_was_lost_draws_the_nak_again() {
    use softrdma::rc::QpAttrMask;
    use softrdma::wire::NakCode;
    let mut r = responder();
    r.read(EPSN, 0, 4 * MTU as u32);
    // Two responses out, two still queued.
    for k in 0..2 {
        let len = r.qp.poll_transmit(0, &r.mem, &mut r.buf).unwrap();
        assert_eq!(
            Packet::parse(&r.buf[..len]).unwrap().hdr.bth.psn,
            Psn::new(EPSN + k)
        );
    }
    assert!(r.qp.access_violation(names!(r)));
    let out = r.drain();
    assert!(
        is_nak_at(&out, EPSN + 2, NakCode::RemoteAccessError),
        "{out:?}"
    );
    let err = QpAttr {
        qp_state: QpState::Err,
        ..*r.qp.attr()
    };
    r.qp.modify(&err, QpAttrMask::STATE).unwrap();
    r.drain();
    // That NAK was lost, and so was the second response: the requester resends the READ
    // from the second response's PSN, for the rest of the bytes.
    r.read(EPSN + 1, MTU as u64, 3 * MTU as u32);
    let out = r.drain();
    assert!(
        is_nak_at(&out, EPSN + 1, NakCode::RemoteAccessError),
        "the resent READ got no NAK: {out:?}"
    );
    // A request after the remembered PSN is not this stream's: nothing answers it.
    r.read(EPSN + 9, 0, MTU as u32);
    assert!(r.drain().is_empty());
}
