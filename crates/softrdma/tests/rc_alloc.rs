//! No heap allocation per packet on the steady-state path: a counting global allocator
//! watches two QPs exchange SEND, WRITE, WRITE with immediate, READ and Fetch&Add traffic
//! (segmented, acknowledged, completed) after a warm-up; the count must stay at zero. Only
//! the test's own thread is counted (the whole exchange runs on it): the test harness's other
//! threads may allocate at any time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};

use softrdma::mem::{Access, AccessCtx, AccessError, AtomicOp, Invalidator, MemoryAccess};
use softrdma::rc::{Mtu, Qp, QpAttr, QpCap, QpInit, RecvWr, SendWr, Sge, WcStatus, WrOpcode};
use softrdma::wire::{AddressVector, IcrcContext, Packet};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the thread whose allocations are counted (a const-initialised `Cell`, so reading
    /// it never allocates).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// One flat buffer per host; every key names all of it.
struct Flat(RefCell<Vec<u8>>);

impl Flat {
    fn range(&self, iova: u64, len: usize) -> Result<std::ops::Range<usize>, AccessError> {
        let s = iova as usize;
        if s + len > self.0.borrow().len() {
            return Err(AccessError::OutOfBounds {
                key: 1,
                iova,
                len: len as u64,
            });
        }
        Ok(s..s + len)
    }
}

impl MemoryAccess for Flat {
    fn check(
        &self,
        _: AccessCtx,
        _: u32,
        iova: u64,
        len: u64,
        _: Access,
    ) -> Result<(), AccessError> {
        self.range(iova, len as usize).map(|_| ())
    }
    fn write(
        &self,
        _: AccessCtx,
        _: u32,
        iova: u64,
        d: &[u8],
        _: Access,
    ) -> Result<(), AccessError> {
        let r = self.range(iova, d.len())?;
        self.0.borrow_mut()[r].copy_from_slice(d);
        Ok(())
    }
    fn read(
        &self,
        _: AccessCtx,
        _: u32,
        iova: u64,
        o: &mut [u8],
        _: Access,
    ) -> Result<(), AccessError> {
        let r = self.range(iova, o.len())?;
        o.copy_from_slice(&self.0.borrow()[r]);
        Ok(())
    }
    fn atomic(&self, _: AccessCtx, _: u32, iova: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let r = self.range(iova, 8)?;
        let mut b = self.0.borrow_mut();
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[r.clone()]);
        let v = u64::from_ne_bytes(a);
        let n = match op {
            AtomicOp::FetchAdd { add } => v.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } => {
                if v == compare {
                    swap
                } else {
                    v
                }
            }
        };
        b[r].copy_from_slice(&n.to_ne_bytes());
        Ok(v)
    }
    fn invalidate(&self, _: AccessCtx, _: u32, _: Invalidator) -> Result<(), AccessError> {
        Ok(())
    }
    fn bind_mw(&self, _: AccessCtx, _: softrdma::mem::MwBind) -> Result<(), AccessError> {
        Ok(())
    }
}

fn connect(q: &mut Qp, local: Ipv4Addr, remote: Ipv4Addr, dest: u32, psn: (u32, u32)) {
    q.connect(&QpAttr {
        qp_access_flags: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        av: Some(AddressVector::from_context(IcrcContext::v4(
            local,
            remote,
            0xc000 | q.qp_num() as u16,
        ))),
        path_mtu: Mtu::Mtu1024,
        rq_psn: psn.1,
        sq_psn: psn.0,
        max_rd_atomic: 8,
        max_dest_rd_atomic: 8,
        dest_qp_num: dest,
        ..QpAttr::default()
    })
    .unwrap();
}

struct Link {
    /// Packet buffers, allocated once.
    bufs: Vec<Vec<u8>>,
    free: Vec<usize>,
    /// (to b?, buffer, length)
    queue: VecDeque<(bool, usize, usize)>,
    tmp: Vec<u8>,
}

