use super::*;
use proptest::{prop_assert, prop_assert_eq};

fn pair() -> (UdpPort, UdpPort) {
    let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
    (
        UdpPort::bind(lo, PortOptions::default()).unwrap(),
        UdpPort::bind(lo, PortOptions::default()).unwrap(),
    )
}

#[test]
fn batched_send_and_receive() {
    let (a, b) = pair();
    b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut tx = TxBatch::new(8, 8 * 2048);
    for i in 0..8u8 {
        assert!(tx.push(b.local_addr(), &[i; 100], 0));
    }
    assert!(
        !tx.push(b.local_addr(), &[0; 10], 0),
        "a full batch refuses"
    );
    assert_eq!(a.send(&mut tx).unwrap(), 8);
    let mut rx = RxBatch::new(16, MAX_DATAGRAM);
    let mut got = Vec::new();
    while got.len() < 8 {
        let n = b.recv(&mut rx).unwrap();
        for i in 0..n {
            let r = rx.get(i).unwrap();
            assert_eq!(r.src, a.local_addr());
            got.extend(r.segments().map(|s| s.to_vec()));
        }
    }
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d, &vec![i as u8; 100]);
    }
}

#[test]
fn end_datagram_keeps_the_next_packet_out_of_the_last_datagram() {
    let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut tx = TxBatch::new(4, 4096);
    let put = |tx: &mut TxBatch, len: usize, byte: u8| {
        tx.push_packet(dst, 100, |b| {
            b[..len].fill(byte);
            len
        })
        .unwrap()
    };
    assert_eq!(put(&mut tx, 40, 1), (40, 0));
    assert_eq!(
        put(&mut tx, 20, 2),
        (20, 1),
        "a smaller packet joins as a segment"
    );
    tx.end_datagram();
    assert_eq!(
        put(&mut tx, 20, 3),
        (20, 0),
        "after end_datagram it starts one"
    );
    assert_eq!(
        put(&mut tx, 20, 4),
        (20, 1),
        "which the next packet may join again"
    );
    let d = tx.datagrams();
    assert_eq!(d.len(), 2);
    assert_eq!((d[0].1, d[0].2, d[0].0.len()), (40, 2, 60));
    assert_eq!((d[1].1, d[1].2, d[1].0.len()), (20, 2, 40));
    assert_eq!(&d[1].0[..20], &[3u8; 20]);
    tx.clear();
    assert_eq!(put(&mut tx, 40, 5), (40, 0));
    assert_eq!(
        put(&mut tx, 40, 6),
        (40, 1),
        "clear forgets the closed datagrams"
    );
}

#[test]
fn gso_send_arrives_as_segments() {
    let (a, b) = pair();
    b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut data = Vec::new();
    for i in 0..10u8 {
        data.extend_from_slice(&[i; 1000]);
    }
    data.extend_from_slice(&[99; 10]);
    let mut tx = TxBatch::new(1, data.len());
    assert!(tx.push(b.local_addr(), &data, 1000));
    a.send(&mut tx).unwrap();
    let mut rx = RxBatch::new(16, MAX_DATAGRAM);
    let mut segs = Vec::new();
    while segs.len() < 11 {
        let n = b.recv(&mut rx).unwrap();
        for i in 0..n {
            segs.extend(rx.get(i).unwrap().segments().map(|s| s.to_vec()));
        }
    }
    assert_eq!(segs.len(), 11);
    for (i, s) in segs[..10].iter().enumerate() {
        assert_eq!(s, &vec![i as u8; 1000]);
    }
    assert_eq!(segs[10], vec![99; 10]);
}

