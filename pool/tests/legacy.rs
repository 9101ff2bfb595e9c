//! The legacy pool against a reference model of ggml's `ggml_cuda_pool_leg`, and its options.
mod common;
use common::*;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::{CallKind, Driver};
use cupool_pool::placement::slots::SlotsConfig;
use cupool_pool::pools::{LegacyConfig, LegacyPool};
use cupool_pool::{synchronize, Block, Pool, PoolError, Purge};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// ggml's algorithm, written out as plainly as its C++: slots of (id, size), 0 = empty.
struct Reference {
    slots: Vec<(u64, usize)>,
    next_id: u64,
    pool_size: usize,
    mallocs: u64,
    frees: u64,
}

enum RefAlloc {
    Reused { id: u64, size: usize },
    Malloc { id: u64, size: usize },
}

impl Reference {
    fn new(n: usize) -> Self {
        Self {
            slots: vec![(0, 0); n],
            next_id: 1,
            pool_size: 0,
            mallocs: 0,
            frees: 0,
        }
    }

    fn alloc(&mut self, size: usize) -> RefAlloc {
        let mut best_diff: usize = 1 << 36;
        let mut ibest: isize = -1;
        for i in 0..self.slots.len() {
            let (id, s) = self.slots[i];
            if id != 0 && s >= size {
                let diff = s - size;
                if diff < best_diff {
                    best_diff = diff;
                    ibest = i as isize;
                    if best_diff == 0 {
                        self.slots[i] = (0, 0);
                        return RefAlloc::Reused { id, size: s };
                    }
                }
            }
        }
        if ibest != -1 {
            let (id, s) = self.slots[ibest as usize];
            self.slots[ibest as usize] = (0, 0);
            return RefAlloc::Reused { id, size: s };
        }
        let look_ahead = ((1.05 * size as f64) as usize).next_multiple_of(256);
        let id = self.next_id;
        self.next_id += 1;
        self.pool_size += look_ahead;
        self.mallocs += 1;
        RefAlloc::Malloc {
            id,
            size: look_ahead,
        }
    }

    fn free(&mut self, id: u64, size: usize) {
        for slot in self.slots.iter_mut() {
            if slot.0 == 0 {
                *slot = (id, size);
                return;
            }
        }
        self.frees += 1;
        self.pool_size -= size;
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        1usize..4096,
        4096usize..(4 * MIB),
        Just(MIB),
        Just(1000),
        0usize..3
    ];
    prop::collection::vec(
        prop_oneof![3 => size.prop_map(Op::Alloc), 2 => any::<usize>().prop_map(Op::Free)],
        1..300,
    )
}

/// Runs `ops` on the pool and the reference side by side, comparing every decision.
fn run_against_reference(slots: usize, ops: &[Op]) {
    let dev = sim(64.0);
    let pool = LegacyPool::with_config(
        as_driver(&dev),
        LegacyConfig {
            placement: SlotsConfig {
                slots,
                ..SlotsConfig::default()
            },
            ..LegacyConfig::default()
        },
    )
    .unwrap();
    let mut model = Reference::new(slots);
    let mut ids: HashMap<u64, u64> = HashMap::new(); // device ptr -> model id
    let mut live: Vec<(Block, u64, usize)> = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc(n) => {
                let block = pool.alloc(n).expect("64 GiB never runs out here");
                match model.alloc(n.max(1)) {
                    RefAlloc::Reused { id, size } => {
                        assert_eq!(
                            ids.get(&block.ptr()),
                            Some(&id),
                            "pool reused a different buffer than ggml"
                        );
                        assert_eq!(block.capacity(), size);
                        live.push((block, id, size));
                    }
                    RefAlloc::Malloc { id, size } => {
                        assert!(
                            !ids.contains_key(&block.ptr())
                                || live.iter().all(|(b, ..)| b.ptr() != block.ptr())
                        );
                        assert_eq!(
                            block.capacity(),
                            size,
                            "grow size differs from round_up(1.05*size, 256)"
                        );
                        ids.insert(block.ptr(), id);
                        live.push((block, id, size));
                    }
                }
            }
            Op::Free(k) if !live.is_empty() => {
                let (block, id, size) = live.swap_remove(k % live.len());
                pool.free(block).unwrap();
                model.free(id, size);
            }
            Op::Free(_) => {}
        }
        let s = pool.stats();
        assert_eq!(s.reserved_bytes, model.pool_size);
        assert_eq!(s.calls.mallocs, model.mallocs);
        assert_eq!(s.calls.frees, model.frees);
        assert_eq!(dev.calls(CallKind::Malloc), model.mallocs);
    }
    for (b, ..) in live {
        pool.free(b).unwrap();
    }
    drop(pool);
    assert!(dev.ledger().is_empty(), "leaked: {:?}", dev.ledger());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn matches_ggml_reference_256_slots(ops in ops()) {
        run_against_reference(256, &ops);
    }

    #[test]
    fn matches_ggml_reference_when_slots_overflow(ops in ops()) {
        run_against_reference(4, &ops);
    }
}

#[test]
fn grow_size_is_ggml_look_ahead() {
    let dev = sim(1.0);
    let pool = LegacyPool::new(as_driver(&dev));
    assert_eq!(pool.grow_size(1000), 1280); // 1050 -> 1280
    assert_eq!(pool.grow_size(MIB), 1_101_056); // 1101004.8 -> 1101004 -> 1101056
    assert_eq!(pool.grow_size(1), 256);
}

