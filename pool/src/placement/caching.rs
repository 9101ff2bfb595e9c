//! PyTorch's native CUDA caching allocator (`CUDACachingAllocator`, PyTorch 2.x defaults) as a
//! placement, so a trace shows what PyTorch would reserve for it:
//! - requests round up to 512 bytes (at least 512);
//! - rounded requests up to 1 MiB are *small* and come from 2 MiB segments; larger ones are
//!   *large* and come from 20 MiB segments below 10 MiB, else from a segment of their own size
//!   rounded up to 2 MiB; the two pools never lend to each other;
//! - a request takes the smallest free block of its pool that holds it, ties to the lowest
//!   address, and splits it when the rest is at least 512 bytes (small) or more than 1 MiB
//!   (large);
//! - a freed block merges with free neighbours of the same segment; memory goes back to the
//!   driver only when a whole segment is free and the cache is emptied (`empty_cache`, or an
//!   out-of-memory, after which the allocation is retried once: the core's flush-and-retry);
//! - the oversize rule, when `max_split_size` is set (`PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb`):
//!   blocks of at least that size are never split, a smaller request never takes one, and a
//!   larger request takes one only if it wastes less than 20 MiB.
//!
//! Not modelled: `roundup_power2_divisions`, `garbage_collection_threshold`, expandable
//! segments, and the step that frees oversize blocks before emptying the whole cache (it matters
//! only with `max_split_size` set).

use super::{Fit, Idle, Placement, Segment};
use crate::invalid::InvalidConfig;
use crate::pool::Purge;
use std::collections::{BTreeMap, BTreeSet};

const MIN_BLOCK: usize = 512;
const SMALL_SIZE: usize = 1 << 20;
const SMALL_BUFFER: usize = 2 << 20;
const LARGE_BUFFER: usize = 20 << 20;
const MIN_LARGE_ALLOC: usize = 10 << 20;
const ROUND_LARGE: usize = 2 << 20;

/// The caching allocator's settings. [`Default`] is PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CachingConfig {
    /// Blocks this large or larger are never split (PyTorch: unlimited, `usize::MAX`); at
    /// least 20 MiB, as PyTorch requires.
    pub max_split_size: usize,
}

impl Default for CachingConfig {
    fn default() -> Self {
        Self {
            max_split_size: usize::MAX,
        }
    }
}

impl CachingConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        InvalidConfig::range(
            "CachingConfig::max_split_size",
            self.max_split_size,
            LARGE_BUFFER,
            usize::MAX,
        )
    }
}

/// A request's size as PyTorch rounds it.
pub(crate) fn round_size(size: usize) -> usize {
    size.max(MIN_BLOCK).next_multiple_of(MIN_BLOCK)
}

/// The segment PyTorch asks the driver for when no free block holds a rounded request.
pub(crate) fn segment_size(rounded: usize) -> usize {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.next_multiple_of(ROUND_LARGE)
    }
}

#[derive(Clone, Copy, Debug)]
struct Blk {
    size: usize,
    /// The start of its segment: neighbours merge only within one.
    seg: u64,
    free: bool,
    /// Epoch of the latest free that this (merged) block holds.
    freed_at: u64,
}

/// PyTorch's caching policy. See the module docs.
#[derive(Debug, Default)]
pub struct Caching {
    config: CachingConfig,
    /// Every block, free or not, by address.
    blocks: BTreeMap<u64, Blk>,
    /// Free blocks of the small and the large pool, by (size, address): best fit is a range
    /// query.
    free: [BTreeSet<(usize, u64)>; 2],
    /// Segments by start address, and which pool each serves.
    segs: BTreeMap<u64, (Segment, bool)>,
}

fn pool_of(rounded: usize) -> usize {
    usize::from(rounded > SMALL_SIZE)
}