proptest::proptest! {
    /// Any sequence of arena-only and lent packets, some taken back again: every datagram
    /// holds exactly the packets queued into it, in order, GSO-shaped (all segments but
    /// the last of one size), and the batch accepts a packet whenever it says it has room.
    #[test]
    fn datagrams_hold_exactly_the_packets_pushed(
        ops in proptest::collection::vec(
            (1usize..1200, proptest::option::of((0u64..3000, 1usize..4)), proptest::bool::ANY),
            1..120,
        ),
    ) {
        use crate::mem::{Access, MemoryAccess};
        let (t, mr, ctx, region) = lending_table(4200);
        let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let mut tx = TxBatch::new(8, 8 * 1300);
        let mut g = Gather::default();
        // The model: the packets of each datagram, as bytes.
        let mut model: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut tag = 0u8;
        for (size, lend, pop) in ops {
            if !tx.has_room(1300) {
                let got = tx.datagrams();
                prop_assert_eq!(got.len(), model.len());
                for ((bytes, seg, nseg), want) in got.iter().zip(&model) {
                    prop_assert_eq!(bytes, &want.concat());
                    prop_assert_eq!(usize::from(*nseg), want.len());
                    let seg = usize::from(*seg);
                    for p in &want[..want.len() - 1] {
                        prop_assert_eq!(p.len(), seg);
                    }
                    prop_assert!(want[want.len() - 1].len() <= seg);
                }
                tx.clear();
                model.clear();
            }
            tag = tag.wrapping_add(1);
            // A packet: `size` arena bytes, or a 10-byte header, `pieces` lent pieces
            // of 100 bytes at `at`, and a 6-byte tail.
            let mut want = Vec::new();
            let r = tx.push_packet_gather(dst, 1300, &mut g, |buf, g| match lend {
                Some((at, pieces)) => {
                    buf[..16].fill(tag);
                    for k in 0..pieces {
                        let a = at + 100 * k as u64;
                        let l = t.lend(ctx, mr.lkey, mr.iova + a, 100, Access::NONE);
                        g.push(l.unwrap().unwrap());
                    }
                    g.split = 10;
                    16
                }
                None => {
                    buf[..size].fill(tag);
                    size
                }
            });
            match lend {
                Some((at, pieces)) => {
                    want.extend_from_slice(&[tag; 10]);
                    let a = at as usize;
                    want.extend_from_slice(&region[a..a + 100 * pieces]);
                    want.extend_from_slice(&[tag; 6]);
                }
                None => want.extend(std::iter::repeat_n(tag, size)),
            }
            let (wire, _, k) = r.expect("room was checked");
            prop_assert_eq!(wire, want.len());
            if k == 0 {
                model.push(vec![want]);
            } else {
                prop_assert_eq!(usize::from(k), model.last().unwrap().len());
                model.last_mut().unwrap().push(want);
            }
            if pop && lend.is_none() {
                tx.pop_last_packet(size);
                let last = model.last_mut().unwrap();
                last.pop();
                if last.is_empty() {
                    model.pop();
                }
            }
        }
        let got = tx.datagrams();
        prop_assert_eq!(got.len(), model.len());
        for ((bytes, _, nseg), want) in got.iter().zip(&model) {
            prop_assert_eq!(bytes, &want.concat());
            prop_assert_eq!(usize::from(*nseg), want.len());
        }
        tx.clear();
        // Every loan came back with the batch.
        prop_assert!(t.dereg_mr(mr.lkey).is_ok());
    }
}

/// Packets whose payload is lent from a region travel as arena header, region bytes and
/// arena tail; they coalesce into GSO datagrams with arena-only packets, and taking back
/// an arena-only packet pushed after a lent one leaves the lent one whole.
#[test]
fn lent_payloads_arrive_in_place() {
    use crate::mem::{Access, MemoryAccess};
    let (a, b) = pair();
    b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let (t, mr, ctx, region) = lending_table(4000);
    let dst = b.local_addr();
    let mut tx = TxBatch::new(4, 8192);
    let mut g = Gather::default();
    // A packet: 10 header bytes, `lend` region bytes at `at` (or none), 6 tail bytes.
    let mut push = |tx: &mut TxBatch, tag: u8, lend: Option<u64>| {
        tx.push_packet_gather(dst, 1100, &mut g, |buf, g| match lend {
            Some(at) => {
                buf[..16].fill(tag);
                let l = t.lend(ctx, mr.lkey, mr.iova + at, 1000, Access::NONE);
                g.push(l.unwrap().unwrap());
                g.split = 10;
                16
            }
            None => {
                buf[..1016].fill(tag);
                1016
            }
        })
        .unwrap()
    };
    assert_eq!(push(&mut tx, 1, None), (1016, 1016, 0));
    assert_eq!(push(&mut tx, 2, Some(0)), (1016, 16, 1));
    assert_eq!(push(&mut tx, 3, Some(2500)), (1016, 16, 2));
    // An arena-only packet taken back again (as a held acknowledgement is).
    assert_eq!(push(&mut tx, 4, None), (1016, 1016, 3));
    tx.pop_last_packet(1016);
    assert_eq!(tx.packets(), 3);
    // A short last segment.
    let r = tx.push_packet_gather(dst, 1100, &mut g, |buf, _| {
        buf[..300].fill(5);
        300
    });
    assert_eq!(r, Some((300, 300, 3)));
    assert_eq!((tx.len(), tx.packets()), (1, 4));
    a.send(&mut tx).unwrap();
    assert_eq!(tx.packets(), 0, "a sent batch is empty");

    let with_lent = |tag: u8, at: usize| -> Vec<u8> {
        [&[tag; 10][..], &region[at..at + 1000], &[tag; 6][..]].concat()
    };
    let want = [
        vec![1u8; 1016],
        with_lent(2, 0),
        with_lent(3, 2500),
        vec![5u8; 300],
    ];
    let mut rx = RxBatch::new(16, MAX_DATAGRAM);
    let mut segs = Vec::new();
    while segs.len() < want.len() {
        let n = b.recv(&mut rx).unwrap();
        for i in 0..n {
            segs.extend(rx.get(i).unwrap().segments().map(|s| s.to_vec()));
        }
    }
    assert_eq!(segs.len(), want.len());
    for (i, (got, want)) in segs.iter().zip(&want).enumerate() {
        assert!(got == want, "segment {i} differs");
    }
    // Every loan was given back with the batch: deregistration does not wait.
    let back: Vec<u8> = t.dereg_mr(mr.lkey).unwrap().downcast().unwrap();
    assert_eq!(back, region);
}

