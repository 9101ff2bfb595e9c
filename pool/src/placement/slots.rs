//! ggml's legacy pool (`ggml_cuda_pool_leg`) as a placement, decision for decision:
//! - a fixed table of slots holds only *idle* buffers;
//! - a request takes the smallest buffer of at least its size whose excess is below
//!   `max_excess` (ggml: 64 GiB), scanning the slots in order, ties to the lowest slot, an exact
//!   fit ending the scan; the caller gets the whole buffer;
//! - with no fit, a new buffer of `round_up((size_t)(look_ahead * size), rounding)` bytes;
//! - a freed buffer goes to the first empty slot; with every slot taken it is released.

use super::{Fit, Idle, Placement, Segment};
use crate::invalid::InvalidConfig;
use crate::pool::Purge;

/// The legacy policy. [`Default`] is ggml's.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotsConfig {
    /// Idle-buffer slots (ggml: 256), 1 to 65,536.
    pub slots: usize,
    /// Factor a new buffer is grown by (ggml: 1.05), 1 to 16.
    pub look_ahead: f64,
    /// New buffer sizes are rounded up to this (ggml: 256), 1 byte to 1 GiB.
    pub rounding: usize,
    /// An idle buffer this much larger than the request is never chosen (ggml: 64 GiB).
    pub max_excess: usize,
}

impl Default for SlotsConfig {
    fn default() -> Self {
        Self {
            slots: 256,
            look_ahead: 1.05,
            rounding: 256,
            max_excess: 1 << 36,
        }
    }
}

impl SlotsConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        InvalidConfig::range("LegacyConfig::slots", self.slots, 1, 1 << 16)?;
        if !(self.look_ahead.is_finite() && (1.0..=16.0).contains(&self.look_ahead)) {
            return Err(InvalidConfig::new(
                "LegacyConfig::look_ahead",
                self.look_ahead,
                "a finite number from 1.0 to 16.0",
            ));
        }
        InvalidConfig::range("LegacyConfig::rounding", self.rounding, 1, 1 << 30)?;
        InvalidConfig::range("LegacyConfig::max_excess", self.max_excess, 1, usize::MAX)?;
        Ok(())
    }

    /// The size of a new buffer for `size` bytes: `round_up((size_t)(look_ahead * size),
    /// rounding)`, in double precision and truncated as ggml computes it. Sizes are at most
    /// [`crate::MAX_REQUEST`] and the factor at most 16, so nothing overflows.
    pub fn grow_size(&self, size: usize) -> usize {
        let ahead = ((self.look_ahead * size as f64) as usize).max(size);
        ahead
            .checked_next_multiple_of(self.rounding)
            .unwrap_or(usize::MAX)
    }
}

/// The idle-buffer table. Parallel arrays plus an occupancy bitmap, so the scans touch only
/// occupied slots, in index order, exactly as ggml's loop visits them; and the occupied slots
/// sorted by (size, slot), where a request finds ggml's choice without the scan: the smallest
/// excess is the smallest size that fits, and among equal sizes the scan keeps the lowest slot.
/// A pool whose requests outgrow its buffers fills every slot (the stranding ggml is known
/// for), and the scan then walked all 256 at each request.
///
/// An entry of the sorted list stays when its slot empties, and counts only while the slot
/// holds that size again ([`Slots::live`]): a pool takes and returns the same few sizes over
/// and over, mostly to the same slots, so a request and a free find their entry in place
/// instead of moving the entries above it (a `memmove` at every allocation and every free,
/// a tenth of a dry run's time). The dead entries are dropped once they outnumber the live
/// ones.
#[derive(Clone, Debug)]
pub struct Slots {
    config: SlotsConfig,
    ptr: Vec<u64>,
    size: Vec<usize>,
    freed_at: Vec<u64>,
    occupied: Vec<Line>,
    /// Every occupied slot's (size, slot), and some that were, ascending; no key twice.
    by_size: Vec<(usize, u32)>,
    /// Occupied slots.
    live: usize,
    /// Where the last searches ended, by request size (hashed): a request size recurs, and
    /// checking that the entries around its last position still bracket it is cheaper than
    /// searching again.
    near: [(usize, u32); NEAR],
    /// Each slot's entry's position when last indexed, checked the same way.
    at: Vec<u32>,
}

/// Request sizes whose search result [`Slots`] remembers.
const NEAR: usize = 16;

/// Words of the claims `idle_bytes` marks without a list (64 positions each).
const CLAIMS: usize = 9;

/// 1,024 occupancy bits on cache lines of their own: the bitmap is written by every allocation
/// and free, so it must not share a line with another pool's data (threads on their own pools
/// would otherwise slow each other down).
#[repr(C, align(128))]
#[derive(Clone, Copy, Debug, Default)]
struct Line([u64; 16]);

