//! Packets whose payload is lent (zero-copy) are, once the kernel has put the payload in
//! place, the same bytes as packets built with the payload copied: every opcode position,
//! immediate data, several scatter/gather entries, pad, forced AckReq. Two identical QP pairs
//! over real memory tables, one transmitting with a gather and one without.

use std::net::Ipv4Addr;

use softrdma::mem::{Access, MemConfig, MemSource, MemoryTable, PinMode};
use softrdma::rc::{Gather, Mtu, Qp, QpAttr, QpCap, QpInit, SendFlags, SendWr, Sge, WrOpcode};
use softrdma::wire::{AddressVector, IcrcContext, Opcode, Packet};

const IA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const IB: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A requester QP connected to a peer that is never built, over a table holding one source
/// region of 64 KiB (a byte pattern) on a's side.
struct Side {
    mem: MemoryTable,
    qp: Qp,
    lkey: u32,
    iova: u64,
    /// The bytes of a raw source region (dropped after the table).
    _raw: Option<Vec<u8>>,
}

fn side() -> Side {
    side_of(false)
}

/// With `raw`, the source region is raw memory (staged for sending, not lent in place).
fn side_of(raw: bool) -> Side {
    let mem = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = mem.alloc_pd().unwrap();
    let mut pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    let (src, keep) = if raw {
        // SAFETY: the vector's buffer outlives the table (dropped after it, in `Side`).
        let src = unsafe { MemSource::raw(pattern.as_mut_ptr(), pattern.len()) };
        (src, Some(pattern))
    } else {
        (MemSource::owned(pattern), None)
    };
    let mr = mem.reg_mr(pd, src, Access::LOCAL_WRITE, None).unwrap();
    let mut qp = Qp::new(QpInit {
        qp_num: 0x11,
        pd,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 16,
            max_send_sge: 4,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        srq: None,
        sq_sig_all: false,
        qp_type: Default::default(),
    })
    .unwrap();
    qp.set_send_window(1 << 20);
    qp.connect(&QpAttr {
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        av: Some(AddressVector::from_context(IcrcContext::v4(IA, IB, 0xc011))),
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        rq_psn: 7,
        sq_psn: 0xfffff0,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        dest_qp_num: 0x22,
        ..QpAttr::default()
    })
    .unwrap();
    Side {
        mem,
        lkey: mr.lkey,
        iova: mr.iova,
        qp,
        _raw: keep,
    }
}

/// Every packet `s` has ready, copied (`gather` false) or with lent payloads put in place.
/// Also returns how many packets had a lent payload.
fn drain(s: &mut Side, gather: bool) -> (Vec<Vec<u8>>, usize) {
    let mut buf = vec![0u8; 8192];
    let mut g = Gather::default();
    let mut out = Vec::new();
    let mut lent = 0;
    loop {
        let n = if gather {
            s.qp.poll_transmit_gather(0, &s.mem, &mut buf, &mut g, false)
        } else {
            s.qp.poll_transmit(0, &s.mem, &mut buf)
        };
        let Some(n) = n else { break };
        let (pieces, guards) = g.take();
        let mut pkt = Vec::new();
        if pieces.is_empty() {
            pkt.extend_from_slice(&buf[..n]);
        } else {
            lent += 1;
            pkt.extend_from_slice(&buf[..g.split]);
            for p in &pieces {
                let v = p.iovec();
                // SAFETY: the bytes lie in a region the table keeps mapped while `guards`
                // (dropped below) live, and nothing writes them.
                let b = unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) };
                pkt.extend_from_slice(b);
            }
            pkt.extend_from_slice(&buf[g.split..n]);
        }
        drop(guards);
        // Every packet is well formed and its ICRC right.
        let ctx = IcrcContext::v4(IA, IB, 0xc011);
        Packet::parse_verified(&ctx, &pkt).expect("a packet that does not parse or verify");
        out.push(pkt);
    }
    (out, lent)
}