/// A [`MemoryAccess`] that counts lends (and delegates everything to a table).
struct CountingLends<'a> {
    t: &'a crate::mem::MemoryTable,
    lends: std::cell::Cell<usize>,
}

impl crate::mem::MemoryAccess for CountingLends<'_> {
    fn check(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        i: u64,
        l: u64,
        a: crate::mem::Access,
    ) -> Result<(), crate::mem::AccessError> {
        self.t.check(c, k, i, l, a)
    }
    fn write(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        i: u64,
        d: &[u8],
        a: crate::mem::Access,
    ) -> Result<(), crate::mem::AccessError> {
        self.t.write(c, k, i, d, a)
    }
    fn read(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        i: u64,
        o: &mut [u8],
        a: crate::mem::Access,
    ) -> Result<(), crate::mem::AccessError> {
        self.t.read(c, k, i, o, a)
    }
    fn lend(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        i: u64,
        l: u64,
        a: crate::mem::Access,
    ) -> Result<Option<Lent>, crate::mem::AccessError> {
        self.lends.set(self.lends.get() + 1);
        self.t.lend(c, k, i, l, a)
    }
    fn atomic(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        i: u64,
        op: crate::mem::AtomicOp,
    ) -> Result<u64, crate::mem::AccessError> {
        self.t.atomic(c, k, i, op)
    }
    fn invalidate(
        &self,
        c: crate::mem::AccessCtx,
        k: u32,
        by: crate::mem::Invalidator,
    ) -> Result<(), crate::mem::AccessError> {
        self.t.invalidate(c, k, by)
    }
    fn bind_mw(
        &self,
        c: crate::mem::AccessCtx,
        b: crate::mem::MwBind,
    ) -> Result<(), crate::mem::AccessError> {
        self.t.bind_mw(c, b)
    }
}

/// A table with one owned region of `len` pattern bytes: the table, the region, a context
/// that may use it, and the bytes.
fn lending_table(
    len: u32,
) -> (
    std::sync::Arc<crate::mem::MemoryTable>,
    crate::mem::MrInfo,
    crate::mem::AccessCtx,
    Vec<u8>,
) {
    use crate::mem::{Access, AccessCtx, MemConfig, MemSource, MemoryTable, PinMode};
    let t = MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        ..MemConfig::default()
    })
    .unwrap();
    let pd = t.alloc_pd().unwrap();
    let region: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mr = t
        .reg_mr(
            pd,
            MemSource::owned(region.clone()),
            Access::LOCAL_WRITE,
            None,
        )
        .unwrap();
    (std::sync::Arc::new(t), mr, AccessCtx { pd, qpn: 1 }, region)
}

/// Deregister `lkey` of `t`, failing the test if that waits for more than five seconds
/// (a loan that was never given back).
fn dereg_promptly(t: &std::sync::Arc<crate::mem::MemoryTable>, lkey: u32) -> Vec<u8> {
    let (done, wait) = std::sync::mpsc::channel();
    let t2 = std::sync::Arc::clone(t);
    std::thread::spawn(move || {
        let back: Vec<u8> = t2.dereg_mr(lkey).unwrap().downcast().unwrap();
        let _ = done.send(back);
    });
    wait.recv_timeout(std::time::Duration::from_secs(5))
        .expect("deregistration waited for a loan nobody holds")
}

