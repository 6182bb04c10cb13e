//! Cost of registration coherence, against plain `memcpy` measured in the same run:
//! - placement (`MemoryAccess::write`) into owned memory, into raw memory with checked copies
//!   (the default: caught copies on x86-64, `raw_checked`), with the kernel's checked copies
//!   (`process_vm_writev`, `RawCopy::Kernel`, `raw_kernel`), with plain copies
//!   (`RawCopy::Plain`), and the rejected candidate `pwrite` on `/proc/self/mem`, at 64 B,
//!   4 KiB, 64 KiB and 1 MiB;
//! - fetch (`read`) and atomics, owned vs raw (caught and the kernel's);
//! - owned placement with the watcher on and off (owned regions must not get slower);
//! - the watcher: raw reg+dereg with it on and off, and the round trip of one event
//!   (`madvise(MADV_DONTNEED)` of a registered page, which waits for the watcher).
//!
//! Ends with a ratio table.
//!
//! Run: `cargo bench -p softrdma --bench coherence -- --warm-up-time 1 --measurement-time 2`

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use softrdma::mem::*;

const SIZES: [usize; 4] = [64, 4096, 64 << 10, 1 << 20];
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
const ALL: Access = Access(RW.0 | Access::REMOTE_ATOMIC.0);

fn table(watch: WatchMode, raw_copy: RawCopy) -> MemoryTable {
    MemoryTable::new(MemConfig {
        pin_mode: PinMode::OnDemand,
        watch,
        raw_copy,
        ..MemConfig::default()
    })
    .unwrap()
}

/// A table with one owned and one raw region of `len` bytes (the raw one over `mem`).
struct Setup {
    t: MemoryTable,
    c: AccessCtx,
    owned: MrInfo,
    raw: MrInfo,
}

fn setup(watch: WatchMode, raw_copy: RawCopy, mem: &mut memmap2::MmapMut) -> Setup {
    let t = table(watch, raw_copy);
    let pd = t.alloc_pd().unwrap();
    let len = mem.len();
    let owned = t
        .reg_mr(pd, MemSource::owned(vec![1u8; len]), ALL, None)
        .unwrap();
    // SAFETY: `mem` outlives the table (both live until the end of the benchmark function).
    let src = unsafe { MemSource::raw(mem.as_mut_ptr(), len) };
    let raw = t.reg_mr(pd, src, ALL, None).unwrap();
    Setup {
        t,
        c: AccessCtx { pd, qpn: 1 },
        owned,
        raw,
    }
}

fn anon(len: usize) -> memmap2::MmapMut {
    let mut m = memmap2::MmapMut::map_anon(len).unwrap();
    m.fill(1);
    m
}

fn memcpy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(black_box(src));
    black_box(dst);
}