impl Caching {
    /// A placement with `config` (checked by [`CachingConfig::validate`] before).
    pub fn new(config: CachingConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Whether a free block of `block` bytes may serve a rounded request of `size` (the
    /// oversize rule).
    fn may_serve(&self, block: usize, size: usize) -> bool {
        let max = self.config.max_split_size;
        if size < max {
            block < max
        } else {
            block < size.saturating_add(LARGE_BUFFER)
        }
    }

    fn should_split(&self, block: usize, size: usize) -> bool {
        let rest = block - size;
        if size <= SMALL_SIZE {
            rest >= MIN_BLOCK
        } else {
            size < self.config.max_split_size && rest > SMALL_SIZE
        }
    }

    /// Hands out the free block at `addr` for a rounded request of `size`, splitting it.
    fn carve(&mut self, addr: u64, size: usize) -> Fit {
        let pool = pool_of(size);
        let b = self.blocks[&addr];
        self.free[pool].remove(&(b.size, addr));
        let capacity = if self.should_split(b.size, size) {
            let rest = Blk {
                size: b.size - size,
                ..b
            };
            self.blocks.insert(addr + size as u64, rest);
            self.free[pool].insert((rest.size, addr + size as u64));
            size
        } else {
            b.size
        };
        self.blocks.insert(
            addr,
            Blk {
                size: capacity,
                free: false,
                ..b
            },
        );
        Fit { addr, capacity }
    }

    fn is_small_seg(&self, seg: u64) -> bool {
        self.segs.get(&seg).is_some_and(|(_, small)| *small)
    }

    fn free_block(&self, addr: u64) -> Option<Blk> {
        self.blocks.get(&addr).copied().filter(|b| b.free)
    }
}

impl Placement for Caching {
    const RELEASES_ON_FREE: bool = false;

    fn alignment(&self) -> usize {
        MIN_BLOCK
    }

    fn take(&mut self, size: usize) -> Option<Fit> {
        let size = round_size(size);
        let pool = pool_of(size);
        let &(block, addr) = self.free[pool].range((size, 0)..).next()?;
        if !self.may_serve(block, size) {
            return None;
        }
        Some(self.carve(addr, size))
    }

    fn grow_request(&self, size: usize) -> usize {
        segment_size(round_size(size))
    }

    fn take_new(&mut self, seg: Segment, size: usize) -> Fit {
        let size = round_size(size);
        let small = size <= SMALL_SIZE;
        self.segs.insert(seg.ptr, (seg, small));
        self.blocks.insert(
            seg.ptr,
            Blk {
                size: seg.len,
                seg: seg.ptr,
                free: true,
                freed_at: 0,
            },
        );
        self.free[usize::from(!small)].insert((seg.len, seg.ptr));
        self.carve(seg.ptr, size)
    }

    fn give_back(&mut self, fit: Fit, freed_at: u64) -> Option<Segment> {
        let Some(mut b) = self.blocks.get(&fit.addr).copied() else {
            debug_assert!(false, "a block the caching placement never handed out");
            return None;
        };
        let pool = usize::from(!self.is_small_seg(b.seg));
        let mut addr = fit.addr;
        b.free = true;
        b.freed_at = b.freed_at.max(freed_at);
        // Merge with the next block of the segment, then the previous one.
        let next = addr + b.size as u64;
        if let Some(n) = self.free_block(next).filter(|n| n.seg == b.seg) {
            self.free[pool].remove(&(n.size, next));
            self.blocks.remove(&next);
            b.size += n.size;
            b.freed_at = b.freed_at.max(n.freed_at);
        }
        if let Some((&pa, &p)) = self.blocks.range(..addr).next_back() {
            if p.free && p.seg == b.seg {
                self.free[pool].remove(&(p.size, pa));
                self.blocks.remove(&addr);
                addr = pa;
                b.size += p.size;
                b.freed_at = b.freed_at.max(p.freed_at);
            }
        }
        self.blocks.insert(addr, b);
        self.free[pool].insert((b.size, addr));
        None
    }

    fn idle(&self, what: &Purge) -> Vec<Idle> {
        let whole: Vec<Idle> = self
            .segs
            .values()
            .filter_map(|&(seg, _)| {
                self.free_block(seg.ptr)
                    .filter(|b| b.size == seg.len)
                    .map(|b| Idle {
                        seg,
                        freed_at: b.freed_at,
                    })
            })
            .collect();
        match what {
            Purge::All => whole,
            Purge::SmallerThan(n) => whole.into_iter().filter(|i| i.seg.len < *n).collect(),
            Purge::KeepFor(requests) => {
                // Keep, request by request, the smallest whole free segment that holds it.
                let mut unclaimed = whole;
                for &r in requests {
                    let r = round_size(r);
                    let best = unclaimed
                        .iter()
                        .enumerate()
                        .filter(|(_, i)| {
                            i.seg.len >= r && self.is_small_seg(i.seg.ptr) == (r <= SMALL_SIZE)
                        })
                        .min_by_key(|(_, i)| (i.seg.len, i.seg.ptr))
                        .map(|(k, _)| k);
                    if let Some(k) = best {
                        unclaimed.remove(k);
                    }
                }
                unclaimed
            }
        }
    }

    fn remove(&mut self, seg: &Segment) {
        if let Some((_, small)) = self.segs.remove(&seg.ptr) {
            if let Some(b) = self.blocks.remove(&seg.ptr) {
                self.free[usize::from(!small)].remove(&(b.size, seg.ptr));
            }
        }
    }

    fn stranded(&self, size: usize) -> usize {
        let size = round_size(size);
        let pool = pool_of(size);
        let other: usize = self.free[1 - pool].iter().map(|&(s, _)| s).sum();
        let own: usize = self.free[pool]
            .iter()
            .map(|&(s, _)| s)
            .filter(|&s| s < size || !self.may_serve(s, size))
            .sum();
        other + own
    }

    fn segments(&self) -> Vec<Segment> {
        self.segs.values().map(|&(s, _)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn seg(ptr: u64, len: usize) -> Segment {
        Segment {
            ptr,
            len,
            handle: 0,
        }
    }

    #[test]
    fn rounding_and_segment_sizes_are_pytorchs() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(round_size(MIB)), 2 * MIB);
        assert_eq!(segment_size(round_size(MIB + 1)), 20 * MIB);
        assert_eq!(segment_size(round_size(10 * MIB - 512)), 20 * MIB);
        assert_eq!(segment_size(round_size(10 * MIB)), 10 * MIB);
        assert_eq!(segment_size(round_size(11 * MIB + 1)), 12 * MIB);
    }

    #[test]
    fn splits_merges_and_keeps_pools_apart() {
        let mut c = Caching::default();
        assert_eq!(c.take(1000), None);
        let a = c.take_new(seg(1 << 30, 2 * MIB), 1000);
        assert_eq!(
            a,
            Fit {
                addr: 1 << 30,
                capacity: 1024
            }
        );
        let b = c.take(4096).unwrap();
        assert_eq!(b.addr, (1 << 30) + 1024);
        // A large request never takes from a small segment.
        assert_eq!(c.take(3 * MIB), None);
        let big = c.take_new(seg(2 << 30, 20 * MIB), 3 * MIB);
        assert_eq!(big.capacity, 3 * MIB); // 17 MiB left: split
        let rest = c.take(16 * MIB + 512).unwrap();
        assert_eq!(rest.capacity, 17 * MIB); // 1 MiB - 512 left: not split
        assert!(c.idle(&Purge::All).is_empty());
        c.give_back(big, 1);
        c.give_back(rest, 2);
        let idle = c.idle(&Purge::All);
        assert_eq!(
            idle,
            vec![Idle {
                seg: seg(2 << 30, 20 * MIB),
                freed_at: 2
            }]
        );
        c.give_back(a, 3);
        assert_eq!(
            c.idle(&Purge::All).len(),
            1,
            "the small segment still holds b"
        );
        c.give_back(b, 4);
        assert_eq!(c.idle(&Purge::All).len(), 2);
        assert_eq!(c.idle(&Purge::SmallerThan(3 * MIB)).len(), 1);
        assert_eq!(c.idle(&Purge::KeepFor(vec![5 * MIB])).len(), 1);
        for i in c.idle(&Purge::All) {
            c.remove(&i.seg);
        }
        assert!(c.segments().is_empty() && c.blocks.is_empty());
    }

    #[test]
    fn oversize_rule() {
        let mut c = Caching::new(CachingConfig {
            max_split_size: 64 * MIB,
        });
        let big = c.take_new(seg(1 << 32, 100 * MIB), 100 * MIB);
        c.give_back(big, 0);
        // A request under the limit never takes an oversize block ...
        assert_eq!(c.take(30 * MIB), None);
        // ... one above it does only if it wastes less than 20 MiB, and gets it whole.
        assert_eq!(c.take(70 * MIB), None);
        assert_eq!(
            c.take(90 * MIB),
            Some(Fit {
                addr: 1 << 32,
                capacity: 100 * MIB
            })
        );
    }
}
