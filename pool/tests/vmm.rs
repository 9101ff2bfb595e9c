//! The VMM pool: growth, any-order frees, trim, device exhaustion (its address space:
//! `vmm_space.rs`).
mod common;
use common::*;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::sim::SimConfig;
use cupool_pool::driver::Driver;
use cupool_pool::driver::{CallKind, ErrorCode};
use cupool_pool::pools::{VmmPool, VMM_ALIGN};
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Pool, PoolError, Purge};
use std::sync::Arc;

fn pool<D: Driver + 'static>(dev: &Arc<D>, min_grow: usize) -> VmmPool {
    VmmPool::with_config(
        dev.clone(),
        VmmConfig {
            reserve_bytes: None,
            min_grow,
            max_grow: min_grow,
            ..VmmConfig::default()
        },
    )
    .unwrap()
}

/// A pool that maps one page per growth, as ggml does: the map counts below are its.
fn ggml_pool<D: Driver + 'static>(dev: &Arc<D>, min_grow: usize, max_grow: usize) -> VmmPool {
    VmmPool::with_config(
        dev.clone(),
        VmmConfig {
            min_grow,
            max_grow,
            recycle: false,
            ..VmmConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn lifo_bumps_and_grows_by_granularity() {
    let dev = sim(4.0);
    let p = pool(&dev, 0);
    let a = p.alloc(100).unwrap();
    let b = p.alloc(3 * MIB).unwrap();
    assert_eq!(
        b.ptr() - a.ptr(),
        VMM_ALIGN as u64,
        "bump allocation, 128-byte rounding"
    );
    assert_eq!(p.stats().reserved_bytes, 4 * MIB, "grown in 2 MiB granules");
    assert_eq!(dev.calls(CallKind::Reserve), 1);
    assert_eq!(dev.calls(CallKind::Create), 2);
    let base = a.ptr();
    p.free(b).unwrap();
    p.free(a).unwrap();
    let c = p.alloc(3 * MIB).unwrap();
    assert_eq!(c.ptr(), base, "LIFO frees rewind the top");
    p.free(c).unwrap();
}

#[test]
fn out_of_order_frees_coalesce_and_are_reused() {
    let dev = sim(4.0);
    let p = pool(&dev, 0);
    let blocks: Vec<_> = (0..6).map(|_| p.alloc(MIB).unwrap()).collect();
    let ptrs: Vec<u64> = blocks.iter().map(|b| b.ptr()).collect();
    let mut blocks: Vec<Option<_>> = blocks.into_iter().map(Some).collect();
    // Free 1, 3, 2 (a run in the middle), never the top.
    for i in [1, 3, 2] {
        p.free(blocks[i].take().unwrap()).unwrap();
    }
    let big = p.alloc(3 * MIB).unwrap();
    assert_eq!(
        big.ptr(),
        ptrs[1],
        "three coalesced holes serve a 3 MiB request"
    );
    let mapped = p.mapped_bytes();
    p.free(big).unwrap();
    // Free the rest out of order; the top falls back to the base.
    for i in [0, 5, 4] {
        p.free(blocks[i].take().unwrap()).unwrap();
    }
    assert_eq!(p.stats().live_bytes, 0);
    let again = p.alloc(6 * MIB).unwrap();
    assert_eq!(again.ptr(), ptrs[0]);
    assert_eq!(
        p.mapped_bytes(),
        mapped,
        "no growth: the space was all reusable"
    );
    p.free(again).unwrap();
}

#[test]
fn trim_unmaps_only_above_the_live_top() {
    let dev = sim(4.0);
    let p = pool(&dev, 0);
    let low = p.alloc(MIB).unwrap();
    let high = p.alloc(9 * MIB).unwrap();
    p.free(high).unwrap();
    assert_eq!(p.stats().reserved_bytes, 10 * MIB);
    let token = synchronize(dev.as_ref()).unwrap();
    assert_eq!(
        p.purge(&token, Purge::SmallerThan(usize::MAX))
            .unwrap()
            .bytes,
        0,
        "vmm never strands"
    );
    let r = p.purge(&token, Purge::All).unwrap();
    assert_eq!(r.bytes, 8 * MIB, "the chunk holding the live block stays");
    assert_eq!(p.stats().reserved_bytes, 2 * MIB);
    p.free(low).unwrap();
    let token = synchronize(dev.as_ref()).unwrap();
    p.purge(&token, Purge::All).unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
    assert_eq!(dev.ledger().mappings, 0);
    drop(p);
    assert!(dev.ledger().is_empty());
}

#[test]
fn trim_waits_for_frees_after_the_synchronize() {
    let dev = sim(4.0);
    let p = pool(&dev, 0);
    let b = p.alloc(4 * MIB).unwrap();
    let token = synchronize(dev.as_ref()).unwrap();
    p.free(b).unwrap();
    let r = p.purge(&token, Purge::All).unwrap();
    assert_eq!((r.bytes, r.deferred_bytes), (0, 4 * MIB));
}

#[test]
fn growth_doubles_in_a_burst_and_resets_after_a_free() {
    let dev = sim(4.0);
    let d = VmmConfig::default();
    let p = ggml_pool(&dev, d.min_grow, d.max_grow);
    // 126 MiB in 1 MiB steps with no free: chunks of 2, 4, 8, 16, 32, 64 MiB.
    let blocks: Vec<_> = (0..126).map(|_| p.alloc(MIB).unwrap()).collect();
    assert_eq!(p.stats().calls.maps, 6);
    assert_eq!(p.mapped_bytes(), 126 * MIB);
    for b in blocks.into_iter().rev() {
        p.free(b).unwrap();
    }
    // After a free, growth is tight again: one more MiB past the mapped end maps 2 MiB.
    let all = p.alloc(126 * MIB).unwrap();
    let one = p.alloc(MIB).unwrap();
    assert_eq!(p.mapped_bytes(), 128 * MIB);
    p.free(one).unwrap();
    p.free(all).unwrap();
}

#[test]
fn min_grow_amortises_maps() {
    let dev = sim(4.0);
    let p = ggml_pool(&dev, 64 * MIB, 64 * MIB);
    let blocks: Vec<_> = (0..32).map(|_| p.alloc(MIB).unwrap()).collect();
    assert_eq!(p.stats().calls.maps, 1);
    assert_eq!(p.stats().reserved_bytes, 64 * MIB);
    for b in blocks.into_iter().rev() {
        p.free(b).unwrap();
    }
}

#[test]
fn grow_falls_back_to_the_exact_need_when_the_amortised_size_does_not_fit() {
    let dev = sim(0.5);
    let other = cupool_pool::driver::Driver::malloc(dev.as_ref(), 300 * MIB).unwrap();
    let p = pool(&dev, 1024 * MIB);
    let b = p.alloc(100 * MIB).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        100 * MIB,
        "212 MiB free: the 512 MiB amortised grow fails, the exact one fits"
    );
    assert_eq!(p.stats().ooms, 0);
    p.free(b).unwrap();
    drop(p);
    cupool_pool::driver::Driver::free(dev.as_ref(), other).unwrap();
    assert!(dev.ledger().is_empty());
}

#[test]
fn device_exhaustion_is_an_error_with_a_report() {
    let dev = sim(0.25);
    let p = pool(&dev, 0);
    let a = p.alloc(200 * MIB).unwrap();
    let before = p.stats();
    let e = p.alloc(100 * MIB).unwrap_err();
    let r = e.oom_report().expect("oom report");
    assert_eq!(r.pool, cupool_pool::PoolKind::Vmm);
    assert_eq!(r.live, 200 * MIB);
    assert!(r.device.is_some());
    let after = p.stats();
    assert_eq!(after.ooms, 1);
    assert_eq!(
        (after.live_bytes, after.reserved_bytes),
        (before.live_bytes, before.reserved_bytes)
    );
    p.free(a).unwrap();
    // Still usable.
    let b = p.alloc(100 * MIB).unwrap();
    p.free(b).unwrap();
}

#[test]
fn partial_map_failures_unwind() {
    for kind in [CallKind::Create, CallKind::Map, CallKind::SetAccess] {
        let dev = sim(1.0);
        let faults = Arc::new(FaultInjector::new(dev.clone()));
        let p = pool(&faults, 0);
        faults.fail_nth(kind, 1, ErrorCode::Injected);
        let e = p.alloc(MIB).unwrap_err();
        assert!(
            matches!(e, PoolError::Driver(ref d) if d.call == kind),
            "{kind:?}: {e}"
        );
        assert_eq!(dev.ledger().mappings, 0, "{kind:?}");
        assert_eq!(dev.ledger().device_bytes, 0, "{kind:?}");
        let b = p.alloc(MIB).unwrap();
        p.free(b).unwrap();
        drop(p);
        assert!(dev.ledger().is_empty(), "{kind:?}: {:?}", dev.ledger());
    }
}

#[test]
fn no_vmm_device_refuses_cleanly() {
    let dev = sim_with(SimConfig::gib(1.0).vmm(false));
    let p = pool(&dev, 0);
    let e = p.alloc(1).unwrap_err();
    assert!(e.to_string().contains("not supported"), "{e}");
}
