//! A driver that counts the calls that can change what a device holds, so a dry run can tell
//! that its pool made no driver call without reading the pool's statistics: a VMM pool's
//! statistics walk every page it maps, and the fast-forward asks before and after every op
//! (see [`crate::fast_forward`]).
//!
//! Every driver call a pool counts in its [`cupool_pool::DriverCalls`] is one of the calls
//! counted here (a map, an unmap, an alias, a synchronize, ...), made through this driver:
//! while this count stands still, so do the pool's counters.

use cupool_pool::driver::observed::{CallObserver, Observed};
use std::sync::atomic::{AtomicU64, Ordering};

/// See the module docs: `CountingDriver::new(inner, Counter::default())` wraps `inner`.
pub(crate) type CountingDriver = Observed<Counter>;

/// The observer of a [`CountingDriver`].
#[derive(Debug, Default)]
pub(crate) struct Counter {
    /// Calls that may change the device's state, failed ones included.
    calls: AtomicU64,
}

impl CallObserver for Counter {
    fn around<T>(&self, name: &'static str, call: impl FnOnce() -> T) -> T {
        // Reading free memory changes nothing a pool counts.
        if name != "mem_info" {
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        call()
    }
}

impl Counter {
    /// Calls so far that may have changed the device's state (attempts: a failed one counts).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupool_pool::driver::sim::{SimConfig, SimDevice};
    use cupool_pool::driver::Driver;
    use cupool_pool::{Block, PoolConfig, PoolKind, Purge};
    use proptest::prelude::*;
    use std::sync::Arc;

    /// What a test asks of the pool.
    #[derive(Clone, Debug)]
    enum Op {
        Alloc(usize),
        /// Frees the live block at this index (modulo how many are live).
        Free(usize),
        Purge(Purge),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..(48 << 20)).prop_map(Op::Alloc),
            4 => any::<usize>().prop_map(Op::Free),
            1 => prop_oneof![
                Just(Purge::All),
                (1usize..(32 << 20)).prop_map(Purge::SmallerThan),
                prop::collection::vec(1usize..(32 << 20), 0..4).prop_map(Purge::KeepFor),
            ]
            .prop_map(Op::Purge),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Whatever a pool is asked (allocations that fit or run out of the card, frees,
        /// purges), a step in which the driver saw no call left the pool's driver calls as they
        /// were: what the fast-forward reads instead of the pool's statistics.
        #[test]
        fn a_step_without_a_call_leaves_the_pool_s_calls(
            kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm, PoolKind::Torch]),
            card_mib in 64usize..512,
            ops in prop::collection::vec(op(), 1..80),
        ) {
            let sim = SimDevice::new(SimConfig::gib(card_mib as f64 / 1024.0)).unwrap();
            let d = Arc::new(CountingDriver::new(Arc::new(sim), Counter::default()));
            let pool = PoolConfig::default().kind(kind).build(d.clone()).unwrap();
            let mut live: Vec<Block> = Vec::new();
            for op in ops {
                let before = (d.observer().calls(), pool.stats().calls);
                match op {
                    Op::Alloc(bytes) => live.extend(pool.alloc(bytes).ok()),
                    Op::Free(i) if !live.is_empty() => {
                        let b = live.swap_remove(i % live.len());
                        pool.free(b).unwrap();
                    }
                    Op::Free(_) => {}
                    Op::Purge(what) => {
                        let token = cupool_pool::synchronize(d.as_ref()).unwrap();
                        pool.purge(&token, what).unwrap();
                    }
                }
                d.mem_info().unwrap();
                if d.observer().calls() == before.0 {
                    prop_assert_eq!(pool.stats().calls, before.1, "{:?}", kind);
                }
            }
            for b in live {
                pool.free(b).unwrap();
            }
        }
    }
}
