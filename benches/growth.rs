//! VMM growth: the cost of mapping new memory, per MiB, for fixed chunk sizes and the default
//! adaptive policy (2 MiB, doubling while growth continues, up to 64 MiB).
//!
//! Each iteration builds a fresh pool and grows it to 512 MiB with 1 MiB allocations (so every
//! map is the policy's choice, not the request's); the pool is dropped outside the timing.
//! Goal: at most 3 µs per MiB at the default setting. On the simulated device the number is
//! only the bookkeeping; on CUDA it includes cuMemCreate + cuMemMap + cuMemSetAccess.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cupool::pool::driver::cuda::{is_available, CudaDriver};
use cupool::pool::driver::sim::{SimConfig, SimDevice};
use cupool::pool::driver::Driver;
use cupool::pool::pools::VmmPool;
use cupool::pool::upstream::vmm::VmmConfig;
use cupool::pool::Pool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
const TOTAL_MIB: usize = 512;

fn grow(c: &mut Criterion, device: &str, d: Arc<dyn Driver>) {
    let mut g = c.benchmark_group(format!("growth/{device}"));
    g.throughput(Throughput::Bytes((TOTAL_MIB * MIB) as u64));
    g.sample_size(20);
    let d0 = VmmConfig::default();
    for (label, min_grow, max_grow) in [
        ("fixed-2MiB", 2 * MIB, 2 * MIB),
        ("fixed-20MiB", 20 * MIB, 20 * MIB),
        ("fixed-64MiB", 64 * MIB, 64 * MIB),
        ("default", d0.min_grow, d0.max_grow),
    ] {
        g.bench_with_input(
            BenchmarkId::new("grow", label),
            &(min_grow, max_grow),
            |b, &(min_grow, max_grow)| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let pool = VmmPool::with_config(
                            d.clone(),
                            VmmConfig {
                                reserve_bytes: Some(8 << 30),
                                min_grow,
                                max_grow,
                                ..VmmConfig::default()
                            },
                        )
                        .expect("valid settings");
                        // Reserve outside the timing: it happens once per pool, not per grow.
                        let first = pool.alloc(1).unwrap();
                        pool.free(first).unwrap();
                        let start = Instant::now();
                        let blocks: Vec<_> =
                            (0..TOTAL_MIB).map(|_| pool.alloc(MIB).unwrap()).collect();
                        total += start.elapsed();
                        for b in blocks.into_iter().rev() {
                            pool.free(b).unwrap();
                        }
                    }
                    total
                })
            },
        );
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    grow(
        c,
        "sim",
        Arc::new(
            SimDevice::new(SimConfig::gib(64.0).backed(false).record_calls(false))
                .expect("a valid card"),
        ),
    );
    if is_available() {
        if let Ok(d) = CudaDriver::new(0) {
            grow(c, "cuda", Arc::new(d));
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
