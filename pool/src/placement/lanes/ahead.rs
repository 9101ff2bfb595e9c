//! What the lanes expect their next copies to need ([`Placement::ahead`]): see the module docs
//! of [`super`].

use super::{Lane, Lanes, SPILL_GRANULE};
use crate::placement::Placement;

/// Growing busy lanes whose next growth [`Placement::ahead`] names: the ones whose blocks were
/// placed longest ago, replaced next where a cache is copied layer by layer. Where each layer copies
/// its keys and then its values (PyTorch's KV cache), two lanes ask for a lane's growth a whole
/// layer before it is needed, and hold two growths of memory early (8 MiB on Phi-3's prefill).
pub const AHEAD: usize = 2;

impl Lane {
    /// The growth the block that replaces this lane's is expected to need: where its last two
    /// blocks both grew (a cache's copies; an activation that happened to land on a smaller
    /// one's lane grows once), the growth before the last (3 MiB a chunk in 2 MiB granules
    /// grows by 4, then 2 MiB, by turns); else none.
    #[inline]
    pub(super) fn next_growth(&self) -> usize {
        if self.grew[0] > 0 && self.grew[1] > 0 {
            self.grew[0]
        } else {
            0
        }
    }
}

impl<P: Placement> Lanes<P> {
    /// [`Placement::ahead`] names nothing from now on.
    pub fn predict_nothing(&mut self) {
        self.predicts = false;
    }

    /// Where a lane's free span starts: after its block, and after the growth asked for ahead
    /// for it while it is one of the [`AHEAD`] (that memory is not free to move: it would be
    /// made again).
    pub(super) fn kept(&self, at: u64, l: &Lane) -> usize {
        if self.predicts
            && l.used > 0
            && l.next_growth() > 0
            && self.growing.range(..=(l.placed, at)).nth(AHEAD).is_none()
        {
            (l.used + l.next_growth()).next_multiple_of(SPILL_GRANULE)
        } else {
            l.used
        }
    }

    /// Every lane's range beyond its block, or its last block while free, in whole granules.
    pub(super) fn name_surplus(&self, f: &mut dyn FnMut(u64, usize)) {
        for (&at, l) in &self.lanes {
            let end = if l.used > 0 { l.used } else { l.last };
            let end = end.next_multiple_of(SPILL_GRANULE);
            if end < l.seg.len {
                f(at + end as u64, l.seg.len - end);
            }
        }
    }

    /// The growth the [`AHEAD`] growing busy lanes placed longest ago will need: each one's
    /// block is replaced by a copy that lands in the lane the replaced block frees (the most
    /// memory behind it: `free_lane`).
    pub(super) fn name_ahead(&self, f: &mut dyn FnMut(u64, usize)) {
        let n = if self.predicts { AHEAD } else { 0 };
        for &(_, at) in self.growing.iter().take(n) {
            if let Some(l) = self.lanes.get(&at) {
                // Whole granules: the pages made there, each wholly inside the range (so a
                // block that needs their memory can have them shed: `core/back.rs`).
                let end = (l.used + l.next_growth())
                    .next_multiple_of(SPILL_GRANULE)
                    .min(l.seg.len);
                if end > l.used {
                    f(at + l.used as u64, end - l.used);
                }
            }
        }
    }
}
