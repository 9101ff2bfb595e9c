//! Lanes: an address range of its own for each tensor that grows by replacement.
//!
//! PyTorch's KV cache grows by `torch.cat`: every chunk, each layer's keys and values are
//! copied into a tensor a few MiB larger and the old one is freed. In one contiguous range
//! ([`super::bump::Bump`]) the old tensor leaves a hole just too small for the next grown copy,
//! so its pages either stay behind free space or are moved, a few driver calls each
//! (`upstream/vmm/recycle.rs`). On the Phi-3 prefill trace that held the reserve at 1.064 of
//! the live peak with 1,749 pages moved (data/cpu-2026-11-27-recycle-sweep).
//!
//! A lane is address space apart from the range ([`LANE_BYTES`], from the upstream's
//! [`crate::upstream::Upstream::acquire_apart`]) with one block at its start. A freed lane
//! keeps its pages mapped, and the next large block that covers them and needs at most
//! [`GROW`] bytes more lands there: only its growth gets new memory, and nothing is left behind
//! free space. Among the free lanes that fit, the one with the most memory behind the block.
//! When every lane is free at once (the requests that used them ended), the next lanes to open
//! are those, taken again in the order they opened, also where no lane may open any more
//! (`again.rs`).
//!
//! A lane opens where a replacement is seen: a large block is freed while one of the last
//! [`RECENT`] large blocks allocated is larger by at most [`GROW`] (its grown copy, allocated
//! before the old one goes). The next large block of at most [`GROW`] bytes that no free lane
//! takes opens it, so a cache enters lanes while its tensors are small and stays there as they
//! grow. Modelled on the recorded traces before it was built (`scripts/torch/slot-sim.py`).
//!
//! A lane of short-lived blocks (an activation's) grows no more (`transient.rs`). Replayed: Phi-3
//! 1.012 of the live peak, no page moved, Llama-3 1.014, the MoE 1.008 (1.006 without lanes).
//!
//! Lanes only take blocks the core places with [`Placement::take_backed`] (a recycling VMM
//! pool's large requests); everything else goes to the inner placement unchanged. A free
//! lane's range, and the free end of a busy one, are free spans: their pages may be moved to
//! other blocks or shed like any hole's (but the memory a lane taken again keeps for its
//! cache: `again.rs`). A trim gives their memory back and keeps their address space (`trim.rs`).
//!
//! Where the upstream makes memory ahead of need (`CUPOOL_VMM_AHEAD`), the lanes name what
//! their next copies will need (`ahead.rs`).

mod again;
mod ahead;
mod copy;
mod lane;
mod transient;
mod trim;

use lane::Lane;

pub use ahead::AHEAD;
pub use transient::{SHORT_LIFE, TRANSIENT_AFTER};

use super::{Fit, Idle, Placement, Segment};
use crate::pool::Purge;
use std::collections::{BTreeMap, BTreeSet};

/// Address space of one lane (1 GiB): a block larger than this never goes to a lane.
pub const LANE_BYTES: usize = 1 << 30;

/// The most a block may grow over a freed lane's memory to land there, and over its
/// predecessor to count as a replacement (16 MiB).
pub const GROW: usize = 16 << 20;

/// Large allocations remembered to recognise a replacement.
pub const RECENT: usize = 4;

/// The most lanes a pool opens (1 TiB of address space at [`LANE_BYTES`]).
pub const MAX_LANES: usize = 1024;

/// Memory behind a freed lane beyond the block that lands there, at most (8 MiB, one page of
/// the recycling pool's default): it stays behind the lane's free end, a free span like any
/// hole. Replayed on the PyTorch prefill traces (data/cpu-2026-11-27-lanes), 8 MiB kept the
/// reserve at 1.020, 1.019 and 1.017 of the live peak for Phi-3, Llama-3 and the MoE, where one
/// 2 MiB granule kept 1.020, 1.021 and 1.020.
const SPILL: usize = 8 << 20;

/// The granule the upstream maps in (2 MiB on every CUDA GPU): a block's pages reach at most
/// this far past it.
const SPILL_GRANULE: usize = 2 << 20;

