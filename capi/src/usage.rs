//! What each stream's pool was asked for between two ubatch boundaries: libcupool's `auto`
//! purge expects the next ubatch to ask for what the one just ended held at once.
//!
//! Each thread counts its own allocations, in its state of the stream pool (`local.rs`, behind
//! the lock its calls take anyway; a free from another thread takes it off the thread that
//! allocated), so threads sharing a stream do not serialise here; the boundary adds the
//! threads' counts up (`Cached::take_keep`): exact with one thread per stream (an engine's), an
//! upper bound with several. The live bytes and their peak that the statistics
//! report are counted the same way: the live bytes exactly (each free is taken off the thread
//! that allocated), the peak as the sum of the threads' own peaks, exact with one thread and an
//! upper bound with several (an exact peak of several threads would need one counter that every
//! allocation writes, the very line threads sharing a stream would queue on).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// Distinct request sizes a pool tracks between two boundaries. Past it, new sizes are not
/// tracked: their cached buffers are returned at the boundary (safe, at worst a re-malloc).
const MAX_SIZES: usize = 4096;

/// For each request size: (blocks live now, most live at once since the last boundary); and
/// the bytes live now and their peak since the user last reset it.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    sizes: HashMap<usize, (u32, u32), BuildHasherDefault<crate::hash::AddrHasher>>,
    live: usize,
    live_peak: usize,
}

impl Usage {
    #[inline]
    pub fn alloc(&mut self, size: usize) {
        self.live += size;
        self.live_peak = self.live_peak.max(self.live);
        if let Some(e) = self.sizes.get_mut(&size) {
            e.0 += 1;
            e.1 = e.1.max(e.0);
        } else if self.sizes.len() < MAX_SIZES {
            self.sizes.insert(size, (1, 1));
        }
    }

    #[inline]
    pub fn free(&mut self, size: usize) {
        // Every free takes off an allocation this thread counted: no underflow.
        self.live -= size;
        if let Some(e) = self.sizes.get_mut(&size) {
            e.0 = e.0.saturating_sub(1);
        }
    }

    /// The live peak since the last reset.
    pub fn live_peak(&self) -> usize {
        self.live_peak
    }

    /// The live peak restarts from what is live now.
    pub fn reset_peak(&mut self) {
        self.live_peak = self.live;
    }

    /// The requests to keep buffers for, largest first (so large requests take their best
    /// fits before small ones can), and a fresh interval: sizes with live blocks carry them
    /// over.
    pub fn take_keep(&mut self) -> Vec<usize> {
        let mut keep: Vec<usize> = self
            .sizes
            .iter()
            .flat_map(|(&size, &(_, most))| std::iter::repeat_n(size, most as usize))
            .collect();
        keep.sort_unstable_by(|a, b| b.cmp(a));
        self.sizes.retain(|_, e| e.0 > 0);
        self.sizes.values_mut().for_each(|e| e.1 = e.0);
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_held_at_once_per_size_largest_first() {
        let mut u = Usage::default();
        // K and V together, twice; a small buffer alone, three times.
        for _ in 0..2 {
            u.alloc(100);
            u.alloc(100);
            u.free(100);
            u.free(100);
        }
        for _ in 0..3 {
            u.alloc(7);
            u.free(7);
        }
        u.alloc(50); // live across the boundary
        assert_eq!(u.take_keep(), vec![100, 100, 50, 7]);
        // The next interval starts from what is live.
        assert_eq!(u.take_keep(), vec![50]);
        u.free(50);
        assert_eq!(u.take_keep(), vec![50]);
        assert!(u.take_keep().is_empty());
    }

    #[test]
    fn the_live_peak_holds_until_a_reset() {
        let mut u = Usage::default();
        u.alloc(100);
        u.alloc(5);
        u.free(100);
        assert_eq!((u.live, u.live_peak()), (5, 105));
        u.reset_peak();
        assert_eq!(u.live_peak(), 5);
    }

    #[test]
    fn stops_tracking_new_sizes_past_the_bound() {
        let mut u = Usage::default();
        for s in 0..MAX_SIZES + 10 {
            u.alloc(s + 1);
        }
        assert_eq!(u.sizes.len(), MAX_SIZES);
        u.free(MAX_SIZES + 5); // untracked: ignored
        assert_eq!(u.take_keep().len(), MAX_SIZES);
    }
}
