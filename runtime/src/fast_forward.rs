//! Dry runs (the planner) skip what cannot change the pool's numbers. A step — one repeat of
//! an op, a layer, a ubatch — that made no driver call left the pool's cache as it found it, so
//! the identical steps after it would repeat it exactly; a ubatch that started and ended with
//! an empty pool will do the same again. The engine asks this one struct at each of those
//! places, so what may be skipped is decided in one place.
//!
//! Whether a step made a driver call is read from the dry run's [`CountingDriver`], not from
//! the pool's statistics: those walk every page a VMM pool maps, and the engine asks before
//! and after every op. Every call a pool counts goes through that driver, so a step the
//! driver saw no call in made none the pool counts; the driver also counts calls the pool
//! does not (a failed one, freeing an address range), and a step that made one is run, not
//! skipped: never skipping is the full run, so skipping less is exact too.

use crate::counting_driver::CountingDriver;
use cupool_pool::{DriverCalls, Pool};
use std::sync::Arc;

/// Whether a run fast-forwards, and what the ubatches it skipped would have cost.
#[derive(Clone, Debug, Default)]
pub(crate) struct FastForward {
    /// The dry run's driver, counting its calls; `None`: the run does not fast-forward.
    driver: Option<Arc<CountingDriver>>,
    /// Driver calls of the ubatches skipped: (acquisitions, releases).
    skipped: (u64, u64),
    /// Whether the pool held nothing before the ubatch in progress.
    empty_before: bool,
    /// The pool's driver calls before the ubatch in progress, read when it held nothing.
    calls_before: Option<DriverCalls>,
}

/// The driver's calls before a step (`None`: not fast-forwarding).
pub(crate) type Mark = Option<u64>;

impl FastForward {
    /// A run that fast-forwards over `driver`, the one under its pool, or (`None`) one that
    /// does not (real runs).
    pub fn new(driver: Option<Arc<CountingDriver>>) -> Self {
        Self {
            driver,
            ..Self::default()
        }
    }

    /// Whether the run fast-forwards (a dry run).
    pub fn on(&self) -> bool {
        self.driver.is_some()
    }

    /// Before a step.
    pub fn mark(&self) -> Mark {
        self.driver.as_ref().map(|d| d.observer().calls())
    }

    /// After a step marked with `mark`: whether it made no driver call, so that the identical
    /// steps after it may be skipped.
    pub fn repeats(&self, mark: Mark) -> bool {
        mark.is_some_and(|m| self.mark() == Some(m))
    }

    /// Starts a decode on `pool`.
    pub fn start(&mut self, pool: &dyn Pool) {
        self.skipped = (0, 0);
        self.empty_before = pool.reserved_bytes() == 0;
    }

    /// Before a ubatch of the decode on `pool`. An empty pool's driver calls are read (its
    /// statistics then walk no page): a ubatch that starts and ends with it empty is skipped
    /// with its calls counted.
    pub fn mark_ubatch(&mut self, pool: &dyn Pool) -> Mark {
        let mark = self.mark();
        self.calls_before = (mark.is_some() && self.empty_before).then(|| pool.stats().calls);
        mark
    }

    /// After ubatch `done` of `n` (marked with [`FastForward::mark_ubatch`]), where `shape(k)`
    /// is ubatch `k`'s (tokens, KV length): how many of the ubatches after it to skip. They
    /// repeat it exactly when it made no driver call (its boundary included) or started and
    /// ended with an empty pool; the last of a run of equal shapes still runs, since its
    /// boundary sees a different next ubatch. Their driver calls are counted as if they had run.
    /// A ubatch that ran more than its shape says (`alone`: the engine's warm-up ran in it)
    /// stands for none after it.
    pub fn ubatches_to_skip(
        &mut self,
        pool: &dyn Pool,
        (mark, alone): (Mark, bool),
        done: usize,
        n: usize,
        shape: impl Fn(usize) -> (usize, usize),
    ) -> usize {
        if mark.is_none() {
            return 0;
        }
        let empty_after = pool.reserved_bytes() == 0;
        if alone {
            self.empty_before = empty_after;
            return 0;
        }
        let calls = if self.repeats(mark) {
            Some((0, 0))
        } else {
            match (self.calls_before, empty_after) {
                (Some(before), true) => {
                    let after = pool.stats().calls;
                    Some((
                        after.acquisitions() - before.acquisitions(),
                        after.releases() - before.releases(),
                    ))
                }
                _ => None,
            }
        };
        let mut skip = 0;
        if let Some(calls) = calls {
            let next = done + 1;
            let mut j = next;
            while j + 1 < n && shape(j) == shape(done) && shape(j + 1) == shape(done) {
                j += 1;
            }
            skip = j - next;
            self.skipped.0 += calls.0 * skip as u64;
            self.skipped.1 += calls.1 * skip as u64;
        }
        self.empty_before = empty_after;
        skip
    }

    /// Driver calls of the ubatches skipped since [`FastForward::start`]: (acquisitions,
    /// releases).
    pub fn skipped(&self) -> (u64, u64) {
        self.skipped
    }
}
