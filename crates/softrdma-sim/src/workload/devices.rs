//! A seeded workload over whole devices ([`DeviceNet`]): two devices, a reliable connection
//! each way, random WRITEs, SENDs (some with immediate data), READs and Fetch&Adds of
//! payloads that are lent from registered memory when large, under the network's faults.
//!
//! Checked: every work request completes successfully and exactly once; a receive completion
//! finds every WRITE posted before its SEND on that QP already placed (checked at the moment
//! the completion is polled); at the end every byte written, sent and read is the source's
//! and every Fetch&Add returned a distinct earlier value of the counter, which ends at the sum.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use softrdma::verbs::{
    Access, Cq, Device, Mr, Mtu, Pd, Qp, QpAttr, QpInitAttr, RecvWr, SendFlags, SendWr, WcOpcode,
    WcStatus, WorkCompletion, WrOpcode,
};

use crate::{DeviceNet, DeviceNetStats, Faults, Rng};

/// Bytes of each side's source, WRITE target and READ target regions.
const REGION: usize = 256 * 1024;
/// Largest WRITE or READ.
const MAX_RDMA: usize = 64 * 1024;
/// Largest SEND.
const MAX_SEND: usize = 8 * 1024;

/// What one seed did.
#[derive(Clone, Debug, Default)]
pub struct DeviceSeedReport {
    /// The seed.
    pub seed: u64,
    /// Work requests posted (both sides).
    pub ops: usize,
    /// Virtual time the run took.
    pub virtual_ns: u64,
    /// The network's counts.
    pub net: DeviceNetStats,
    /// Packets the devices received and dropped as bad (corrupted).
    pub rx_bad: u64,
    /// Packets whose ICRC matched only for a solved IPv4 identification (split GSO datagrams).
    pub rx_icrc_solved: u64,
    /// Packets sent zero-copy.
    pub tx_zero_copy: u64,
    /// Datagrams the devices sent (a GSO datagram counts once).
    pub datagrams: u64,
}

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    src: Mr,
    /// WRITE target (the peer writes here).
    wdst: Mr,
    /// READ target (this side reads into it).
    rdst: Mr,
    /// Receive buffers.
    recv: Mr,
    /// The Fetch&Add counter (the peer adds to it) and this side's fetched values.
    counter: Mr,
    fetched: Mr,
}

/// One posted operation, for the checks.
#[derive(Clone, Debug)]
enum Op {
    Write {
        src: usize,
        dst: usize,
        len: usize,
    },
    Send {
        src: usize,
        len: usize,
        imm: Option<u32>,
        writes_before: usize,
    },
    Read {
        src: usize,
        dst: usize,
        len: usize,
    },
    Add {
        add: u64,
        slot: usize,
    },
}

