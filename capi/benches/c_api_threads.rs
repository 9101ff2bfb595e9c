//! libcupool's hot path through its exported functions: 4-KiB alloc + free pairs from 1, 2, 4
//! and 8 threads on one shared stream, as PyTorch's plug-in calls them (`cupool_torch_alloc`,
//! `cupool_torch_free`). Each number is one thread's time per pair while all threads run at
//! once (wall time over the pairs each thread made), as `scripts/torch/threads.cpp` measures.
//!
//! - `same_thread`: each thread frees what it allocated, at once;
//! - `cross_thread`: threads in pairs; each allocates a batch, then frees its partner's batch
//!   (a block freed by another thread than the one that allocated it), two barriers a batch.
//!
//! `BENCH_DEVICE` picks the device (`sim`, the default, runs anywhere; `cuda` on a GPU
//! machine); `BENCH_POOL` the pool (`vmm`, the default, or `legacy`). `BENCH_HISTORY=N` keeps
//! the memory history on (the last N events per device) to measure what it costs; off by
//! default, as in use.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cupool::{
    cupool_init, cupool_memory_history, cupool_shutdown, cupool_torch_alloc, cupool_torch_free,
    CupoolStatus,
};
use std::ffi::{c_void, CString};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const SIZE: usize = 4096;
const BATCH: usize = 256;

fn open() -> String {
    let device = std::env::var("BENCH_DEVICE").unwrap_or_else(|_| "sim".into());
    let pool = std::env::var("BENCH_POOL").unwrap_or_else(|_| "vmm".into());
    let config = CString::new(format!("CUPOOL_DEVICE={device} GGML_POOL={pool}")).unwrap();
    // SAFETY: a NUL-terminated string.
    assert_eq!(unsafe { cupool_init(config.as_ptr()) }, CupoolStatus::Ok);
    match std::env::var("BENCH_HISTORY") {
        Ok(n) => {
            let n: u64 = n
                .parse()
                .expect("BENCH_HISTORY: the events to keep, a number");
            assert_eq!(cupool_memory_history(1, n), CupoolStatus::Ok);
            format!("{device}/{pool}/history")
        }
        Err(_) => format!("{device}/{pool}"),
    }
}

#[inline]
fn pair() {
    let p = cupool_torch_alloc(SIZE, 0, std::ptr::null_mut());
    assert!(!p.is_null());
    cupool_torch_free(p, SIZE, 0, std::ptr::null_mut());
}

/// `threads` threads, started together, each making `iters` pairs: the wall time.
fn same_thread(threads: usize, iters: u64) -> Duration {
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                pair();
                start.wait();
                for _ in 0..iters {
                    pair();
                }
            });
        }
        start.wait();
        let t = Instant::now();
        // The scope joins every thread before it returns.
        (t, ())
    })
    .0
    .elapsed()
}

/// `threads` threads in pairs, each freeing the batches its partner allocated: the wall time
/// for `iters` pairs per thread (rounded up to whole batches).
fn cross_thread(threads: usize, iters: u64) -> Duration {
    let rounds = iters.div_ceil(BATCH as u64);
    let slots: Vec<std::sync::Mutex<Vec<usize>>> = (0..threads)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    let step = Barrier::new(threads + 1);
    let t = std::thread::scope(|s| {
        for me in 0..threads {
            let (slots, step) = (&slots, &step);
            s.spawn(move || {
                let partner = me ^ 1;
                step.wait();
                for _ in 0..rounds {
                    let mine: Vec<usize> = (0..BATCH)
                        .map(|_| cupool_torch_alloc(SIZE, 0, std::ptr::null_mut()) as usize)
                        .collect();
                    *slots[me].lock().unwrap() = mine;
                    step.wait();
                    let theirs = std::mem::take(&mut *slots[partner].lock().unwrap());
                    for p in theirs {
                        cupool_torch_free(p as *mut c_void, SIZE, 0, std::ptr::null_mut());
                    }
                    step.wait();
                }
            });
        }
        step.wait();
        let t = Instant::now();
        for _ in 0..rounds {
            step.wait();
            step.wait();
        }
        t
    });
    let per = t.elapsed().as_secs_f64() * iters as f64 / (rounds * BATCH as u64) as f64;
    Duration::from_secs_f64(per)
}

fn bench(c: &mut Criterion) {
    let what = open();
    let mut g = c.benchmark_group(format!("c_api_pairs/{what}"));
    g.measurement_time(Duration::from_secs(3));
    for threads in [1usize, 2, 4, 8] {
        g.bench_with_input(
            BenchmarkId::new("same_thread", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| same_thread(n, iters)),
        );
    }
    for threads in [2usize, 4, 8] {
        g.bench_with_input(
            BenchmarkId::new("cross_thread", threads),
            &threads,
            |b, &n| b.iter_custom(|iters| cross_thread(n, iters)),
        );
    }
    g.finish();
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}

criterion_group!(benches, bench);
criterion_main!(benches);