fn place(c: &mut Criterion) {
    let max = *SIZES.last().unwrap();
    let (mut m1, mut m2, mut m3) = (anon(max), anon(max), anon(max));
    let checked = setup(WatchMode::On, RawCopy::Checked, &mut m1);
    let plain = setup(WatchMode::On, RawCopy::Plain, &mut m2);
    let kernel = setup(WatchMode::On, RawCopy::Kernel, &mut m3);
    assert!(checked.t.checked_copy(), "process_vm_writev unavailable");
    let proc_mem = File::options().write(true).open("/proc/self/mem").unwrap();
    let mut dst = vec![0u8; max];
    let src = vec![7u8; max];
    let mut g = c.benchmark_group("place");
    for n in SIZES {
        let data = &src[..n];
        g.bench_with_input(BenchmarkId::new("memcpy", n), &n, |b, _| {
            b.iter(|| memcpy(&mut dst[..n], data))
        });
        let s = &checked;
        g.bench_with_input(BenchmarkId::new("owned", n), &n, |b, _| {
            b.iter(|| {
                s.t.write(s.c, s.owned.rkey, s.owned.iova, data, RW)
                    .unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("raw_checked", n), &n, |b, _| {
            b.iter(|| s.t.write(s.c, s.raw.rkey, s.raw.iova, data, RW).unwrap())
        });
        let k = &kernel;
        g.bench_with_input(BenchmarkId::new("raw_kernel", n), &n, |b, _| {
            b.iter(|| k.t.write(k.c, k.raw.rkey, k.raw.iova, data, RW).unwrap())
        });
        let p = &plain;
        g.bench_with_input(BenchmarkId::new("raw_plain", n), &n, |b, _| {
            b.iter(|| p.t.write(p.c, p.raw.rkey, p.raw.iova, data, RW).unwrap())
        });
        let at = m1.as_ptr() as u64;
        g.bench_with_input(BenchmarkId::new("proc_self_mem", n), &n, |b, _| {
            b.iter(|| proc_mem.write_all_at(data, at).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("fetch_4KiB");
    let mut out = vec![0u8; 4096];
    g.bench_function("owned", |b| {
        b.iter(|| {
            s_read(&checked, checked.owned, &mut out);
        })
    });
    g.bench_function("raw_checked", |b| {
        b.iter(|| s_read(&checked, checked.raw, &mut out))
    });
    g.bench_function("raw_kernel", |b| {
        b.iter(|| s_read(&kernel, kernel.raw, &mut out))
    });
    g.finish();

    let mut g = c.benchmark_group("atomic");
    let op = AtomicOp::FetchAdd { add: 1 };
    let s = &checked;
    g.bench_function("owned", |b| {
        b.iter(|| s.t.atomic(s.c, s.owned.rkey, s.owned.iova, op).unwrap())
    });
    g.bench_function("raw_checked", |b| {
        b.iter(|| s.t.atomic(s.c, s.raw.rkey, s.raw.iova, op).unwrap())
    });
    let k = &kernel;
    g.bench_function("raw_kernel", |b| {
        b.iter(|| k.t.atomic(k.c, k.raw.rkey, k.raw.iova, op).unwrap())
    });
    g.finish();
    ratios(&checked, &kernel, &plain, &proc_mem, m1.as_ptr() as u64);
    drop((checked, kernel, plain));
}

fn s_read(s: &Setup, mr: MrInfo, out: &mut [u8]) {
    s.t.read(s.c, mr.rkey, mr.iova, out, RW).unwrap();
}

fn owned_unaffected(c: &mut Criterion) {
    let (mut m1, mut m2) = (anon(4096), anon(4096));
    let on = setup(WatchMode::On, RawCopy::Checked, &mut m1);
    let off = setup(WatchMode::Off, RawCopy::Checked, &mut m2);
    let data = vec![3u8; 4096];
    let mut g = c.benchmark_group("owned_4KiB");
    for (name, s) in [("watch_off", &off), ("watch_on", &on)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                s.t.write(s.c, s.owned.rkey, s.owned.iova, &data, RW)
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn regdereg(t: &MemoryTable, pd: u32, p: *mut u8, len: usize) {
    // SAFETY: `p..p+len` is a live mapping owned by the benchmark for the whole run.
    let src = unsafe { MemSource::raw(p, len) };
    let mr = t.reg_mr(pd, src, RW, None).unwrap();
    t.dereg_mr(mr.lkey).unwrap();
}

/// Register 4 KiB, discard it with `MADV_DONTNEED` (with the watcher on, `madvise` waits for
/// the watcher to read and apply the event), deregister.
fn discard_cycle(t: &MemoryTable, pd: u32, p: *mut u8) {
    // SAFETY: as in `regdereg`.
    let src = unsafe { MemSource::raw(p, 4096) };
    let mr = t.reg_mr(pd, src, RW, None).unwrap();
    // SAFETY: discards one page of a mapping the benchmark owns.
    assert_eq!(
        unsafe { libc::madvise(p.cast(), 4096, libc::MADV_DONTNEED) },
        0
    );
    t.dereg_mr(mr.lkey).unwrap();
}

fn watcher(c: &mut Criterion) {
    let mut m = anon(4096);
    let p = m.as_mut_ptr();
    let mut g = c.benchmark_group("watcher_4KiB");
    for (name, mode) in [("off", WatchMode::Off), ("on", WatchMode::On)] {
        let t = table(mode, RawCopy::Checked);
        let pd = t.alloc_pd().unwrap();
        g.bench_function(format!("reg_dereg/{name}"), |b| {
            b.iter(|| regdereg(&t, pd, p, 4096))
        });
        g.bench_function(format!("reg_discard_dereg/{name}"), |b| {
            b.iter(|| discard_cycle(&t, pd, p))
        });
    }
    g.finish();
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

fn ratios(checked: &Setup, kernel: &Setup, plain: &Setup, proc_mem: &File, at: u64) {
    println!("\nratios (medians of batched timings, same run; x = time / memcpy time):");
    let max = *SIZES.last().unwrap();
    let src = vec![7u8; max];
    let mut dst = vec![0u8; max];
    for n in SIZES {
        let batch = (1 << 22) / n.max(4096);
        let data = &src[..n];
        let time = |f: &mut dyn FnMut()| {
            median(101, || {
                for _ in 0..batch {
                    f()
                }
            }) / batch as u32
        };
        let base = time(&mut || memcpy(&mut dst[..n], data));
        let s = checked;
        let owned = time(&mut || {
            s.t.write(s.c, s.owned.rkey, s.owned.iova, data, RW)
                .unwrap()
        });
        let chk = time(&mut || s.t.write(s.c, s.raw.rkey, s.raw.iova, data, RW).unwrap());
        let k = kernel;
        let kern = time(&mut || k.t.write(k.c, k.raw.rkey, k.raw.iova, data, RW).unwrap());
        let p = plain;
        let pl = time(&mut || p.t.write(p.c, p.raw.rkey, p.raw.iova, data, RW).unwrap());
        let pm = time(&mut || proc_mem.write_all_at(data, at).unwrap());
        let x = |d: Duration| d.as_secs_f64() / base.as_secs_f64();
        println!(
            "  {n:>7} B  memcpy {base:>10.2?}  owned {owned:>10.2?} ({:.1}x)  raw_checked {chk:>10.2?} \
             ({:.1}x, {:.2} GB/s)  raw_kernel {kern:>10.2?} ({:.1}x)  raw_plain {pl:>10.2?} \
             ({:.1}x)  /proc/self/mem {pm:>10.2?} ({:.1}x)",
            x(owned),
            x(chk),
            n as f64 / chk.as_secs_f64() / 1e9,
            x(kern),
            x(pl),
            x(pm),
        );
    }
}

criterion_group!(benches, place, owned_unaffected, watcher);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
