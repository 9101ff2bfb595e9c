//! A pool's snapshot ([`cupool_pool::PoolSnapshot`]) with the simulated device's: after a
//! restore, the same requests get the same answers as from the point the snapshot was taken.

mod common;

use common::{as_driver, sim_with, MIB};
use cupool_pool::adaptors::PurgeRetry;
use cupool_pool::driver::sim::SimConfig;
use cupool_pool::{synchronize, Block, Pool, PoolConfig, PoolError, PoolKind, Purge};
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1usize..(24 * MIB)).prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Purge),
    ]
}

/// What a pool answered to each op, and its counters and the device's ledger after all.
type Outcome = (Vec<Result<u64, String>>, cupool_pool::PoolStats, String);

/// Runs `ops` on `pool`, then frees what is left: every answer, the counters, the ledger.
fn run(pool: &dyn Pool, dev: &cupool_pool::driver::sim::SimDevice, ops: &[Op]) -> Outcome {
    let mut live: Vec<Block> = Vec::new();
    let mut answers = Vec::new();
    for op in ops {
        match op {
            Op::Alloc(b) => match pool.alloc(*b) {
                Ok(block) => {
                    answers.push(Ok(block.ptr()));
                    live.push(block);
                }
                Err(e) => answers.push(Err(e.to_string())),
            },
            Op::Free(i) if !live.is_empty() => {
                let b = live.swap_remove(i % live.len());
                pool.free(b).expect("a block of this pool");
            }
            Op::Free(_) => {}
            Op::Purge => {
                let token = synchronize(pool.driver().as_ref()).expect("a synchronize");
                let r = pool.purge(&token, Purge::All).expect("a purge");
                answers.push(Ok(r.bytes as u64));
            }
        }
    }
    for b in live {
        pool.free(b).expect("a block of this pool");
    }
    (answers, pool.stats(), format!("{:?}", dev.ledger()))
}

/// The pools a dry run builds: the legacy pool (with its flush-and-retry or not), the vmm pool
/// (libcupool's layering: size classes, large requests rounded to 2 MiB), and the vmm pool
/// recycling pages into lanes, its growth made ahead inline or not.
fn pool_config(which: u8, flush: bool) -> PoolConfig {
    match which {
        0 => {
            let mut c = PoolConfig::default().kind(PoolKind::Legacy);
            c.legacy.flush_and_retry = flush;
            c
        }
        1 => {
            let mut c = PoolConfig::default().kind(PoolKind::Vmm);
            cupool_pool::layering::Layering::default().apply(&mut c);
            c
        }
        _ => {
            let mut c = PoolConfig::default().kind(PoolKind::Vmm);
            c.vmm = common::recycling_config(2 * MIB, true);
            if which == 3 {
                c.vmm.ahead = cupool_pool::upstream::vmm::Ahead::Inline;
            }
            c
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// From a snapshot taken between two runs of requests, the second run gets the same
    /// addresses, failures, counters and device ledger each time it is replayed, on every pool
    /// a dry run builds (`pool_config`), bare or under a purge-and-retry wrapper, on cards small
    /// enough that requests fail.
    #[test]
    fn a_restored_pool_answers_as_it_did_at_its_snapshot(
        which in 0u8..4,
        card_mib in 48usize..256,
        flush in any::<bool>(),
        wrapped in any::<bool>(),
        before in prop::collection::vec(op(), 0..60),
        after in prop::collection::vec(op(), 1..60),
    ) {
        let dev = sim_with(SimConfig::gib(card_mib as f64 / 1024.0).backed(false));
        let mut pool = pool_config(which, flush).build(as_driver(&dev)).unwrap();
        if wrapped {
            pool = Arc::new(PurgeRetry::new(pool));
        }
        run(pool.as_ref(), &dev, &before);
        let (pool_state, dev_state) = (pool.snapshot().unwrap(), dev.snapshot().unwrap());
        let first = run(pool.as_ref(), &dev, &after);
        for _ in 0..2 {
            prop_assert!(dev.restore(&dev_state));
            pool.restore(&pool_state).unwrap();
            prop_assert_eq!(&run(pool.as_ref(), &dev, &after), &first);
        }
    }
}

/// A pool with a live block has no snapshot and takes none back; nor does a pool of a kind
/// that keeps none, another pool, or a device backed by host memory. Each refusal says what it
/// lacks.
#[test]
fn snapshots_are_refused_where_they_cannot_hold() {
    let dev = sim_with(SimConfig::gib(1.0).backed(false));
    let pool = PoolConfig::default()
        .kind(PoolKind::Legacy)
        .build(as_driver(&dev))
        .unwrap();
    let b = pool.alloc(MIB).unwrap();
    let live = pool.snapshot().unwrap_err();
    assert!(matches!(live, PoolError::Snapshot { .. }));
    assert!(live.to_string().contains("blocks are live"), "{live}");
    pool.free(b).unwrap();
    let s = pool.snapshot().unwrap();
    let b = pool.alloc(MIB).unwrap();
    assert!(pool.restore(&s).is_err());
    pool.free(b).unwrap();
    pool.restore(&s).unwrap();

    let torch = PoolConfig::default()
        .kind(PoolKind::Torch)
        .build(as_driver(&dev))
        .unwrap();
    assert!(torch.snapshot().is_err());
    assert!(torch.restore(&s).is_err());
    let vmm = pool_config(1, false).build(as_driver(&dev)).unwrap();
    let b = vmm.alloc(3 * MIB).unwrap();
    assert!(vmm.snapshot().is_err());
    vmm.free(b).unwrap();
    let v = vmm.snapshot().unwrap();
    assert!(vmm.restore(&s).is_err());
    let b = vmm.alloc(3 * MIB).unwrap();
    assert!(vmm.restore(&v).is_err(), "a live block refuses the restore");
    vmm.free(b).unwrap();
    vmm.restore(&v).unwrap();
    let other = PoolConfig::default()
        .kind(PoolKind::Legacy)
        .build(as_driver(&dev))
        .unwrap();
    let foreign = other.restore(&s).unwrap_err();
    assert!(foreign.to_string().contains("another pool"), "{foreign}");

    let backed = sim_with(SimConfig::gib(1.0));
    assert!(backed.snapshot().is_none());
    let fake = dev.snapshot().unwrap();
    assert!(!backed.restore(&fake));
}
