//! Hot path: a cached alloc+free pair per pool, sizes 256 B to 256 MiB.
//!
//! Always on the simulated device; on a CUDA device too when one is present, next to the
//! driver's own cuMemAlloc+cuMemFree and cuMemAllocAsync+cuMemFreeAsync (warm stream-ordered
//! pool) in the same run. Goal: a cached pair costs at most a tenth of the async pair.
//! The threaded variant runs N threads on N per-stream pools and N threads on one pool; the
//! shared variant runs 1 to 16 threads on one pool, with and without per-thread caches, against
//! cuMemAllocAsync on one stream.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cupool::pool::driver::cuda::{is_available, CudaDriver};
use cupool::pool::driver::sim::{SimConfig, SimDevice};
use cupool::pool::driver::Driver;
use cupool::pool::pools::{LegacyPool, ManagedConfig, ManagedPool, VmmPool};
use cupool::pool::Pool;
use std::hint::black_box;
use std::sync::Arc;

const SIZES: [usize; 4] = [256, 64 << 10, 16 << 20, 256 << 20];

fn pools(d: &Arc<dyn Driver>) -> Vec<(&'static str, Arc<dyn Pool>)> {
    vec![
        ("vmm", Arc::new(VmmPool::new(d.clone())) as Arc<dyn Pool>),
        ("legacy", Arc::new(LegacyPool::new(d.clone()))),
        (
            "managed",
            Arc::new(ManagedPool::new(d.clone(), ManagedConfig::default())),
        ),
    ]
}

fn cached_pairs(c: &mut Criterion, device: &str, d: Arc<dyn Driver>) {
    let mut g = c.benchmark_group(format!("hot_path/{device}"));
    g.throughput(Throughput::Elements(1));
    for (name, pool) in pools(&d) {
        for &size in &SIZES {
            let warm = pool.alloc(size).expect("warm-up allocation");
            pool.free(warm).unwrap();
            g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
                b.iter(|| {
                    let blk = pool.alloc(black_box(size)).unwrap();
                    pool.free(blk).unwrap();
                })
            });
        }
    }
    g.finish();
}