/// The work requests of the test, with scatter/gather entries into `s`'s source region.
fn post_all(s: &mut Side) {
    let (lkey, iova) = (s.lkey, s.iova);
    let sge = |off: u64, len: u32| Sge {
        addr: iova + off,
        length: len,
        lkey,
    };
    let write = WrOpcode::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 0x1234,
    };
    // Unsignaled unless said otherwise: only what asks gets an ACK request.
    let wr = |id, op| SendWr::new(id, op).flags(SendFlags::NONE);
    let one = [sge(3, 5000)];
    let odd = [sge(0, 4097)];
    let two = [sge(100, 1500), sge(9000, 2600)];
    let long = [sge(0, 65536)];
    let wrs = [
        // First, three middles, a short last (pad 0).
        wr(1, write).sg(&one),
        // A last packet with pad.
        wr(2, write).sg(&odd).flags(SendFlags::SIGNALED),
        wr(3, WrOpcode::SendWithImm { imm: 0xabcd }).sg(&one),
        wr(
            4,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: 0x2000,
                rkey: 0x1234,
                imm: 9,
            },
        )
        .sg(&two),
        wr(5, WrOpcode::SendWithInv { rkey: 0x77 }).sg(&two),
        // 64 packets: a middle one asks for an ACK (every ACK_REQ_EVERY packets).
        wr(6, WrOpcode::Send).sg(&long),
    ];
    for w in &wrs {
        s.qp.post_send(w).unwrap();
    }
}

#[test]
fn lent_packets_are_the_bytes_of_copied_ones() {
    same_bytes_lent_as_copied(false);
}

/// Raw memory is not lent where it lies: each message's payload is staged (copied once) and
/// its packets are cut from the copy, with the same bytes on the wire.
#[test]
fn staged_packets_are_the_bytes_of_copied_ones() {
    same_bytes_lent_as_copied(true);
}

fn same_bytes_lent_as_copied(raw: bool) {
    let (mut copied, mut gathered) = (side_of(raw), side_of(raw));
    post_all(&mut copied);
    post_all(&mut gathered);
    let (want, none) = drain(&mut copied, false);
    let (got, lent) = drain(&mut gathered, true);
    assert_eq!(none, 0);
    assert_eq!(want.len(), 5 * 5 + 65536 / 1024);
    assert_eq!(got.len(), want.len());
    // Every packet with at least 1 KiB of payload was lent: all but the five short last ones.
    assert_eq!(lent, want.len() - 5);
    // Middle packets of both kinds were built, one of them with AckReq forced (the 64-packet
    // SEND crosses a multiple of `ACK_REQ_EVERY` packets since the signaled WRITE asked).
    let ctx = IcrcContext::v4(IA, IB, 0xc011);
    let bths: Vec<_> = want
        .iter()
        .map(|p| Packet::parse_verified(&ctx, p).unwrap().hdr.bth)
        .collect();
    let middle = |b: &&softrdma::wire::BthRepr| {
        b.opcode == Opcode::RC_SEND_MIDDLE || b.opcode == Opcode::RC_WRITE_MIDDLE
    };
    assert!(bths.iter().filter(middle).any(|b| b.ack_req));
    assert!(bths.iter().any(|b| b.opcode == Opcode::RC_WRITE_MIDDLE));
    assert!(bths.iter().any(|b| b.opcode == Opcode::RC_SEND_MIDDLE));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "packet {i} differs");
    }
}

/// LOCAL_INV posted behind a SEND whose payload is lent: the QP reports the invalidated key,
/// and waiting on it (what the engine does before that LOCAL_INV's completion reaches the
/// application) lasts until the lent bytes are handed back, i.e. sent. Before, the LOCAL_INV
/// completed while the socket could still read the region's bytes for the SEND: an
/// application reusing the memory at the completion could have its new bytes sent.
#[test]
fn local_inv_completes_only_after_the_lent_bytes_are_sent() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let mut s = side();
    let (lkey, iova) = (s.lkey, s.iova);
    let sge = [Sge {
        addr: iova,
        length: 16384,
        lkey,
    }];
    s.qp.post_send(&SendWr::new(1, WrOpcode::Send).sg(&sge))
        .unwrap();
    s.qp.post_send(&SendWr::new(2, WrOpcode::LocalInv { rkey: lkey }))
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let mut g = Gather::default();
    let mut guards = Vec::new();
    let mut lent = 0;
    while s
        .qp
        .poll_transmit_gather(0, &s.mem, &mut buf, &mut g, false)
        .is_some()
    {
        let (pieces, gd) = g.take();
        lent += usize::from(!pieces.is_empty());
        guards.push(gd);
    }
    assert!(lent > 0, "the SEND's payload was lent");
    assert_eq!(s.qp.pop_invalidated(), Some(lkey), "the LOCAL_INV ran");
    assert_eq!(s.qp.pop_invalidated(), None);
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            s.mem.wait_unlent(lkey);
            done.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::Acquire),
            "the wait ended while the SEND's bytes were still lent"
        );
        drop(guards);
        h.join().unwrap();
        assert!(done.load(Ordering::Acquire));
    });
}
