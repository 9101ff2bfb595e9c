//! Properties over random operation sequences, on every pool, on a small simulated card so
//! that OOMs, regrowth and purges all happen.
mod common;
use common::*;
use cupool_pool::adaptors::ManagedFallback;
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::sim::SimDevice;
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::pools::legacy::{LegacyConfig, LegacyPool};
use cupool_pool::pools::managed::{managed_pool, ManagedConfig};
use cupool_pool::pools::vmm::{VmmConfig, VmmPool};
use cupool_pool::{synchronize, Block, Pool, PoolError, Purge};
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
enum Flavor {
    Vmm,
    VmmAmortised,
    Legacy,
    LegacyFewSlotsRetry,
    Managed,
    FallbackOverVmm,
}

const FLAVORS: [Flavor; 6] = [
    Flavor::Vmm,
    Flavor::VmmAmortised,
    Flavor::Legacy,
    Flavor::LegacyFewSlotsRetry,
    Flavor::Managed,
    Flavor::FallbackOverVmm,
];

fn build(flavor: Flavor, dev: &Arc<SimDevice>) -> Arc<dyn Pool> {
    let d = as_driver(dev);
    match flavor {
        Flavor::Vmm => Arc::new(VmmPool::with_config(
            d,
            VmmConfig {
                reserve_bytes: None,
                min_grow: 0,
            },
        )),
        Flavor::VmmAmortised => Arc::new(VmmPool::with_config(
            d,
            VmmConfig {
                reserve_bytes: None,
                min_grow: 8 * MIB,
            },
        )),
        Flavor::Legacy => Arc::new(LegacyPool::new(d)),
        Flavor::LegacyFewSlotsRetry => Arc::new(LegacyPool::with_config(
            d,
            LegacyConfig {
                slots: 3,
                flush_and_retry: true,
                ..LegacyConfig::default()
            },
        )),
        Flavor::Managed => Arc::new(managed_pool(d, ManagedConfig::default())),
        Flavor::FallbackOverVmm => {
            let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(d, 24 * MIB));
            Arc::new(ManagedFallback::new(
                Arc::new(VmmPool::with_config(limited, VmmConfig::default())),
                false,
            ))
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    PurgeAll,
    PurgeSmaller(usize),
    Sync,
    Phase,
    Fault(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        0usize..512,
        512usize..(256 << 10),
        (256usize << 10)..(12 * MIB)
    ];
    prop_oneof![
        8 => size.prop_map(Op::Alloc),
        6 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::PurgeAll),
        1 => (0usize..(8 * MIB)).prop_map(Op::PurgeSmaller),
        1 => Just(Op::Sync),
        1 => Just(Op::Phase),
        1 => any::<u8>().prop_map(Op::Fault),
    ]
}

struct Live {
    block: Block,
    tag: u8,
}

fn stamp(dev: &SimDevice, b: &Block, tag: u8) {
    let n = b.size().min(64);
    dev.write(b.ptr(), &vec![tag; n]).unwrap();
    if b.size() > 64 {
        dev.write(b.ptr() + (b.size() - 64) as u64, &[tag; 64])
            .unwrap();
    }
}

fn check_stamp(dev: &SimDevice, b: &Block, tag: u8) {
    let n = b.size().min(64);
    assert!(
        dev.read(b.ptr(), n).unwrap().iter().all(|&x| x == tag),
        "block {:#x} was overwritten",
        b.ptr()
    );
    if b.size() > 64 {
        assert!(dev
            .read(b.ptr() + (b.size() - 64) as u64, 64)
            .unwrap()
            .iter()
            .all(|&x| x == tag));
    }
}

fn check_invariants(flavor: Flavor, dev: &SimDevice, pool: &dyn Pool, live: &[Live]) {
    let s = pool.stats();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let (mut live_bytes, mut blocks, mut fallback_bytes) = (0usize, 0usize, 0usize);
    for l in live {
        let b = &l.block;
        assert!(b.capacity() >= b.size());
        assert!(
            dev.contains(b.ptr(), b.capacity()),
            "{flavor:?}: block outside live device memory"
        );
        if b.is_managed_fallback() {
            fallback_bytes += b.size();
        } else {
            assert_eq!(
                b.ptr() % pool.alignment() as u64,
                0,
                "{flavor:?}: misaligned"
            );
            live_bytes += b.size();
            blocks += 1;
        }
        ranges.push((b.ptr(), b.ptr() + b.capacity() as u64));
    }
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "{flavor:?}: live blocks overlap");
    }
    assert_eq!(
        s.live_bytes, live_bytes,
        "{flavor:?}: live bytes differ from a recount"
    );
    assert_eq!(s.live_blocks, blocks, "{flavor:?}");
    assert_eq!(s.fallback_live_bytes, fallback_bytes, "{flavor:?}");
    assert!(s.live_peak_bytes >= s.live_bytes && s.reserved_peak_bytes >= s.reserved_bytes);
    assert!(s.cached_bytes <= s.reserved_bytes);
    let ledger = dev.ledger();
    let held = match flavor {
        Flavor::Managed => ledger.managed_bytes,
        Flavor::FallbackOverVmm => ledger.device_bytes,
        _ => ledger.device_bytes,
    };
    assert_eq!(
        s.reserved_bytes, held,
        "{flavor:?}: reserved differs from what the driver holds for the pool"
    );
    assert_eq!(
        ledger.managed_bytes - if flavor == Flavor::Managed { held } else { 0 },
        fallback_bytes
    );
}