fn open_side(net: &mut DeviceNet, ip: Ipv4Addr, rng: &mut Rng) -> Result<Side, String> {
    let e = |x: softrdma::verbs::VerbsError| x.to_string();
    let dev = net.open(IpAddr::V4(ip)).map_err(e)?;
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(4096, None).map_err(e)?;
    let mut attr = QpInitAttr::new(&cq);
    attr.cap.max_send_wr = 256;
    attr.cap.max_recv_wr = 256;
    let qp = pd.create_qp(&attr).map_err(e)?;
    let mut bytes = vec![0u8; REGION];
    rng.fill(&mut bytes);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = pd.reg_buffer(bytes, all).map_err(e)?;
    let wdst = pd.reg_buffer(vec![0u8; REGION], all).map_err(e)?;
    let rdst = pd
        .reg_buffer(vec![0u8; REGION], Access::LOCAL_WRITE)
        .map_err(e)?;
    let recv = pd
        .reg_buffer(vec![0u8; 64 * MAX_SEND], Access::LOCAL_WRITE)
        .map_err(e)?;
    let counter = pd
        .reg_buffer(vec![0u8; 8], Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
        .map_err(e)?;
    let fetched = pd
        .reg_buffer(vec![0u8; 8 * 64], Access::LOCAL_WRITE)
        .map_err(e)?;
    Ok(Side {
        dev,
        _pd: pd,
        cq,
        qp,
        src,
        wdst,
        rdst,
        recv,
        counter,
        fetched,
    })
}

fn connect(a: &Side, b: &Side, mtu: Mtu, (pa, pb): (u32, u32)) -> Result<(), String> {
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut attr = QpAttr {
        path_mtu: mtu,
        qp_access_flags: all,
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        ..QpAttr::default()
    };
    attr.dest_qp_num = b.qp.qp_num();
    attr.sq_psn = pa;
    attr.rq_psn = pb;
    a.qp.connect(b.dev.addr(), &attr)
        .map_err(|e| e.to_string())?;
    attr.dest_qp_num = a.qp.qp_num();
    attr.sq_psn = pb;
    attr.rq_psn = pa;
    b.qp.connect(a.dev.addr(), &attr).map_err(|e| e.to_string())
}

/// Random operations for one side (its peer's receives are posted by the caller).
fn plan(rng: &mut Rng, n: usize) -> Vec<Op> {
    let mut ops = Vec::with_capacity(n);
    let (mut wcur, mut rcur, mut adds, mut writes) = (0usize, 0usize, 0usize, 0usize);
    for _ in 0..n {
        let kind = rng.below(10);
        let op = match kind {
            0..=3 => {
                let len = rng.range(1, MAX_RDMA as u64) as usize;
                if wcur + len > REGION {
                    continue;
                }
                let src = rng.below((REGION - len) as u64 + 1) as usize;
                let op = Op::Write {
                    src,
                    dst: wcur,
                    len,
                };
                wcur += len;
                writes += 1;
                op
            }
            4..=6 => {
                let len = rng.range(0, MAX_SEND as u64) as usize;
                let src = rng.below((REGION - len) as u64 + 1) as usize;
                let imm = rng.chance(0.5).then(|| rng.next_u64() as u32);
                Op::Send {
                    src,
                    len,
                    imm,
                    writes_before: writes,
                }
            }
            7..=8 => {
                let len = rng.range(1, MAX_RDMA as u64) as usize;
                if rcur + len > REGION {
                    continue;
                }
                let src = rng.below((REGION - len) as u64 + 1) as usize;
                let op = Op::Read {
                    src,
                    dst: rcur,
                    len,
                };
                rcur += len;
                op
            }
            _ => {
                if adds == 64 {
                    continue;
                }
                adds += 1;
                Op::Add {
                    add: rng.range(1, 1 << 20),
                    slot: adds - 1,
                }
            }
        };
        ops.push(op);
    }
    ops
}

fn post(s: &Side, peer: &Side, i: usize, op: &Op) -> Result<(), String> {
    let wr_id = i as u64;
    let sge;
    let wr = match *op {
        Op::Write { src, dst, len } => {
            sge = [s.src.sge(src as u64, len as u32)];
            SendWr::new(
                wr_id,
                WrOpcode::RdmaWrite {
                    remote_addr: peer.wdst.iova() + dst as u64,
                    rkey: peer.wdst.rkey(),
                },
            )
            .sg(&sge)
        }
        Op::Send { src, len, imm, .. } => {
            sge = [s.src.sge(src as u64, len as u32)];
            let opcode = match imm {
                Some(imm) => WrOpcode::SendWithImm { imm },
                None => WrOpcode::Send,
            };
            SendWr::new(wr_id, opcode).sg(&sge)
        }
        Op::Read { src, dst, len } => {
            sge = [s.rdst.sge(dst as u64, len as u32)];
            SendWr::new(
                wr_id,
                WrOpcode::RdmaRead {
                    remote_addr: peer.src.iova() + src as u64,
                    rkey: peer.src.rkey(),
                },
            )
            .sg(&sge)
        }
        Op::Add { add, slot } => {
            sge = [s.fetched.sge(8 * slot as u64, 8)];
            SendWr::new(
                wr_id,
                WrOpcode::AtomicFetchAndAdd {
                    remote_addr: peer.counter.iova(),
                    rkey: peer.counter.rkey(),
                    add,
                },
            )
            .sg(&sge)
        }
    };
    s.qp.post_send(&wr.flags(SendFlags::SIGNALED))
        .map_err(|e| format!("post_send {i}: {e}"))
}

/// Check a receive completion against the SEND it completes, and that every WRITE posted
/// before that SEND is placed at the receiver now.
fn check_recv(
    wc: &WorkCompletion,
    sends: &[(usize, Op)],
    ops: &[Op],
    sender: &Side,
    receiver: &Side,
) -> Result<(), String> {
    let k = wc.wr_id as usize;
    let Some((
        _,
        Op::Send {
            src,
            len,
            imm,
            writes_before,
        },
    )) = sends.get(k)
    else {
        return Err(format!("receive completion {k} for no SEND"));
    };
    if wc.status != WcStatus::Success || wc.byte_len as usize != *len || wc.imm_data != *imm {
        return Err(format!("receive {k}: {wc:?}, expected {len} B imm {imm:?}"));
    }
    let want = sender.src.to_vec().map_err(|e| e.to_string())?;
    let got = receiver.recv.to_vec().map_err(|e| e.to_string())?;
    let slot = (k % 64) * MAX_SEND;
    if got[slot..slot + len] != want[*src..src + len] {
        return Err(format!("receive {k}: payload differs"));
    }
    let placed = receiver.wdst.to_vec().map_err(|e| e.to_string())?;
    for op in ops
        .iter()
        .filter(|o| matches!(o, Op::Write { .. }))
        .take(*writes_before)
    {
        if let Op::Write { src, dst, len } = *op
            && placed[dst..dst + len] != want[src..src + len]
        {
            return Err(format!(
                "receive {k} completed before the WRITE at {dst} ({len} B) posted ahead of its SEND was placed"
            ));
        }
    }
    Ok(())
}

/// Run one seed: `n` operations each way over a network with `faults` (and GSO datagrams
/// split with probability `split`).
pub fn run_device_seed(
    seed: u64,
    n: usize,
    faults: Faults,
    split: f64,
) -> Result<DeviceSeedReport, String> {
    let mut rng = Rng::new(seed ^ 0x5eed_de71);
    let mut net = DeviceNet::new(seed, faults);
    net.split = split;
    let a = open_side(&mut net, Ipv4Addr::new(10, 0, 0, 1), &mut rng)?;
    let b = open_side(&mut net, Ipv4Addr::new(10, 0, 0, 2), &mut rng)?;
    let mtu = [Mtu::Mtu1024, Mtu::Mtu4096, Mtu::Mtu256][rng.below(3) as usize];
    let psns = (rng.below(1 << 24) as u32, rng.below(1 << 24) as u32);
    connect(&a, &b, mtu, psns)?;
    let sides = [&a, &b];
    let plans = [plan(&mut rng, n), plan(&mut rng, n)];
    // Receives for each side's peer's SENDs, in order (wr_id: the SEND's index among them).
    let mut sends: [Vec<(usize, Op)>; 2] = [Vec::new(), Vec::new()];
    for (k, p) in plans.iter().enumerate() {
        for (i, op) in p.iter().enumerate() {
            if matches!(op, Op::Send { .. }) {
                let j = sends[k].len();
                let peer = sides[1 - k];
                let sge = [peer.recv.sge(((j % 64) * MAX_SEND) as u64, MAX_SEND as u32)];
                peer.qp
                    .post_recv(&RecvWr {
                        wr_id: j as u64,
                        sg_list: &sge,
                    })
                    .map_err(|e| e.to_string())?;
                sends[k].push((i, op.clone()));
            }
        }
        if sends[k].len() > 64 {
            return Err("more SENDs than receive slots".into());
        }
    }
    for k in 0..2 {
        for (i, op) in plans[k].iter().enumerate() {
            post(sides[k], sides[1 - k], i, op)?;
        }
    }
    let want_sends = [plans[0].len(), plans[1].len()];
    let want_recvs = [sends[1].len(), sends[0].len()];
    let mut done_sends: [HashMap<u64, WorkCompletion>; 2] = [HashMap::new(), HashMap::new()];
    let mut recvs = [0usize; 2];
    let mut failure: Option<String> = None;
    let start = net.now();
    let finished = net.run_until(60_000_000_000, |_| {
        let mut wc = [softrdma::verbs::EMPTY_WC; 32];
        for k in 0..2 {
            loop {
                let got = sides[k].cq.poll(&mut wc);
                for w in &wc[..got] {
                    let r = if w.opcode == WcOpcode::Recv || w.opcode == WcOpcode::RecvRdmaWithImm {
                        recvs[k] += 1;
                        check_recv(w, &sends[1 - k], &plans[1 - k], sides[1 - k], sides[k])
                    } else if w.status != WcStatus::Success {
                        Err(format!("side {k} WR {}: {:?}", w.wr_id, w.status))
                    } else if done_sends[k].insert(w.wr_id, *w).is_some() {
                        Err(format!("side {k} WR {} completed twice", w.wr_id))
                    } else {
                        Ok(())
                    };
                    if let Err(e) = r {
                        failure.get_or_insert(e);
                    }
                }
                if got < wc.len() {
                    break;
                }
            }
        }
        failure.is_some()
            || (0..2).all(|k| done_sends[k].len() == want_sends[k] && recvs[k] == want_recvs[k])
    });
    if let Some(e) = failure {
        return Err(e);
    }
    if !finished {
        return Err(format!(
            "not done after 60 s virtual: sends {}/{} {}/{}, receives {}/{} {}/{}",
            done_sends[0].len(),
            want_sends[0],
            done_sends[1].len(),
            want_sends[1],
            recvs[0],
            want_recvs[0],
            recvs[1],
            want_recvs[1]
        ));
    }
    for k in 0..2 {
        check_final(sides[k], sides[1 - k], &plans[k])?;
    }
    let mut report = DeviceSeedReport {
        seed,
        ops: want_sends[0] + want_sends[1],
        virtual_ns: net.now() - start,
        net: net.stats,
        ..DeviceSeedReport::default()
    };
    for s in sides {
        let c = s.dev.counters();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        report.rx_bad += get(&c.rx_bad);
        report.rx_icrc_solved += get(&c.rx_icrc_solved);
        report.tx_zero_copy += get(&c.tx_zero_copy);
        report.datagrams += get(&c.tx_datagrams);
    }
    Ok(report)
}

/// After the run: what side `s` wrote to, read from and added at `peer` is right.
fn check_final(s: &Side, peer: &Side, ops: &[Op]) -> Result<(), String> {
    let e = |x: softrdma::verbs::VerbsError| x.to_string();
    let src = s.src.to_vec().map_err(e)?;
    let placed = peer.wdst.to_vec().map_err(e)?;
    let read = s.rdst.to_vec().map_err(e)?;
    let peer_src = peer.src.to_vec().map_err(e)?;
    let fetched = s.fetched.to_vec().map_err(e)?;
    let counter = peer.counter.to_vec().map_err(e)?;
    let mut sum = 0u64;
    let mut seen = Vec::new();
    for op in ops {
        match *op {
            Op::Write { src: o, dst, len } if placed[dst..dst + len] != src[o..o + len] => {
                return Err(format!("WRITE to {dst} ({len} B) not placed as sent"));
            }
            Op::Read { src: o, dst, len } if read[dst..dst + len] != peer_src[o..o + len] => {
                return Err(format!("READ into {dst} ({len} B) differs from the source"));
            }
            Op::Add { add, slot } => {
                sum = sum.wrapping_add(add);
                let mut v = [0u8; 8];
                v.copy_from_slice(&fetched[8 * slot..8 * slot + 8]);
                seen.push(u64::from_ne_bytes(v));
            }
            _ => {}
        }
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&counter);
    if u64::from_ne_bytes(v) != sum {
        return Err(format!(
            "counter {} after adds summing to {sum}",
            u64::from_ne_bytes(v)
        ));
    }
    seen.sort_unstable();
    if seen.windows(2).any(|w| w[0] == w[1]) {
        return Err("two Fetch&Adds returned the same value (one executed twice?)".into());
    }
    Ok(())
}