impl Slots {
    /// An empty table; the configuration must have passed [`SlotsConfig::validate`].
    pub fn new(config: SlotsConfig) -> Self {
        let n = config.slots;
        Self {
            config,
            ptr: vec![0; n],
            size: vec![0; n],
            freed_at: vec![0; n],
            occupied: vec![Line::default(); n.div_ceil(1024)],
            by_size: Vec::with_capacity(n),
            live: 0,
            near: [(0, 0); NEAR],
            at: vec![0; n],
        }
    }

    /// The policy in force.
    pub fn config(&self) -> &SlotsConfig {
        &self.config
    }

    /// Sizes of the idle buffers, in slot order.
    pub fn cached_sizes(&self) -> Vec<usize> {
        self.iter().map(|i| self.size[i]).collect()
    }

    /// The bitmap's words that hold slots.
    #[inline]
    fn words(&self) -> &[u64] {
        let n = self.ptr.len().div_ceil(64);
        // SAFETY: `Line` is `repr(C)` around `[u64; 16]` with no padding (128 bytes, aligned
        // to 128), so the lines are `16 * len` contiguous, initialised words, and `n` is at
        // most that (`new` makes `slots.div_ceil(1024)` lines).
        unsafe { std::slice::from_raw_parts(self.occupied.as_ptr().cast::<u64>(), n) }
    }

    #[inline]
    fn word_mut(&mut self, w: usize) -> &mut u64 {
        &mut self.occupied[w / 16].0[w % 16]
    }

    /// Occupied slot indices, ascending.
    #[inline]
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words().iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                if b == 0 {
                    return None;
                }
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                Some(w * 64 + i)
            })
        })
    }

    #[inline]
    fn first_empty(&self) -> Option<usize> {
        self.words().iter().enumerate().find_map(|(w, &bits)| {
            let i = w * 64 + (!bits).trailing_zeros() as usize;
            (bits != u64::MAX && i < self.ptr.len()).then_some(i)
        })
    }

    /// The position of the first entry of at least `size` bytes.
    #[inline]
    fn first_of(&mut self, size: usize) -> usize {
        let h = size.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (usize::BITS - NEAR.ilog2());
        let (s, k) = self.near[h];
        let k = k as usize;
        let v = &self.by_size;
        if s == size
            && k <= v.len()
            && (k == 0 || v[k - 1].0 < size)
            && (k == v.len() || v[k].0 >= size)
        {
            return k;
        }
        let k = v.partition_point(|&(s, _)| s < size);
        // The list is at most 2 × 65,536 + 16 entries long (`index`).
        self.near[h] = (size, k as u32);
        k
    }

    /// Whether entry `(s, i)` of the sorted list stands for an idle buffer: slot `i` is
    /// occupied, by one of `s` bytes.
    #[inline]
    fn live(&self, (s, i): (usize, u32)) -> bool {
        let i = i as usize;
        self.words()[i / 64] & (1 << (i % 64)) != 0 && self.size[i] == s
    }

    /// The live entries of the sorted list, ascending.
    fn live_entries(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.by_size.iter().copied().filter(|&e| self.live(e))
    }

    /// Empties occupied slot `i`: its entry is dead from now on.
    #[inline]
    fn clear(&mut self, i: usize) {
        *self.word_mut(i / 64) &= !(1 << (i % 64));
        self.live -= 1;
    }

    /// Makes slot `i`, now holding `len` bytes, an entry of the sorted list: the one it had if
    /// it held that size before, else a new one (dropping the dead ones first where they
    /// outnumber the live ones, so that the list and a request's walk past them stay short).
    #[inline]
    fn index(&mut self, len: usize, i: usize) {
        // Slots number at most 65,536 (`SlotsConfig::validate`).
        let key = (len, i as u32);
        if self.by_size.get(self.at[i] as usize) == Some(&key) {
            return;
        }
        let mut k = self.by_size.partition_point(|&e| e < key);
        if self.by_size.get(k) != Some(&key) {
            if self.by_size.len() >= 2 * self.live + 16 {
                self.compact();
                k = self.by_size.partition_point(|&e| e < key);
            }
            self.by_size.insert(k, key);
        }
        self.at[i] = k as u32;
    }

    /// Drops the dead entries.
    #[cold]
    fn compact(&mut self) {
        let mut by_size = std::mem::take(&mut self.by_size);
        by_size.retain(|&e| self.live(e));
        self.by_size = by_size;
    }

    fn idle_at(&self, i: usize) -> Idle {
        Idle {
            seg: Segment {
                ptr: self.ptr[i],
                len: self.size[i],
                handle: 0,
            },
            freed_at: self.freed_at[i],
        }
    }
}

impl Placement for Slots {
    const RELEASES_ON_FREE: bool = true;