/// See the module docs.
#[derive(Debug)]
pub struct Lanes<P> {
    inner: P,
    /// Requests above [`super::bump::LARGE`] are rounded up to a multiple of this.
    rounding: usize,
    lanes: BTreeMap<u64, Lane>,
    /// The free lanes by (capacity of their last block, address): a block looks only at those
    /// whose memory it may take, however many lanes there are.
    free: BTreeSet<(usize, u64)>,
    /// Lanes to open: replacements seen, not yet given a lane.
    pending: usize,
    /// The left lanes by (when they opened, address): the next request takes them in that
    /// order (`again.rs`).
    left_order: BTreeSet<(u64, u64)>,
    /// Capacities of the last large blocks allocated, newest last.
    recent: [usize; RECENT],
    /// Large blocks allocated so far: the clock a block's life is counted in.
    clock: u64,
    /// Whether the last [`Placement::take_backed`] left a request for a new lane.
    asked: bool,
    /// Whether lanes may open (the upstream refused address space apart: never again).
    enabled: bool,
    /// The busy lanes expected to grow ([`Lanes::growth`] at landing), by (when their block
    /// was placed, address), oldest first: the copies of a growing cache, replaced in the order
    /// they were placed ([`Placement::ahead`]).
    growing: BTreeSet<(u64, u64)>,
    /// Blocks placed in lanes so far.
    placed: u64,
    /// The range of the lane the last block landed in that no block ever used
    /// ([`Placement::take_excess`]).
    excess: Option<(u64, usize)>,
    /// Whether [`Placement::ahead`] names the growing lanes' next growth (off where nothing
    /// makes memory ahead: then nothing is kept from recycling for it either).
    predicts: bool,
    /// Whether the core makes what [`Placement::ahead`] names now ([`Placement::made_ahead`]):
    /// not after a block ran out of memory, until a purge.
    made: bool,
    /// Bytes asked for by the last large block, and what the last two long-lived blocks
    /// freed in lanes grew by in the copies that replaced them, newest last (`ahead.rs`).
    last_size: usize,
    copies_grew: [usize; 2],
    /// Lanes through a trim (`trim.rs`).
    trim: trim::Trim,
}

impl<P: Placement> Lanes<P> {
    /// Lanes over `inner`, whose large blocks are rounded up to a multiple of `rounding`.
    pub fn new(inner: P, rounding: usize) -> Self {
        Self {
            inner,
            rounding: rounding.max(super::bump::VMM_ALIGN),
            lanes: BTreeMap::new(),
            free: BTreeSet::new(),
            pending: 0,
            left_order: BTreeSet::new(),
            recent: [0; RECENT],
            clock: 0,
            asked: false,
            enabled: true,
            growing: BTreeSet::new(),
            excess: None,
            predicts: true,
            made: true,
            placed: 0,
            last_size: 0,
            copies_grew: [0; 2],
            trim: trim::Trim::default(),
        }
    }

    #[inline]
    fn rounded(&self, size: usize) -> usize {
        // Sizes are at most MAX_REQUEST and the rounding at most 1 GiB: no overflow.
        size.next_multiple_of(self.rounding)
    }

    #[inline]
    fn note(&mut self, capacity: usize) {
        if capacity > super::bump::LARGE {
            self.clock += 1;
            self.recent.rotate_left(1);
            self.recent[RECENT - 1] = capacity;
        }
    }

    /// Whether a block of `n` bytes opens a lane when no free lane takes it.
    fn opens(&self, n: usize) -> bool {
        self.enabled && self.pending > 0 && n <= GROW && self.lanes.len() < MAX_LANES
    }
}

impl<P: Placement> Placement for Lanes<P> {
    const RELEASES_ON_FREE: bool = P::RELEASES_ON_FREE;

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn copy_state(&self) -> Option<Self> {
        self.copied()
    }

    #[inline]
    fn take(&mut self, size: usize) -> Option<Fit> {
        self.asked = false;
        let fit = self.inner.take(size)?;
        self.note(fit.capacity);
        Some(fit)
    }

    fn take_backed(&mut self, size: usize, unbacked: &dyn Fn(u64, usize) -> usize) -> Option<Fit> {
        self.asked = false;
        self.last_size = size;
        let n = self.rounded(size);
        if n <= LANE_BYTES && !self.lanes.is_empty() {
            if let Some((at, again)) = self.free_lane(n, unbacked) {
                if again {
                    self.take_again(at, n);
                }
                if let Some(lane) = self.lanes.get_mut(&at) {
                    self.free.remove(&(lane.last, at));
                    lane.reach = lane.reach.max(n);
                    lane.used = n;
                    lane.lives.landed(self.clock);
                    lane.ahead_end = 0;
                    self.placed += 1;
                    lane.placed = self.placed;
                    // What it grew by over the lane's last block: what the block that
                    // replaces it will grow by (each copy of a cache grows alike).
                    lane.landed(size);
                    lane.handed = lane.handed.max(n);
                    lane.landed_since_shed(n);
                    // Memory made ahead for a larger copy than came (a last, shorter chunk)
                    // goes back at once: no kernel ever used it. (None where nothing is made
                    // ahead.)
                    let end = lane.handed.next_multiple_of(SPILL_GRANULE);
                    if self.predicts && end < lane.seg.len {
                        self.excess = Some((at + end as u64, lane.seg.len - end));
                    }
                    let l = *lane;
                    if self.growth(&l, false) > 0 {
                        self.growing.insert((l.placed, at));
                    }
                    if l.shed && l.used < l.handed {
                        self.trim.regrowing.insert((l.placed, at));
                    }
                }
                self.note(n);
                self.forget_never_used(at);
                return Some(Fit {
                    addr: at,
                    capacity: n,
                });
            }
        }
        if self.opens(n) {
            // The core grows: address space apart ([`Placement::apart`]). (Opening it only
            // where the range has no memory for the block, replayed: Phi-3 1.015, Llama-3
            // 1.031, the MoE 1.012 of the live peak; its KV cache enters lanes late.)
            self.asked = true;
            return None;
        }
        let fit = self.inner.take_backed(size, unbacked)?;
        self.note(fit.capacity);
        Some(fit)
    }

