//! What each stream's pool was asked for between two ubatch boundaries: libcupool's `auto`
//! purge expects the next ubatch to ask for what the one just ended held at once.
//!
//! Each thread counts its own allocations ([`ThreadUsage`], behind a lock only it takes, but for
//! a free from another thread), so threads sharing a stream do not serialise here; the boundary
//! adds the threads' counts up ([`Usages::take_keep`]): exact with one thread per stream (an
//! engine's), an upper bound with several. The live bytes and their peak that the statistics
//! report are counted the same way: the live bytes exactly (each free is taken off the thread
//! that allocated), the peak as the sum of the threads' own peaks, exact with one thread and an
//! upper bound with several (an exact peak of several threads would need one counter that every
//! allocation writes, the very line threads sharing a stream would queue on).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

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
    pub fn alloc(&mut self, size: usize) {
        self.live += size;
        self.live_peak = self.live_peak.max(self.live);
        if self.sizes.len() >= MAX_SIZES && !self.sizes.contains_key(&size) {
            return;
        }
        let e = self.sizes.entry(size).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }

    pub fn free(&mut self, size: usize) {
        // Every free takes off an allocation this thread counted: no underflow.
        self.live -= size;
        if let Some(e) = self.sizes.get_mut(&size) {
            e.0 = e.0.saturating_sub(1);
        }
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

/// One thread's counts for one stream pool; a live block holds its allocating thread's, so a
/// free from any thread takes back what that thread counted.
pub(crate) type ThreadUsage = Arc<Mutex<Usage>>;

/// Every thread's counts for one stream pool.
#[derive(Debug, Default)]
pub(crate) struct Usages {
    all: Mutex<Vec<ThreadUsage>>,
    /// The peaks of threads whose counts were dropped (they hold nothing live): a peak stays
    /// until the user resets it.
    gone_peak: Mutex<usize>,
}

impl Usages {
    /// Counts of a thread that starts using the pool.
    pub fn join(&self) -> ThreadUsage {
        let u = ThreadUsage::default();
        self.all.lock().push(u.clone());
        u
    }

    /// The requests to keep buffers for, largest first: for each size, the most each thread
    /// held at once, added up. Every thread's interval starts afresh; the counts of threads
    /// that are gone and hold no live block are dropped.
    pub fn take_keep(&self) -> Vec<usize> {
        let mut all = self.all.lock();
        let mut keep: Vec<usize> = all.iter().flat_map(|u| u.lock().take_keep()).collect();
        // Held only here: no thread's cache and no live block refers to it any more.
        let mut gone = self.gone_peak.lock();
        all.retain(|u| {
            let stays = Arc::strong_count(u) > 1;
            if !stays {
                *gone += u.lock().live_peak;
            }
            stays
        });
        keep.sort_unstable_by(|a, b| b.cmp(a));
        keep
    }

    /// Bytes live now, every thread's.
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.all.lock().iter().map(|u| u.lock().live).sum()
    }

    /// The threads' peaks since the last reset, added up.
    pub fn live_peak(&self) -> usize {
        let threads: usize = self.all.lock().iter().map(|u| u.lock().live_peak).sum();
        threads + *self.gone_peak.lock()
    }

    /// Every thread's peak restarts from what it holds now.
    pub fn reset_peaks(&self) {
        for u in self.all.lock().iter() {
            let mut u = u.lock();
            u.live_peak = u.live;
        }
        *self.gone_peak.lock() = 0;
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
    fn threads_add_up_and_a_free_goes_to_the_allocating_thread() {
        let all = Usages::default();
        let (a, b) = (all.join(), all.join());
        a.lock().alloc(64);
        b.lock().alloc(64);
        // Thread b frees a's block: a's count goes down, as the live entry carries a's counts.
        a.lock().free(64);
        assert_eq!(all.take_keep(), vec![64, 64]);
        assert_eq!(all.take_keep(), vec![64], "b's block is still live");
        drop(a);
        let _ = all.take_keep();
        assert_eq!(all.all.lock().len(), 1, "a's counts went with a");
    }

    #[test]
    fn live_bytes_are_exact_and_peaks_add_up_per_thread_until_a_reset() {
        let all = Usages::default();
        let (a, b) = (all.join(), all.join());
        a.lock().alloc(100);
        a.lock().free(100);
        b.lock().alloc(30);
        assert_eq!(
            (all.live(), all.live_peak()),
            (30, 130),
            "an upper bound with two threads"
        );
        let one = Usages::default();
        let c = one.join();
        c.lock().alloc(100);
        c.lock().alloc(5);
        c.lock().free(100);
        assert_eq!(
            (one.live(), one.live_peak()),
            (5, 105),
            "exact with one thread"
        );
        all.reset_peaks();
        assert_eq!(all.live_peak(), 30);
        // A thread that is gone keeps its peak in the sum until the next reset.
        a.lock().alloc(500);
        a.lock().free(500);
        drop(a);
        let _ = all.take_keep();
        assert_eq!(all.live_peak(), 530);
        all.reset_peaks();
        assert_eq!(all.live_peak(), 30);
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