    fn alignment(&self) -> usize {
        256
    }

    // The table is every buffer the pool holds idle: with none live, all it holds.
    fn copy_state(&self) -> Option<Self> {
        Some(self.clone())
    }

    #[inline]
    fn take(&mut self, size: usize) -> Option<Fit> {
        // What `best_fit` over every slot chooses: the first live entry of at least `size`
        // bytes.
        let k = self.first_of(size);
        let (s, i) = self.by_size[k..].iter().copied().find(|&e| self.live(e))?;
        if s - size >= self.config.max_excess {
            return None;
        }
        let i = i as usize;
        self.clear(i);
        Some(Fit {
            addr: self.ptr[i],
            capacity: self.size[i],
        })
    }

    fn grow_request(&self, size: usize) -> usize {
        self.config.grow_size(size)
    }

    fn take_new(&mut self, seg: Segment, _size: usize) -> Fit {
        Fit {
            addr: seg.ptr,
            capacity: seg.len,
        }
    }

    #[inline]
    fn give_back(&mut self, fit: Fit, freed_at: u64) -> Option<Segment> {
        let Some(i) = self.first_empty() else {
            return Some(Segment {
                ptr: fit.addr,
                len: fit.capacity,
                handle: 0,
            });
        };
        self.ptr[i] = fit.addr;
        self.size[i] = fit.capacity;
        self.freed_at[i] = freed_at;
        *self.word_mut(i / 64) |= 1 << (i % 64);
        self.live += 1;
        self.index(fit.capacity, i);
        None
    }

    fn idle(&self, what: &Purge) -> Vec<Idle> {
        match what {
            Purge::All => self.iter().map(|i| self.idle_at(i)).collect(),
            Purge::SmallerThan(n) => self
                .iter()
                .filter(|&i| self.size[i] < *n)
                .map(|i| self.idle_at(i))
                .collect(),
            Purge::KeepFor(requests) => {
                // Claim, request by request, the buffer `take` would choose; the rest go.
                let mut unclaimed: Vec<(usize, u32)> = self.live_entries().collect();
                for &r in requests {
                    let size = r.max(1);
                    let k = unclaimed.partition_point(|&(s, _)| s < size);
                    if unclaimed
                        .get(k)
                        .is_some_and(|&(s, _)| s - size < self.config.max_excess)
                    {
                        unclaimed.remove(k);
                    }
                }
                let mut left: Vec<usize> = unclaimed.into_iter().map(|(_, i)| i as usize).collect();
                // In slot order, as the scan lists them.
                left.sort_unstable();
                left.into_iter().map(|i| self.idle_at(i)).collect()
            }
        }
    }

    fn idle_bytes(&self, what: &Purge, bytes: &mut dyn FnMut(&Segment) -> usize) -> usize {
        let seg = |i: usize| self.idle_at(i).seg;
        // `idle`'s claims, marked on the sorted list's positions instead of listing what is
        // left (a table of ggml's 256 slots has at most 528 entries: `index`).
        let requests = match what {
            Purge::KeepFor(r) if self.by_size.len() <= 64 * CLAIMS => r,
            Purge::KeepFor(_) => return self.idle(what).iter().map(|i| bytes(&i.seg)).sum(),
            Purge::SmallerThan(n) => {
                let small = self.iter().filter(|&i| self.size[i] < *n);
                return small.map(|i| bytes(&seg(i))).sum();
            }
            Purge::All => return self.iter().map(|i| bytes(&seg(i))).sum(),
        };
        let mut claimed = [0u64; CLAIMS];
        let free = |claimed: &[u64; CLAIMS], j: usize| claimed[j / 64] & (1 << (j % 64)) == 0;
        for &r in requests {
            let size = r.max(1);
            let k = self.by_size.partition_point(|&(s, _)| s < size);
            let first =
                (k..self.by_size.len()).find(|&j| free(&claimed, j) && self.live(self.by_size[j]));
            if let Some(j) = first.filter(|&j| self.by_size[j].0 - size < self.config.max_excess) {
                claimed[j / 64] |= 1 << (j % 64);
            }
        }
        (0..self.by_size.len())
            .filter(|&j| free(&claimed, j) && self.live(self.by_size[j]))
            .map(|j| bytes(&seg(self.by_size[j].1 as usize)))
            .sum()
    }

    fn remove(&mut self, seg: &Segment) {
        let found = self.iter().find(|&i| self.ptr[i] == seg.ptr);
        if let Some(i) = found {
            self.clear(i);
        }
    }

    fn stranded(&self, size: usize) -> usize {
        self.iter()
            .map(|i| self.size[i])
            .filter(|&s| s < size)
            .sum()
    }

    fn segments(&self) -> Vec<Segment> {
        self.iter().map(|i| self.idle_at(i).seg).collect()
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
