//! The managed pool and the managed-fallback adaptor.
mod common;
use common::*;
use cupool_pool::adaptors::ManagedFallback;
use cupool_pool::driver::sim::SimConfig;
use cupool_pool::driver::CallKind;
use cupool_pool::pools::{ManagedConfig, ManagedPool, VmmPool};
use cupool_pool::{Pool, PoolBuffer, PoolKind};
use std::sync::Arc;

#[test]
fn managed_pool_drops_idle_smaller_buffers_when_it_grows() {
    let dev = sim(4.0);
    let p = ManagedPool::new(as_driver(&dev), ManagedConfig::default());
    assert_eq!(p.kind(), PoolKind::Managed);
    for mb in [10, 20, 30] {
        let b = p.alloc(mb * MIB).unwrap();
        p.free(b).unwrap();
    }
    assert_eq!(
        p.cached_sizes().len(),
        1,
        "each grow dropped the smaller idle buffer"
    );
    let s = p.stats();
    assert_eq!(s.calls.managed_mallocs, 3);
    assert_eq!(s.calls.managed_frees, 2);
    assert_eq!(s.calls.mallocs, 0);
    assert_eq!(dev.ledger().managed_allocations, 1);
    assert_eq!(dev.ledger().allocations, 0);
}

#[test]
fn managed_pool_never_asks_beyond_device_free_memory() {
    let dev = sim(1.0);
    let p = ManagedPool::new(as_driver(&dev), ManagedConfig::default());
    let e = p.alloc(2 * GIB).unwrap_err();
    assert!(
        e.to_string().contains("oversubscription is not allowed"),
        "{e}"
    );
    assert_eq!(
        dev.calls(CallKind::MallocManaged),
        0,
        "the driver was never asked"
    );

    let p = ManagedPool::new(
        as_driver(&dev),
        ManagedConfig {
            allow_oversubscription: true,
        },
    );
    let b = p.alloc(2 * GIB).unwrap();
    p.free(b).unwrap();
}

#[test]
fn fallback_serves_from_managed_memory_when_the_device_is_full() {
    // A 1 GiB card that reports plenty of host-side headroom is not a thing: the fallback must
    // respect device free memory, so fill the pool with VMM below a limit instead.
    let dev = sim(1.0);
    let limited: Arc<dyn cupool_pool::driver::Driver> = Arc::new(
        cupool_pool::driver::limit::LimitedDriver::new(as_driver(&dev), 256 * MIB),
    );
    let inner: Arc<dyn Pool> = Arc::new(VmmPool::new(limited));
    let pool: Arc<dyn Pool> = Arc::new(ManagedFallback::new(inner, false));
    let a = PoolBuffer::<u8>::alloc(&pool, 200 * MIB).unwrap();
    assert!(!a.block().is_managed_fallback());
    let b = PoolBuffer::<u8>::alloc(&pool, 100 * MIB).unwrap();
    assert!(
        b.block().is_managed_fallback(),
        "the 256 MiB limit is full; the real card is not"
    );
    let s = pool.stats();
    assert_eq!((s.fallbacks, s.fallback_live_bytes), (1, 100 * MIB));
    assert_eq!(dev.ledger().managed_allocations, 1);
    drop(b);
    assert_eq!(pool.stats().fallback_live_bytes, 0);
    assert_eq!(dev.ledger().managed_allocations, 0);
    drop(a);
}

#[test]
fn fallback_refuses_beyond_physical_free_memory() {
    let dev = sim(1.0);
    let inner: Arc<dyn Pool> = Arc::new(VmmPool::new(as_driver(&dev)));
    let pool = ManagedFallback::new(inner, false);
    let e = pool.alloc(2 * GIB).unwrap_err();
    assert!(e.oom_report().is_some(), "the original OOM comes back: {e}");
    assert_eq!(pool.stats().fallbacks, 0);
    assert_eq!(dev.calls(CallKind::MallocManaged), 0);
}

#[test]
fn no_managed_device_makes_fallback_a_plain_oom() {
    let dev = sim_with(SimConfig::gib(1.0).managed(false));
    let inner: Arc<dyn Pool> = Arc::new(VmmPool::new(as_driver(&dev)));
    let pool = ManagedFallback::new(inner, true);
    assert!(pool.alloc(2 * GIB).unwrap_err().oom_report().is_some());
}
