//! Lanes through a trim: a purge of everything (`cupool.trim()`, which a PyTorch user calls
//! where `torch.cuda.empty_cache()` would go: that one does not reach cupool)
//! gives back the memory of the free lanes and keeps their address space, and the next request,
//! which takes the lanes again (`again.rs`), has their memory made again ahead of its blocks.
//!
//! Released with their address space, the lanes opened again at the next request, and every
//! copy of its first chunks mapped its memory where it landed, on the allocating thread: the
//! recorded H200 prefills replayed as `scripts/torch/trace_cost.py` replays them, a trim before
//! each, made 538 pages a Phi-3 request on that thread, 453 a Llama-3 one and 227 for the MoE
//! (`scripts/torch/inline-maps.py`). Kept, a lane taken again knows what its first request put
//! there: the memory of its first block is named ahead ([`Placement::ahead`]) for the next left
//! lane once a replacement seen is due to take it, and a busy lane taken again has a page
//! ([`SPILL`]) made beyond its block, never past the largest block it held
//! ([`Lane::handed`]), while it is one of the [`AHEAD`] placed longest ago: 17, 154 and 124
//! pages on the allocating thread, the rest made by the worker, for a reserve peak 16, 14 and 0
//! MiB above the first request's (Phi-3, Llama-3, the MoE).
//!
//! A shorter request than the one before the trim pays for it: its lanes hold up to a page
//! beyond its blocks while it runs (`tests/trim.rs`'s miniature: a 323 MB peak where a fresh
//! pool peaks at 218). When every lane is free again, what no block reached since the lane's
//! memory went back goes back too, with no synchronize: no kernel used it
//! ([`Placement::take_never_used`]); from then on the lane keeps what it has for the next
//! request, as a lane never trimmed does. (The first version gave back what the request's
//! blocks did not reach, which a later, shorter request reset: memory the request before had
//! used, unmapped with no synchronize. `tests/trim.rs` checks that no such page is unmapped.) A
//! left lane whose first block was made ahead and that no block takes again keeps that memory
//! until the next trim.
//!
//! A closing pool releases the lanes with their address space ([`Placement::closing`]).
//!
//! [`Placement::ahead`]: crate::placement::Placement::ahead
//! [`Placement::take_never_used`]: crate::placement::Placement::take_never_used
//! [`Placement::closing`]: crate::placement::Placement::closing

use super::{Lanes, AHEAD, SPILL, SPILL_GRANULE};
use crate::placement::{Idle, Placement, Segment};
use crate::pool::Purge;
use std::collections::BTreeSet;

/// The lanes' state through trims.
#[derive(Clone, Debug, Default)]
pub(super) struct Trim {
    /// The busy lanes taken again whose blocks have not reached the memory their first
    /// request had ([`super::Lane::handed`]), by (when their block was placed, address).
    pub(super) regrowing: BTreeSet<(u64, u64)>,
    /// The pool is closing: a purge of everything releases the free lanes too.
    pub(super) closing: bool,
    /// A request has taken a left lane again since every lane was last free (`again.rs`).
    pub(super) retaking: bool,
    /// Ranges of lanes grown ahead after a trim that no block used.
    pub(super) never_used: Vec<(u64, usize)>,
}

impl super::Lane {
    /// A block of `n` bytes (its capacity) landed, [`super::Lane::handed`] counting it.
    #[inline]
    pub(super) fn landed_since_shed(&mut self, n: usize) {
        self.since_shed = self.since_shed.max(n);
        // Grown back to the largest block it held: nothing more to make again.
        self.shed &= n < self.handed;
    }
}

impl<P: Placement> Lanes<P> {
    /// The free lanes, as segments a purge may give the memory of.
    fn free_lanes(&self) -> impl Iterator<Item = Idle> + '_ {
        self.lanes.values().filter(|l| l.used == 0).map(|l| Idle {
            seg: l.seg,
            freed_at: l.freed_at,
        })
    }

    /// The free lanes a purge releases: for a purge of everything once the pool closes.
    pub(super) fn lanes_idle(&self, what: &Purge) -> Vec<Idle> {
        if matches!(what, Purge::All) && self.trim.closing {
            self.free_lanes().collect()
        } else {
            Vec::new()
        }
    }

    /// The free lanes a purge of everything keeps (all, until the pool closes).
    pub(super) fn lanes_kept_on_purge(&self) -> Vec<Idle> {
        if self.trim.closing {
            Vec::new()
        } else {
            self.free_lanes().collect()
        }
    }

    /// The memory behind `seg` went back: if it is a lane's, the next request makes it again.
    pub(super) fn lane_given_back(&mut self, seg: &Segment) -> bool {
        match self.lanes.get_mut(&seg.ptr).filter(|l| l.seg == *seg) {
            Some(l) => {
                (l.shed, l.since_shed) = (true, 0);
                true
            }
            None => false,
        }
    }

    /// Every lane is free: the request that used the lanes whose memory went back has ended.
    /// Where it grew one ahead of blocks that did not come (a shorter request than the one
    /// before the trim), the memory beyond the largest block since the trim goes back: no block
    /// used it since the memory there went back, and no kernel can. From then on the lane keeps
    /// what it has for the next request, as a lane never trimmed does (`again.rs`).
    pub(super) fn note_never_used(&mut self) {
        for (&at, l) in self.lanes.iter_mut() {
            if !l.shed || l.left {
                continue;
            }
            l.shed = false;
            let end = l.since_shed.next_multiple_of(SPILL_GRANULE);
            if end < l.seg.len {
                self.trim
                    .never_used
                    .push((at + end as u64, l.seg.len - end));
            }
        }
    }

    /// A block landed in lane `at`: what was noted there as never used is no longer.
    #[inline]
    pub(super) fn forget_never_used(&mut self, at: u64) {
        if !self.trim.never_used.is_empty() {
            let end = at + super::LANE_BYTES as u64;
            self.trim.never_used.retain(|&(a, _)| a < at || a >= end);
        }
    }

    /// After a trim, the memory the next request's lanes will need, named ahead (see the
    /// module docs): the first block's of the next left lane to be taken again, once a block
    /// is due to take it, and a page ([`SPILL`]) beyond the block of each of the [`AHEAD`]
    /// busy lanes taken again longest ago whose blocks have not reached their first request's
    /// largest.
    pub(super) fn name_taken_again(&self, f: &mut dyn FnMut(u64, usize)) {
        // Only while a request takes lanes again and a replacement seen will take the next
        // (replayed, naming the next two whenever a request retakes left a miniature's lanes
        // not taken again with their first blocks made: 13-15% more at its peak).
        let next = usize::from(self.trim.retaking && self.pending > 0);
        for &(_, at) in self.left_order.iter().take(next) {
            if let Some(l) = self.lanes.get(&at).filter(|l| l.shed && l.first > 0) {
                f(at, l.first.next_multiple_of(SPILL_GRANULE).min(l.seg.len));
            }
        }
        for &(_, at) in self.trim.regrowing.iter().take(AHEAD) {
            if let Some(l) = self.lanes.get(&at) {
                let from = l.used.next_multiple_of(SPILL_GRANULE);
                let end = (l.used + SPILL)
                    .min(l.handed)
                    .next_multiple_of(SPILL_GRANULE)
                    .min(l.seg.len);
                if end > from {
                    f(at + from as u64, end - from);
                }
            }
        }
    }
}
