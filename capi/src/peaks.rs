//! The peaks a user sees, kept over ubatch boundaries.
//!
//! An engine's ubatch boundary restarts each pool's own high-water marks (its per-ubatch
//! accounting); PyTorch's peaks restart only when the user asks. So before a boundary restarts
//! them, what they reached is kept here, and the statistics report the higher of the two.

use cupool_pool::PoolStats;

/// The highest live and reserved bytes of one stream pool that its own statistics no longer
/// show: what they reached before the ubatch boundaries since the user last reset the peaks.
#[derive(Debug, Default)]
pub(crate) struct Peaks {
    live: usize,
    reserved: usize,
}

impl Peaks {
    /// Keeps the pool's peaks before a boundary restarts them.
    pub(crate) fn keep(&mut self, s: &PoolStats) {
        self.live = self.live.max(s.live_peak_bytes);
        self.reserved = self.reserved.max(s.reserved_peak_bytes);
    }

    /// The peaks since the user's last reset: the kept ones or the pool's own, the higher.
    pub(crate) fn of(&self, s: &PoolStats) -> (usize, usize) {
        (
            self.live.max(s.live_peak_bytes),
            self.reserved.max(s.reserved_peak_bytes),
        )
    }
}