    fn apart(&self, size: usize) -> Option<usize> {
        (self.asked && self.opens(self.rounded(size))).then_some(LANE_BYTES)
    }

    fn take_apart(&mut self, seg: Segment, size: usize) -> Fit {
        let n = self.rounded(size);
        self.asked = false;
        self.pending = self.pending.saturating_sub(1);
        self.placed += 1;
        let lane = Lane::opened(seg, n, size, self.placed, self.clock);
        self.lanes.insert(seg.ptr, lane);
        self.note(n);
        Fit {
            addr: seg.ptr,
            capacity: n,
        }
    }

    fn apart_refused(&mut self) {
        self.asked = false;
        self.enabled = false;
        self.pending = 0;
    }

    fn grow_request(&self, size: usize) -> usize {
        self.inner.grow_request(size)
    }

    fn grow_alone(&self, size: usize) -> usize {
        self.inner.grow_alone(size)
    }

    fn take_new(&mut self, seg: Segment, size: usize) -> Fit {
        self.asked = false;
        let fit = self.inner.take_new(seg, size);
        self.note(fit.capacity);
        fit
    }

    #[inline]
    fn give_back(&mut self, fit: Fit, freed_at: u64) -> Option<Segment> {
        let short = transient::short_life(self.lanes.len());
        let named = self
            .lanes
            .get(&fit.addr)
            .map_or(0, |l| self.named_from_copies(fit.addr, l));
        if let Some(lane) = self.lanes.get_mut(&fit.addr) {
            lane.ahead_end = named;
            let mut replaced = None;
            if lane.used > 0 {
                if !lane.lives.freed(self.clock, short) {
                    replaced = Some(lane.size);
                }
                lane.last = lane.used;
                self.free.insert((lane.last, fit.addr));
                self.growing.remove(&(lane.placed, fit.addr));
                self.trim.regrowing.remove(&(lane.placed, fit.addr));
            }
            lane.used = 0;
            // A block never handed out (a failed backing) comes back at the epoch of its
            // failure; keep the latest of the two, so the lane's memory waits for the device
            // to pass every free of a block in it.
            lane.freed_at = lane.freed_at.max(freed_at);
            if let Some(size) = replaced {
                self.note_replaced(size);
            }
            self.leave_all_if_free();
            return None;
        }
        self.note_free(fit.capacity);
        self.inner.give_back(fit, freed_at)
    }

    fn idle(&self, what: &Purge) -> Vec<Idle> {
        let mut out = self.lanes_idle(what);
        out.extend(self.inner.idle(what));
        out
    }

    fn kept_on_purge(&self) -> Vec<Idle> {
        let mut out = self.lanes_kept_on_purge();
        out.extend(self.inner.kept_on_purge());
        out
    }

    fn closing(&mut self) {
        self.trim.closing = true;
        self.inner.closing();
    }

    fn kept_given_back(&mut self, seg: &Segment) {
        if !self.lane_given_back(seg) {
            self.inner.kept_given_back(seg);
        }
    }

    fn take_never_used(&mut self) -> Vec<(u64, usize)> {
        std::mem::take(&mut self.trim.never_used)
    }

    fn remove(&mut self, seg: &Segment) {
        if let Some(l) = self.lanes.get(&seg.ptr).filter(|l| l.seg == *seg) {
            self.free.remove(&(l.last, seg.ptr));
            self.growing.remove(&(l.placed, seg.ptr));
            self.trim.regrowing.remove(&(l.placed, seg.ptr));
            self.left_order.remove(&(l.opened, seg.ptr));
            if !self.enabled {
                // Lanes to take again, where none may open: no more than are left.
                self.pending = self.pending.min(self.left_order.len());
            }
            self.lanes.remove(&seg.ptr);
        } else {
            self.inner.remove(seg);
        }
    }

    fn stranded(&self, size: usize) -> usize {
        self.inner.stranded(size)
    }

    fn free_spans(&self) -> (Vec<(u64, usize)>, u64) {
        let (mut spans, mut last) = self.inner.free_spans();
        for (&at, l) in &self.lanes {
            // The growth asked for ahead is not free to move: it would be made again.
            let kept = self.kept(at, l);
            if kept < l.seg.len {
                spans.push((at + kept as u64, l.seg.len - kept));
            }
            last = last.max(l.freed_at);
        }
        (spans, last)
    }

    fn segments(&self) -> Vec<Segment> {
        let mut out = self.inner.segments();
        out.extend(self.lanes.values().map(|l| l.seg));
        out
    }

    fn take_excess(&mut self) -> Option<(u64, usize)> {
        self.excess.take()
    }

    fn surplus(&self, f: &mut dyn FnMut(u64, usize)) {
        self.name_surplus(f)
    }

    fn ahead(&self, f: &mut dyn FnMut(u64, usize)) {
        self.name_ahead(f)
    }

    fn made_ahead(&mut self, made: bool) {
        self.made = made;
    }
}