#[test]
fn outgrown_buffers_strand_until_purged() {
    let dev = sim(12.0);
    let pool = LegacyPool::new(as_driver(&dev));
    // A growing request, as flash-attention scratch grows with n_kv.
    for step in 1..=10 {
        let b = pool.alloc(step * 10 * MIB).unwrap();
        pool.free(b).unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.calls.mallocs, 10, "each larger request misses the cache");
    assert_eq!(pool.cached_sizes().len(), 10);
    assert!(
        s.reserved_bytes > 5 * s.live_peak_bytes,
        "reserved {} vs peak live {}",
        s.reserved_bytes,
        s.live_peak_bytes
    );

    let token = synchronize(dev.as_ref()).unwrap();
    let r = pool.purge(&token, Purge::SmallerThan(100 * MIB)).unwrap();
    assert_eq!(
        r.buffers, 9,
        "only buffers too small for the next request go"
    );
    assert_eq!(pool.cached_sizes().len(), 1);
    let r = pool.purge(&token, Purge::All).unwrap();
    assert_eq!(r.buffers, 1);
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert_eq!(dev.ledger().allocations, 0);
}

#[test]
fn purge_keeps_buffers_freed_after_the_synchronize_began() {
    let dev = sim(1.0);
    let pool = LegacyPool::new(as_driver(&dev));
    let a = pool.alloc(MIB).unwrap();
    let b = pool.alloc(2 * MIB).unwrap();
    pool.free(a).unwrap();
    let token = synchronize(dev.as_ref()).unwrap();
    pool.free(b).unwrap(); // its kernels may have been queued after the sync
    let r = pool.purge(&token, Purge::All).unwrap();
    assert_eq!(r.buffers, 1);
    assert_eq!(r.deferred_bytes, pool.grow_size(2 * MIB));
    let later = synchronize(dev.as_ref()).unwrap();
    assert_eq!(pool.purge(&later, Purge::All).unwrap().buffers, 1);
}

#[test]
fn purge_rejects_a_token_from_another_device() {
    let a = sim(1.0);
    let b = sim(1.0);
    let pool = LegacyPool::new(as_driver(&a));
    let foreign = synchronize(b.as_ref()).unwrap();
    assert!(matches!(
        pool.purge(&foreign, Purge::All),
        Err(PoolError::WrongDevice { .. })
    ));
}

#[test]
fn flush_and_retry_recovers_stranded_cache() {
    let dev = sim(1.0);
    let d = as_driver(&dev);
    let plain = LegacyPool::new(d.clone());
    for mb in [200, 230, 260] {
        let b = plain.alloc(mb * MIB).unwrap();
        plain.free(b).unwrap();
    }
    let err = plain.alloc(400 * MIB).unwrap_err();
    let report = err.oom_report().expect("an OOM report");
    assert_eq!(report.requested, 400 * MIB);
    assert!(report.stranded > 700 * MIB, "stranded {}", report.stranded);
    assert!(report.to_string().contains("stranded"));
    assert_eq!(plain.stats().ooms, 1);
    drop(plain);

    let retry = LegacyPool::with_config(
        d,
        LegacyConfig {
            flush_and_retry: true,
            ..LegacyConfig::default()
        },
    )
    .unwrap();
    for mb in [200, 230, 260] {
        let b = retry.alloc(mb * MIB).unwrap();
        retry.free(b).unwrap();
    }
    let b = retry.alloc(400 * MIB).expect("flush and retry");
    let s = retry.stats();
    assert_eq!((s.retries, s.ooms, s.calls.syncs), (1, 0, 1));
    assert_eq!(s.reserved_bytes, b.capacity());
    retry.free(b).unwrap();
}

#[test]
fn failed_allocation_leaves_the_pool_as_it_was() {
    let dev = Arc::new(FaultInjector::new(sim(1.0)));
    let pool = LegacyPool::new(dev.clone());
    let keep = pool.alloc(MIB).unwrap();
    let before = pool.stats();
    dev.fail_nth(
        CallKind::Malloc,
        1,
        cupool_pool::driver::ErrorCode::Injected,
    );
    let err = pool.alloc(8 * MIB).unwrap_err();
    assert!(matches!(err, PoolError::Driver(_)), "{err}");
    assert_eq!(pool.stats(), before);
    pool.free(keep).unwrap();
    let again = pool.alloc(8 * MIB).unwrap();
    pool.free(again).unwrap();
}

#[test]
fn freeing_into_the_wrong_pool_returns_the_block() {
    let dev = sim(1.0);
    let a = LegacyPool::new(as_driver(&dev));
    let b = LegacyPool::new(as_driver(&dev));
    let block = a.alloc(4096).unwrap();
    let err = b.free(block).unwrap_err();
    assert!(matches!(err.error, PoolError::WrongPool { .. }));
    a.free(err.block).unwrap();
    assert_eq!(a.stats().live_blocks, 0);
    assert_eq!(b.stats().frees, 0);
}

#[test]
fn enormous_sizes_are_errors_not_panics() {
    let dev = sim(1.0);
    let pool = LegacyPool::new(as_driver(&dev));
    assert!(matches!(
        pool.alloc(usize::MAX),
        Err(PoolError::InvalidSize { .. })
    ));
    let e = pool.alloc(2 * GIB).unwrap_err();
    assert!(e.oom_report().is_some());
    assert_eq!(dev.ledger().allocations, 0);
    let d: &dyn Driver = dev.as_ref();
    assert!(d.mem_info().unwrap().free == GIB);
    // An element count whose byte size overflows.
    let shared: std::sync::Arc<dyn Pool> = std::sync::Arc::new(LegacyPool::new(as_driver(&dev)));
    let e = cupool_pool::PoolBuffer::<u64>::alloc(&shared, usize::MAX / 2).unwrap_err();
    assert!(matches!(e, PoolError::InvalidSize { .. }), "{e}");
    assert!(e.to_string().contains("sizes from 0 to"), "{e}");
}
