//! What the lanes say of themselves, and a copy of their state for a pool's snapshot
//! ([`crate::PoolSnapshot`]).

use super::Lanes;
use crate::placement::Placement;

impl<P: Placement> Lanes<P> {
    /// Lanes open, free or busy.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// The placement the lanes sit on.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// A copy of the lanes and of the placement under them, if it keeps one.
    pub(super) fn copied(&self) -> Option<Self> {
        Some(Self {
            inner: self.inner.copy_state()?,
            rounding: self.rounding,
            lanes: self.lanes.clone(),
            free: self.free.clone(),
            pending: self.pending,
            left_order: self.left_order.clone(),
            recent: self.recent,
            clock: self.clock,
            asked: self.asked,
            enabled: self.enabled,
            growing: self.growing.clone(),
            placed: self.placed,
            excess: self.excess,
            predicts: self.predicts,
            made: self.made,
            last_size: self.last_size,
            copies_grew: self.copies_grew,
            trim: self.trim.clone(),
        })
    }
}
