//! Page moves made by a worker thread (`DeferredDriver`): the calls reach the device in the
//! order the pool made them, a fence waits for them, a call that depends on a queued one waits
//! for it, a queued call that fails fails every later one, and a recycling pool on top loses
//! nothing and keeps every byte, with the worker lagging behind.
mod common;
use common::*;
use cupool_pool::driver::deferred::DeferredDriver;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::{synchronize, Block, Pool, PoolError, Purge};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_queued_move_returns_at_once_and_a_fence_waits_for_it() {
    let dev = sim(0.0625);
    let deferred = DeferredDriver::new(slow(as_driver(&dev), 50));
    let d: &dyn Driver = &deferred;
    let gran = d.granularity().unwrap();
    let base = d.reserve(4 * gran, 0).unwrap();
    let h = d.map(base, gran).unwrap();
    let to = base + 2 * gran as u64;
    let t = std::time::Instant::now();
    d.alias(base, to, gran, h).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(40),
        "the move waited for the device"
    );
    assert_eq!(deferred.pending(), 1);
    assert!(
        !dev.contains(to, gran),
        "mapped before the worker could have"
    );
    d.fence(0).unwrap();
    assert_eq!(deferred.pending(), 0);
    assert!(dev.contains(to, gran));
    // The old mapping's drop is queued; memory mapped there waits for it (the simulated
    // device, as CUDA, refuses to map over a mapping).
    d.unalias(base, gran).unwrap();
    let h2 = d.map(base, gran).unwrap();
    assert_eq!(deferred.pending(), 0);
    d.synchronize_device().unwrap();
    d.unmap(base, gran, h2).unwrap();
    d.unmap(to, gran, h).unwrap();
    d.release_reservation(base, 4 * gran).unwrap();
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn a_failed_queued_move_fails_every_later_call_and_the_fence() {
    let dev = sim(0.0625);
    let inj = Arc::new(FaultInjector::new(as_driver(&dev)));
    let deferred = DeferredDriver::new(inj.clone());
    let d: &dyn Driver = &deferred;
    let gran = d.granularity().unwrap();
    let base = d.reserve(4 * gran, 0).unwrap();
    let h = d.map(base, gran).unwrap();
    inj.fail_nth(CallKind::Map, 1, ErrorCode::Injected);
    d.alias(base, base + 2 * gran as u64, gran, h).unwrap();
    // The worker is done with it (and failed): the fence still says so, though nothing is
    // left to wait for, and so does every later call that could hand out memory.
    while deferred.pending() > 0 {
        std::thread::yield_now();
    }
    let e = d.fence(0).unwrap_err();
    assert_eq!(e.code, ErrorCode::Injected, "{e}");
    assert!(!dev.contains(base + 2 * gran as u64, gran));
    assert!(
        d.alias(base, base + 3 * gran as u64, gran, h).is_err(),
        "a later move was queued"
    );
    assert!(
        d.map(base + gran as u64, gran).is_err(),
        "memory mapped after a failed move"
    );
    assert!(d.synchronize_device().is_err());
}

/// A driver whose second mappings all fail, a while after they are asked for: the pool queues
/// every move of an allocation before the worker has failed the first (a queued call that
/// failed fails every later one, so a worker that finished first failed the allocation itself,
/// about one run in a hundred).
#[derive(Debug)]
struct NoAlias(Arc<dyn Driver>);

impl cupool_pool::driver::forward::Forward for NoAlias {
    fn inner(&self) -> &dyn Driver {
        self.0.as_ref()
    }

    fn alias(
        &self,
        from: u64,
        _to: u64,
        _bytes: usize,
        _h: cupool_pool::driver::PhysHandle,
    ) -> Result<(), cupool_pool::driver::DriverError> {
        std::thread::sleep(Duration::from_millis(20));
        Err(cupool_pool::driver::DriverError::new(
            CallKind::Map,
            ErrorCode::Injected,
            format!("no second mapping of {from:#x}"),
        ))
    }
}

/// A recycling pool over a driver whose queued moves fail: an allocation whose memory was to
/// come from a failed move is refused at its fence, never handed out unmapped.
#[test]
fn a_block_whose_move_failed_is_refused_at_its_fence() {
    let dev = sim(0.0625);
    let d: Arc<DeferredDriver> = Arc::new(DeferredDriver::new(Arc::new(NoAlias(as_driver(&dev)))));
    let p = recycling_vmm(d.clone(), 2 * MIB);
    // A hole between two live blocks, then a larger successor: the hole's pages move.
    let a = p.alloc(8 * MIB).unwrap();
    let hole = p.alloc(8 * MIB).unwrap();
    let c = p.alloc(8 * MIB).unwrap();
    p.free(hole).unwrap();
    match p.alloc(10 * MIB) {
        Ok(b) => {
            while d.pending() > 0 {
                std::thread::yield_now();
            }
            let fenced = Driver::fence(d.as_ref(), 0);
            assert!(
                fenced.is_err() || dev.contains(b.ptr(), b.size()),
                "an unmapped block passed its fence"
            );
            assert!(fenced.is_err(), "the failed move went unnoticed");
        }
        Err(e) => panic!("the allocation itself failed ({e}): the test no longer queues a move"),
    }
    assert!(p.stats().calls.remaps > 0, "{:?}", p.stats().calls);
    drop((a, c));
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
    Trim,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1usize..8 * MIB).prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
        1 => Just(Op::Sync),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// The recycling property of `tests/recycle.rs` with the page moves queued to a worker that
    /// lags up to 1 ms per call: after each allocation and its fence the block is mapped and takes
    /// its bytes, live blocks keep theirs, blocks freed since the last finished synchronize
    /// stay mapped, the pool's reserve is what the device holds, and the device ends empty.
    #[test]
    fn queued_moves_lose_nothing_and_keep_every_byte(
        ops in prop::collection::vec(op(), 1..80), lag in 0u64..2
    ) {
        let dev = sim(0.0625);
        let d: Arc<DeferredDriver> = Arc::new(DeferredDriver::new(slow(as_driver(&dev), lag)));
        let p = recycling_vmm(d.clone(), 2 * MIB);
        let mut live: Vec<(Block, u8)> = Vec::new();
        let mut queued: Vec<(u64, usize, u64)> = Vec::new();
        let mut seed = 0u8;
        for op in ops {
            match op {
                Op::Alloc(n) => match p.alloc(n) {
                    Ok(b) => {
                        Driver::fence(d.as_ref(), 0).unwrap();
                        prop_assert!(dev.contains(b.ptr(), b.size()), "{:#x} not mapped after the fence", b.ptr());
                        seed = seed.wrapping_add(1);
                        fill(&b, seed);
                        live.push((b, seed));
                    }
                    Err(PoolError::OutOfMemory(_)) => {}
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (b, _) = live.swap_remove(i % live.len());
                    queued.push((b.ptr(), b.size(), dev.epoch().current()));
                    p.free(b).unwrap();
                }
                Op::Free(_) => {}
                Op::Trim => {
                    let t = synchronize(d.as_ref()).unwrap();
                    p.purge(&t, Purge::All).unwrap();
                }
                Op::Sync => {
                    synchronize(d.as_ref()).unwrap();
                }
            }
            if let Err(e) = recycling_invariants(&p, &dev, &mut queued, &live) {
                prop_assert!(false, "{e}");
            }
        }
        for (b, _) in live {
            p.free(b).unwrap();
        }
        drop(p);
        prop_assert_eq!(d.pending(), 0);
        prop_assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
    }
}
