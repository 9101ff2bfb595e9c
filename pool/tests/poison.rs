//! With the `poison` feature, a kernel that reads freed scratch fails its correctness check
//! instead of passing on stale numbers. Run: `cargo test -p cupool-pool --features poison --test poison`.
#![cfg(feature = "poison")]
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::{Pool, PoolBuffer, PoolConfig, PoolKind};
use std::sync::Arc;

/// A CPU "kernel": the mean of `n` floats at a device address (host memory on the sim).
fn mean(ptr: u64, n: usize) -> f32 {
    // SAFETY: the address is simulated-device memory that stays mapped: the pool only caches
    // the block. Reading it after the free is the deliberate bug this test plants.
    let xs = unsafe { std::slice::from_raw_parts(ptr as *const f32, n) };
    xs.iter().sum::<f32>() / n as f32
}

#[test]
fn a_use_after_free_reads_nan() {
    for kind in [PoolKind::Vmm, PoolKind::Legacy] {
        let dev = Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap());
        let pool: Arc<dyn Pool> = PoolConfig::default().kind(kind).build(dev.clone()).unwrap();
        let buf = PoolBuffer::<f32>::alloc(&pool, 4096).unwrap();
        dev.write(buf.ptr(), &1.0f32.to_le_bytes().repeat(4096))
            .unwrap();
        let ptr = buf.ptr();
        assert_eq!(mean(ptr, 4096), 1.0, "{kind:?}: correct use passes");
        drop(buf);
        let stale = mean(ptr, 4096);
        assert!(
            stale.is_nan(),
            "{kind:?}: reading freed scratch must fail loudly, got {stale}"
        );
        // The memory is still the pool's and is handed out again as usual.
        let again = PoolBuffer::<f32>::alloc(&pool, 4096).unwrap();
        assert_eq!(again.ptr(), ptr);
    }
}
