//! Dry runs (the planner) skip what cannot change the pool's numbers. A step — one repeat of
//! an op, a layer, a ubatch — that made no driver call left the pool's cache as it found it, so
//! the identical steps after it would repeat it exactly; a ubatch that started and ended with
//! an empty pool will do the same again. The engine asks this one struct at each of those
//! places, so what may be skipped is decided in one place.

use cupool_pool::{DriverCalls, Pool};

/// Whether a run fast-forwards, and what the ubatches it skipped would have cost.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FastForward {
    on: bool,
    /// Driver calls of the ubatches skipped: (acquisitions, releases).
    skipped: (u64, u64),
    /// Whether the pool held nothing before the ubatch in progress.
    empty_before: bool,
}

/// The pool's driver calls before a step (`None`: not fast-forwarding).
pub(crate) type Mark = Option<DriverCalls>;

impl FastForward {
    /// On for dry runs, off for real ones.
    pub fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    /// Before a step.
    pub fn mark(&self, pool: &dyn Pool) -> Mark {
        self.on.then(|| pool.stats().calls)
    }

    /// After a step marked with `mark`: whether it made no driver call, so that the identical
    /// steps after it may be skipped.
    pub fn repeats(&self, pool: &dyn Pool, mark: Mark) -> bool {
        mark.is_some_and(|b| pool.stats().calls == b)
    }

    /// Starts a decode on `pool`.
    pub fn start(&mut self, pool: &dyn Pool) {
        self.skipped = (0, 0);
        self.empty_before = pool.stats().reserved_bytes == 0;
    }

    /// After ubatch `done` of `n` (marked with `mark`), where `shape(k)` is ubatch `k`'s
    /// (tokens, KV length): how many of the ubatches after it to skip. They repeat it exactly
    /// when it made no driver call (its boundary included) or started and ended with an empty
    /// pool; the last of a run of equal shapes still runs, since its boundary sees a different
    /// next ubatch. Their driver calls are counted as if they had run.
    pub fn ubatches_to_skip(
        &mut self,
        pool: &dyn Pool,
        mark: Mark,
        done: usize,
        n: usize,
        shape: impl Fn(usize) -> (usize, usize),
    ) -> usize {
        let Some(before) = mark else {
            return 0;
        };
        let after = pool.stats();
        let calls = (
            after.calls.acquisitions() - before.acquisitions(),
            after.calls.releases() - before.releases(),
        );
        let empty_after = after.reserved_bytes == 0;
        let mut skip = 0;
        if calls == (0, 0) || (self.empty_before && empty_after) {
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
