//! Cost of the lookup on the data path (1 and 2 threads) and of registering+deregistering
//! 4 KiB and 1 GiB regions in both pin modes, against the bare mlock/munlock syscalls measured
//! in the same run. Ends with a ratio table.
//!
//! Run: `cargo bench -p softrdma --bench mem -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use softrdma::mem::*;

const GIB: usize = 1 << 30;

fn table(mode: PinMode) -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: mode,
        ..MemConfig::default()
    })
    .unwrap()
}

fn regdereg(t: &MemoryTable, pd: u32, p: *mut u8, len: usize) {
    // SAFETY: `p..p+len` is a live mapping owned by the benchmark for the whole run.
    let src = unsafe { MemSource::raw(p, len) };
    let mr = t.reg_mr(pd, src, Access::LOCAL_WRITE, None).unwrap();
    t.dereg_mr(mr.lkey).unwrap();
}

fn mlock_munlock(p: *mut u8, len: usize) {
    // SAFETY: locking then unlocking pages of a live mapping.
    unsafe {
        assert_eq!(libc::mlock(p.cast(), len), 0);
        assert_eq!(libc::munlock(p.cast(), len), 0);
    }
}

fn lookup(c: &mut Criterion) {
    let t = table(PinMode::OnDemand);
    let pd = t.alloc_pd().unwrap();
    let ctx = AccessCtx { pd, qpn: 1 };
    let rr = Access::REMOTE_READ;
    let a = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 1 << 16]),
            Access::LOCAL_WRITE | rr,
            None,
        )
        .unwrap();
    let b = t
        .reg_mr(
            pd,
            MemSource::owned(vec![0u8; 1 << 16]),
            Access::LOCAL_WRITE | rr,
            None,
        )
        .unwrap();
    let mut g = c.benchmark_group("lookup");
    g.bench_function("check/1thread", |bn| {
        bn.iter(|| {
            t.check(ctx, black_box(a.rkey), a.iova + 64, 64, rr)
                .unwrap()
        })
    });
    g.bench_function("read64/1thread", |bn| {
        let mut out = [0u8; 64];
        bn.iter(|| {
            t.read(ctx, black_box(a.rkey), a.iova + 64, &mut out, rr)
                .unwrap()
        })
    });
    for (name, keys) in [
        ("read64/2threads_same_key", [a, a]),
        ("read64/2threads_two_keys", [a, b]),
    ] {
        g.bench_function(name, |bn| {
            bn.iter_custom(|iters| {
                let barrier = Barrier::new(2);
                std::thread::scope(|s| {
                    let hs: Vec<_> = keys
                        .iter()
                        .map(|k| {
                            let (t, barrier) = (&t, &barrier);
                            s.spawn(move || {
                                let mut out = [0u8; 64];
                                barrier.wait();
                                let t0 = Instant::now();
                                for _ in 0..iters {
                                    t.read(ctx, black_box(k.rkey), k.iova + 64, &mut out, rr)
                                        .unwrap();
                                }
                                t0.elapsed()
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().unwrap())
                        .max()
                        .unwrap_or_default()
                })
            })
        });
    }
    g.finish();
}

fn registration(c: &mut Criterion) {
    let mut small = memmap2::MmapMut::map_anon(4096).unwrap();
    small.fill(1);
    let mut big = memmap2::MmapMut::map_anon(GIB).unwrap();
    big.fill(1);
    let (sp, bp) = (small.as_mut_ptr(), big.as_mut_ptr());
    for (label, p, len, samples) in [("4KiB", sp, 4096usize, 100usize), ("1GiB", bp, GIB, 10)] {
        let mut g = c.benchmark_group(format!("reg_dereg_{label}"));
        g.sample_size(samples);
        g.bench_function("bare_mlock_munlock", |bn| bn.iter(|| mlock_munlock(p, len)));
        for (mode, name) in [
            (PinMode::Pinned, "pinned"),
            (PinMode::OnDemand, "on_demand"),
        ] {
            let t = table(mode);
            let pd = t.alloc_pd().unwrap();
            g.bench_function(name, |bn| bn.iter(|| regdereg(&t, pd, p, len)));
        }
        g.finish();
    }
    ratios(sp, bp);
}

/// Median of `n` timings of `f`.
fn median(n: usize, mut f: impl FnMut()) -> Duration {
    let mut v: Vec<Duration> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect();
    v.sort();
    v[n / 2]
}

fn ratios(sp: *mut u8, bp: *mut u8) {
    println!("\nratios (medians, same run):");
    for (label, p, len, n) in [("4KiB", sp, 4096usize, 2001usize), ("1GiB", bp, GIB, 5)] {
        let bare = median(n, || mlock_munlock(p, len));
        for (mode, name) in [
            (PinMode::Pinned, "pinned"),
            (PinMode::OnDemand, "on_demand"),
        ] {
            let t = table(mode);
            let pd = t.alloc_pd().unwrap();
            let ours = median(n, || regdereg(&t, pd, p, len));
            println!(
                "  reg+dereg {label:>4} {name:<9}: {ours:>12?}  vs bare mlock+munlock {bare:>12?}  ratio {:.2}",
                ours.as_secs_f64() / bare.as_secs_f64()
            );
        }
    }
}

criterion_group!(benches, lookup, registration);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