impl Link {
    fn pump(&mut self, now: u64, a: &mut Qp, b: &mut Qp, ma: &Flat, mb: &Flat) {
        for to_b in [true, false] {
            let (q, m) = if to_b { (&mut *a, ma) } else { (&mut *b, mb) };
            while let Some(n) = q.poll_transmit(now, m, &mut self.tmp) {
                let i = self.free.pop().expect("enough packet buffers");
                self.bufs[i][..n].copy_from_slice(&self.tmp[..n]);
                self.queue.push_back((to_b, i, n));
            }
        }
    }
    fn deliver(&mut self, now: u64, a: &mut Qp, b: &mut Qp, ma: &Flat, mb: &Flat) -> bool {
        let Some((to_b, i, n)) = self.queue.pop_front() else {
            return false;
        };
        let (src, dst, m) = if to_b {
            (&*a, &mut *b, mb)
        } else {
            (&*b, &mut *a, ma)
        };
        let ctx = src.attr().av.unwrap();
        let p = Packet::parse_verified(ctx.prefix(), &self.bufs[i][..n]).expect("valid packet");
        dst.handle_packet(now, &p, m, None);
        self.free.push(i);
        true
    }
}

#[test]
fn steady_state_allocates_nothing_per_packet() {
    let (ia, ib) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCap::default()
    };
    let mut a = Qp::new(QpInit {
        qp_num: 0x11,
        pd: 1,
        cap,
        srq: None,
        sq_sig_all: false,
        qp_type: Default::default(),
    })
    .unwrap();
    let mut b = Qp::new(QpInit {
        qp_num: 0x22,
        pd: 1,
        cap,
        srq: None,
        sq_sig_all: false,
        qp_type: Default::default(),
    })
    .unwrap();
    connect(&mut a, ia, ib, 0x22, (0xff_ff00, 77));
    connect(&mut b, ib, ia, 0x11, (77, 0xff_ff00));
    let (ma, mb) = (
        Flat(RefCell::new(vec![0; 1 << 20])),
        Flat(RefCell::new(vec![0; 1 << 20])),
    );
    let mut link = Link {
        bufs: (0..1024).map(|_| vec![0u8; 1100]).collect(),
        free: (0..1024).collect(),
        queue: VecDeque::with_capacity(1024),
        tmp: vec![0u8; a.max_packet_len()],
    };
    let sge = [Sge {
        addr: 0,
        length: 20_000,
        lkey: 1,
    }];
    let small = [Sge {
        addr: 0x80000,
        length: 8,
        lkey: 1,
    }];
    let rsge = [Sge {
        addr: 0x40000,
        length: 20_000,
        lkey: 1,
    }];
    let ops = [
        WrOpcode::Send,
        WrOpcode::RdmaWrite {
            remote_addr: 0x10000,
            rkey: 1,
        },
        WrOpcode::RdmaWriteWithImm {
            remote_addr: 0x20000,
            rkey: 1,
            imm: 5,
        },
        WrOpcode::RdmaRead {
            remote_addr: 0x30000,
            rkey: 1,
        },
        WrOpcode::AtomicFetchAndAdd {
            remote_addr: 0x90000,
            rkey: 1,
            add: 1,
        },
    ];
    let (mut now, mut packets, mut completions) = (0u64, 0u64, 0u64);
    let mut round = |count: bool, packets: &mut u64, completions: &mut u64| {
        for (i, op) in ops.iter().enumerate() {
            let sg: &[Sge] = if op.is_atomic() { &small } else { &sge };
            if matches!(op, WrOpcode::Send | WrOpcode::RdmaWriteWithImm { .. }) {
                b.post_recv(&RecvWr {
                    wr_id: i as u64,
                    sg_list: &rsge,
                })
                .unwrap();
            }
            a.post_send(&SendWr::new(i as u64, *op).sg(sg)).unwrap();
        }
        loop {
            now += 1_000;
            link.pump(now, &mut a, &mut b, &ma, &mb);
            if !link.deliver(now, &mut a, &mut b, &ma, &mb) {
                break;
            }
            *packets += u64::from(count);
        }
        assert_eq!(
            a.send_queue_len(),
            0,
            "{:?} {:?}",
            a.counters(),
            b.counters()
        );
        while let Some(wc) = a.poll_completion().or_else(|| b.poll_completion()) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            *completions += u64::from(count);
        }
    };
    // Warm-up: queues reach their working capacity.
    for _ in 0..20 {
        round(false, &mut packets, &mut completions);
    }
    COUNTED.with(|c| c.set(true));
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..200 {
        round(true, &mut packets, &mut completions);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    COUNTED.with(|c| c.set(false));
    println!("{packets} packets, {completions} completions, {allocs} heap allocations");
    assert!(packets > 10_000, "{packets}");
    assert_eq!(completions, 200 * 7);
    assert_eq!(allocs, 0, "heap allocations on the steady-state path");
}