/// The packets of one message cut their payloads from the lend its first packet made of
/// the rest of the entry, while the batch holds that lend; a new epoch (the batch sent),
/// another message, a forgotten anchor or a failed packet each make the next packet lend
/// again, and every byte still comes from the right place.
#[test]
fn one_lend_serves_the_packets_of_a_message_while_the_batch_holds_it() {
    use crate::mem::Access;
    let (t, mr, ctx, region) = lending_table(8000);
    let mem = CountingLends {
        t: &t,
        lends: std::cell::Cell::new(0),
    };
    let dst: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut tx = TxBatch::new(8, 8 * 1100);
    let mut g = Gather::default();
    // Packet `k` of message `tag`: a 4-byte header, 1000 bytes at `at`, the entry going on
    // to `end`; `fail` drops the payload as a failed build does.
    let push = |tx: &mut TxBatch, g: &mut Gather, tag: u64, at: u64, end: u64, fail| {
        let r = tx.push_packet_gather(dst, 1100, g, |buf, g| {
            buf[..4].fill(tag as u8);
            let ahead = end - at - 1000;
            let piece = crate::rc::gather::Piece {
                tag,
                actx: ctx,
                key: mr.lkey,
                iova: mr.iova + at,
                len: 1000,
                ahead,
                access: Access::NONE,
            };
            let ok = g.lend(&mem, piece);
            assert_eq!(ok, Ok(true));
            if fail {
                g.clear();
                return 0;
            }
            g.split = 4;
            4
        });
        r.unwrap().0
    };
    let want = |tag: u8, at: usize| [&[tag; 4][..], &region[at..at + 1000]].concat();
    // Message 1: four packets, one lend (of all 4000 bytes).
    for k in 0..4 {
        assert_eq!(push(&mut tx, &mut g, 1, k * 1000, 4000, false), 1004);
    }
    assert_eq!(mem.lends.get(), 1);
    // Message 2, from the same region: its own lend.
    assert_eq!(push(&mut tx, &mut g, 2, 4000, 6000, false), 1004);
    assert_eq!(mem.lends.get(), 2);
    assert_eq!(push(&mut tx, &mut g, 2, 5000, 6000, false), 1004);
    assert_eq!(mem.lends.get(), 2);
    let got = tx.datagrams();
    let bytes: Vec<u8> = got.iter().flat_map(|d| d.0.clone()).collect();
    let expect: Vec<u8> = [
        (1, 0),
        (1, 1000),
        (1, 2000),
        (1, 3000),
        (2, 4000),
        (2, 5000),
    ]
    .iter()
    .flat_map(|&(tag, at)| want(tag, at))
    .collect();
    assert!(
        bytes == expect,
        "the datagrams carry the region's bytes in order"
    );
    // The batch goes out (here: is cleared): the next packet of message 2 lends again.
    tx.clear();
    assert_eq!(push(&mut tx, &mut g, 2, 5000, 6000, false), 1004);
    assert_eq!(mem.lends.get(), 3);
    // A new run of the engine forgets the anchor.
    g.forget_anchor();
    assert_eq!(push(&mut tx, &mut g, 2, 5000, 6000, false), 1004);
    assert_eq!(mem.lends.get(), 4);
    // A packet whose build fails gives its lend (the anchor's) back at once.
    tx.clear();
    assert_eq!(push(&mut tx, &mut g, 3, 6000, 8000, true), 0);
    assert_eq!(mem.lends.get(), 5);
    assert!(tx.is_empty());
    assert!(g.is_empty());
    let back = dereg_promptly(&t, mr.lkey);
    assert_eq!(back, region);
}

/// When the rest of the entry cannot be lent, the piece alone is (and fails as a lend of
/// it does); no anchor is kept, and nothing lent outlives the batch.
#[test]
fn a_piece_is_lent_alone_when_the_rest_of_its_entry_cannot_be() {
    use crate::mem::{Access, AccessError};
    let (t, mr, ctx, region) = lending_table(3000);
    let mem = CountingLends {
        t: &t,
        lends: std::cell::Cell::new(0),
    };
    let mut g = Gather::default();
    // The entry claims 5000 bytes; the region has 3000.
    for k in 0..3u64 {
        let ahead = 5000 - (k + 1) * 1000;
        let r = g.lend(
            &mem,
            crate::rc::gather::Piece {
                tag: 7,
                actx: ctx,
                key: mr.lkey,
                iova: mr.iova + k * 1000,
                len: 1000,
                ahead,
                access: Access::NONE,
            },
        );
        assert_eq!(r, Ok(true), "packet {k}");
        assert_eq!(g.lent_bytes(), 1000);
        g.clear();
    }
    // Two lends per packet: the whole rest, refused, then the piece.
    assert_eq!(mem.lends.get(), 6);
    let r = g.lend(
        &mem,
        crate::rc::gather::Piece {
            tag: 7,
            actx: ctx,
            key: mr.lkey,
            iova: mr.iova + 3000,
            len: 1000,
            ahead: 1000,
            access: Access::NONE,
        },
    );
    // The piece itself lies outside the region: the error of a lend of it.
    let want = AccessError::OutOfBounds {
        key: mr.lkey,
        iova: mr.iova + 3000,
        len: 1000,
    };
    assert_eq!(r, Err(want));
    assert!(g.is_empty());
    assert_eq!(dereg_promptly(&t, mr.lkey), region);
}