impl PartialEq for Flavor {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

fn run(flavor: Flavor, ops: &[Op], faults: bool) {
    let dev = sim(64.0 / 1024.0);
    let pool = build(flavor, &dev);
    let mut live: Vec<Live> = Vec::new();
    let mut tag = 0u8;
    for op in ops {
        match *op {
            Op::Alloc(n) => {
                let before = pool.stats();
                match pool.alloc(n) {
                    Ok(block) => {
                        tag = tag.wrapping_add(1);
                        stamp(&dev, &block, tag);
                        live.push(Live { block, tag });
                    }
                    Err(PoolError::OutOfMemory(_)) | Err(PoolError::Driver(_)) => {
                        let after = pool.stats();
                        assert_eq!(
                            after.live_bytes, before.live_bytes,
                            "{flavor:?}: a failed alloc changed live bytes"
                        );
                        assert_eq!(after.live_blocks, before.live_blocks);
                    }
                    Err(e) => panic!("{flavor:?}: unexpected error {e}"),
                }
            }
            Op::Free(k) if !live.is_empty() => {
                let l = live.swap_remove(k % live.len());
                check_stamp(&dev, &l.block, l.tag);
                if let Err(e) = pool.free(l.block) {
                    // Only an injected fault on the managed free can refuse; the block comes back.
                    assert!(faults, "{flavor:?}: {e}");
                    live.push(Live {
                        block: e.block,
                        tag: l.tag,
                    });
                }
            }
            Op::Free(_) => {}
            Op::PurgeAll | Op::PurgeSmaller(_) => {
                let what = if let Op::PurgeSmaller(n) = *op {
                    Purge::SmallerThan(n)
                } else {
                    Purge::All
                };
                if let Ok(token) = synchronize(dev.as_ref()) {
                    let r = pool.purge(&token, what);
                    assert!(faults || r.is_ok(), "{flavor:?}: {r:?}");
                }
            }
            Op::Sync => {
                let _ = synchronize(dev.as_ref());
            }
            Op::Phase => {
                if let Some(p) = pool.end_phase() {
                    assert!(p.live_peak_bytes >= p.live_end_bytes);
                    assert!(p.reserved_peak_bytes >= p.reserved_end_bytes);
                }
                pool.begin_phase("p");
            }
            Op::Fault(x) if faults => {
                let kinds = [
                    CallKind::Malloc,
                    CallKind::Free,
                    CallKind::MallocManaged,
                    CallKind::FreeManaged,
                    CallKind::Create,
                    CallKind::Map,
                    CallKind::SetAccess,
                    CallKind::Synchronize,
                    CallKind::Reserve,
                    CallKind::MemInfo,
                ];
                dev.fail_nth(
                    kinds[x as usize % kinds.len()],
                    1 + (x as u64 / 64),
                    ErrorCode::Injected,
                );
            }
            Op::Fault(_) => {}
        }
        check_invariants(flavor, &dev, pool.as_ref(), &live);
    }
    dev.clear_faults();
    for l in live.drain(..) {
        check_stamp(&dev, &l.block, l.tag);
        pool.free(l.block).unwrap();
    }
    if matches!(flavor, Flavor::Vmm | Flavor::VmmAmortised) {
        // Everything is free: the whole mapped range must be one reusable run, with no growth.
        let s = pool.stats();
        if s.reserved_bytes > 0 {
            let all = pool
                .alloc(s.reserved_bytes)
                .expect("the whole mapped range is reusable");
            assert_eq!(
                pool.stats().calls.maps,
                s.calls.maps,
                "{flavor:?}: space was lost to the top"
            );
            pool.free(all).unwrap();
        }
    }
    drop(pool);
    assert!(
        dev.ledger().is_empty(),
        "{flavor:?}: leaked {:?}",
        dev.ledger()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn every_pool_keeps_its_invariants(ops in prop::collection::vec(op(), 1..200)) {
        for flavor in FLAVORS {
            run(flavor, &ops, false);
        }
    }

    #[test]
    fn every_pool_survives_driver_faults(ops in prop::collection::vec(op(), 1..200)) {
        for flavor in FLAVORS {
            run(flavor, &ops, true);
        }
    }
}