/// N threads, each with its own pool (one per stream), and N threads sharing one pool: the
/// time of one cached pair as each thread sees it.
fn threaded_pairs(c: &mut Criterion, device: &str, d: Arc<dyn Driver>) {
    use cupool::pool::{PoolConfig, PoolKind, Registry, StreamId};
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(8);
    let mut g = c.benchmark_group(format!("hot_path_threads/{device}"));
    for kind in [PoolKind::Vmm, PoolKind::Legacy] {
        for shared in [false, true] {
            let reg = Registry::new(PoolConfig::default().kind(kind), vec![d.clone()]);
            let pools: Vec<Arc<dyn Pool>> = (0..threads)
                .map(|t| {
                    reg.pool(0, StreamId(if shared { 0 } else { t as u64 }))
                        .unwrap()
                })
                .collect();
            let name = format!(
                "{}-{}x{}",
                kind.name(),
                threads,
                if shared { "one-pool" } else { "own-pools" }
            );
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    std::thread::scope(|s| {
                        for p in &pools {
                            s.spawn(move || {
                                for _ in 0..iters {
                                    let blk = p.alloc(black_box(4096)).unwrap();
                                    p.free(blk).unwrap();
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
    }
    g.finish();
}

/// One pool shared by 1 to 16 threads, as a framework's threads share a stream: the pool
/// alone, behind per-thread caches ([`ThreadCache`]), and cuMemAllocAsync + cuMemFreeAsync on
/// one shared stream (CUDA's stream-ordered pool) at the same thread counts, in the same run.
/// Each thread's pair time (wall time of `iters` pairs on every thread at once, over `iters`).
fn shared_pool_threads(
    c: &mut Criterion,
    device: &str,
    d: Arc<dyn Driver>,
    cuda: Option<&CudaDriver>,
) {
    use cupool::pool::adaptors::{ThreadCache, ThreadCacheConfig};
    use cupool::pool::{PoolConfig, PoolKind};
    let mut g = c.benchmark_group(format!("hot_path_shared/{device}"));
    g.measurement_time(std::time::Duration::from_secs(1))
        .warm_up_time(std::time::Duration::from_millis(300))
        .sample_size(10);
    let run = |iters: u64, threads: usize, pair: &(dyn Fn() + Sync)| {
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| (0..iters).for_each(|_| pair()));
            }
        });
        start.elapsed()
    };
    for threads in [1usize, 2, 4, 8, 16] {
        for kind in [PoolKind::Vmm, PoolKind::Legacy] {
            let pool = PoolConfig::default().kind(kind).build(d.clone()).unwrap();
            let cached: Arc<dyn Pool> =
                Arc::new(ThreadCache::new(pool.clone(), ThreadCacheConfig::default()));
            for (label, p) in [("", &pool), ("+thread-cache", &cached)] {
                let pair = || {
                    let blk = p.alloc(black_box(4096)).unwrap();
                    p.free(blk).unwrap();
                };
                g.bench_function(
                    BenchmarkId::new(format!("{}{label}", kind.name()), threads),
                    |b| b.iter_custom(|iters| run(iters, threads, &pair)),
                );
            }
        }
        if let Some(drv) = cuda {
            use cudarc::driver::result;
            let stream = drv.context().new_stream().unwrap();
            let raw = stream.cu_stream() as usize;
            let pair = || {
                drv.context().bind_to_thread().unwrap();
                let s = raw as cudarc::driver::sys::CUstream;
                // SAFETY: stream-ordered allocation and free on our own stream; nothing reads it.
                unsafe {
                    let p = result::malloc_async(s, 4096).unwrap();
                    result::free_async(p, s).unwrap();
                }
            };
            g.bench_function(BenchmarkId::new("cuMemAllocAsync", threads), |b| {
                b.iter_custom(|iters| run(iters, threads, &pair))
            });
            stream.synchronize().unwrap();
        }
    }
    g.finish();
}

/// A cached VMM pair while the pool has `holes` holes (every other block of a long run
/// freed): the best-fit search is indexed, so the cost stays flat as holes grow.
fn vmm_with_holes(c: &mut Criterion, device: &str, d: Arc<dyn Driver>) {
    let mut g = c.benchmark_group(format!("hot_path_holes/{device}"));
    g.throughput(Throughput::Elements(1));
    for holes in [0usize, 10_000, 100_000] {
        let pool = VmmPool::new(d.clone());
        let blocks: Vec<_> = (0..2 * holes + 1)
            .map(|_| pool.alloc(256).unwrap())
            .collect();
        let mut keep = Vec::with_capacity(holes + 1);
        for (i, b) in blocks.into_iter().enumerate() {
            if i % 2 == 0 {
                keep.push(b);
            } else {
                pool.free(b).unwrap();
            }
        }
        g.bench_with_input(BenchmarkId::new("vmm-256B", holes), &holes, |b, _| {
            b.iter(|| {
                let blk = pool.alloc(black_box(256)).unwrap();
                pool.free(blk).unwrap();
            })
        });
        keep.into_iter().for_each(|b| pool.free(b).unwrap());
    }
    g.finish();
}

fn cuda_baselines(c: &mut Criterion, drv: &CudaDriver) {
    use cudarc::driver::result;
    let stream = drv.context().new_stream().unwrap();
    let mut g = c.benchmark_group("hot_path/cuda-baseline");
    for &size in &SIZES {
        g.bench_with_input(
            BenchmarkId::new("cuMemAlloc+cuMemFree", size),
            &size,
            |b, &size| {
                b.iter(|| {
                    let p = drv.malloc(size).unwrap();
                    drv.free(p).unwrap();
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("cuMemAllocAsync+cuMemFreeAsync", size),
            &size,
            |b, &size| {
                drv.context().bind_to_thread().unwrap();
                b.iter(|| {
                    // SAFETY: stream-ordered allocation and free on our own stream; nothing reads it.
                    unsafe {
                        let p = result::malloc_async(stream.cu_stream(), size).unwrap();
                        result::free_async(p, stream.cu_stream()).unwrap();
                    }
                });
                stream.synchronize().unwrap();
            },
        );
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let sim: Arc<dyn Driver> =
        Arc::new(SimDevice::new(SimConfig::gib(64.0).record_calls(false)).expect("a valid card"));
    cached_pairs(c, "sim", sim.clone());
    vmm_with_holes(c, "sim", sim.clone());
    shared_pool_threads(c, "sim", sim, None);
    if is_available() {
        match CudaDriver::new(0) {
            Ok(drv) => {
                let drv = Arc::new(drv);
                cuda_baselines(c, &drv);
                cached_pairs(c, "cuda", drv.clone());
                vmm_with_holes(c, "cuda", drv.clone());
                shared_pool_threads(c, "cuda", drv.clone(), Some(&*drv));
                threaded_pairs(c, "cuda", drv);
            }
            Err(e) => eprintln!("cuda benches skipped: {e}"),
        }
    } else {
        eprintln!("cuda benches skipped: no CUDA driver library on this machine");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
