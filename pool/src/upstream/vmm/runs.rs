//! Disjoint address ranges in a sorted array: the vacant ranges of an address space.
//!
//! The placement asks how much of a range is vacant for every free lane it weighs on every
//! large allocation (about five times per block on the recorded PyTorch prefills), while the
//! ranges change only where memory is mapped or unmapped. A binary search over one array
//! answers the question with a few cache lines and no pointer chasing; a `BTreeMap` range
//! query descends the tree twice (once for each end of the range) before it yields. Replayed
//! through libcupool on the recorded Phi-3 prefill (callgrind, `benches/torch_trace.rs`), the
//! lookups were 21% of the instructions of an allocation with the map.
//!
//! A change moves the entries after it, which a pool's few hundred ranges (one per lane, the
//! range's tail and its holes) make a short copy, on a path that already calls the driver.

use crate::driver::DevicePtr;

/// Disjoint ranges `(start, end)`, sorted by start (see the module docs). Callers keep them
/// disjoint and merged; the type keeps them sorted.
#[derive(Clone, Debug, Default)]
pub(super) struct Runs(Vec<(DevicePtr, DevicePtr)>);

impl Runs {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every range, in address order.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = (DevicePtr, DevicePtr)> + '_ {
        self.0.iter().copied()
    }

    /// The ranges that start before `at`, the last first.
    #[inline]
    pub(super) fn before(
        &self,
        at: DevicePtr,
    ) -> impl Iterator<Item = (DevicePtr, DevicePtr)> + '_ {
        let n = self.0.partition_point(|r| r.0 < at);
        self.0[..n].iter().rev().copied()
    }

    /// The last range that starts at or before `at`.
    pub(super) fn last_by(&self, at: DevicePtr) -> Option<(DevicePtr, DevicePtr)> {
        let n = self.0.partition_point(|r| r.0 <= at);
        n.checked_sub(1).map(|i| self.0[i])
    }

    /// The ranges that start in `[from, to)`, in address order.
    pub(super) fn starting_in(
        &self,
        from: DevicePtr,
        to: DevicePtr,
    ) -> impl Iterator<Item = (DevicePtr, DevicePtr)> + '_ {
        let a = self.0.partition_point(|r| r.0 < from);
        let b = a + self.0[a..].partition_point(|r| r.0 < to);
        self.0[a..b].iter().copied()
    }

    /// Adds `[start, end)`, which overlaps none of the ranges.
    pub(super) fn insert(&mut self, start: DevicePtr, end: DevicePtr) {
        let i = self.0.partition_point(|r| r.0 < start);
        debug_assert!(
            i == 0 || self.0[i - 1].1 <= start,
            "overlaps the range before"
        );
        debug_assert!(
            self.0.get(i).is_none_or(|r| r.0 >= end),
            "overlaps the range after"
        );
        self.0.insert(i, (start, end));
    }

    /// Removes the range that starts at `start`, if there is one.
    pub(super) fn remove(&mut self, start: DevicePtr) {
        if let Ok(i) = self.0.binary_search_by_key(&start, |r| r.0) {
            self.0.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Every query answers what the same question to a `BTreeMap` of the ranges answers,
        /// after random inserts and removals.
        #[test]
        fn queries_agree_with_a_sorted_map(
            ops in proptest::collection::vec((any::<bool>(), 0u64..64, 1u64..4), 0..40),
            at in 0u64..80,
            len in 0u64..20,
        ) {
            let (mut runs, mut map) = (Runs::default(), BTreeMap::new());
            for (add, s, n) in ops {
                if add {
                    let clear = map.iter().all(|(&a, &b): (&u64, &u64)| b <= s || a >= s + n);
                    if clear {
                        runs.insert(s, s + n);
                        map.insert(s, s + n);
                    }
                } else {
                    runs.remove(s);
                    map.remove(&s);
                }
            }
            let pairs = |m: &BTreeMap<u64, u64>| m.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>();
            prop_assert_eq!(runs.iter().collect::<Vec<_>>(), pairs(&map));
            prop_assert_eq!(
                runs.before(at).collect::<Vec<_>>(),
                map.range(..at).rev().map(|(&a, &b)| (a, b)).collect::<Vec<_>>()
            );
            prop_assert_eq!(
                runs.last_by(at),
                map.range(..=at).next_back().map(|(&a, &b)| (a, b))
            );
            prop_assert_eq!(
                runs.starting_in(at, at + len).collect::<Vec<_>>(),
                map.range(at..at + len).map(|(&a, &b)| (a, b)).collect::<Vec<_>>()
            );
        }
    }
}
