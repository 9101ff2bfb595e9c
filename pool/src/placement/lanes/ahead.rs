//! What the lanes expect their next copies to need ([`Placement::ahead`]).
//!
//! Where the upstream makes memory ahead of need (`CUPOOL_VMM_AHEAD`,
//! `upstream/vmm/ahead.rs`), a lane whose last two blocks grew alike, and whose last such guess
//! held, is read as a growing cache's, and [`Placement::ahead`] names the growth the next copy
//! will need behind the [`AHEAD`] such busy lanes placed longest ago (their blocks are replaced
//! next); that growth is kept out of the free spans. A lane that has seen one growth reads the
//! rest from the pool's last copies ([`Lanes::growth_of`]). Memory a copy did not need (beyond the
//! largest block a lane has held: nothing ever used it) goes back when the copy lands
//! ([`Placement::take_excess`]).

use super::{Lane, Lanes, GROW, SPILL, SPILL_GRANULE};
use crate::placement::Placement;

/// Growing busy lanes whose next growth [`Placement::ahead`] names: the ones whose blocks were
/// placed longest ago, replaced next where a cache is copied layer by layer. Where each layer copies
/// its keys and then its values (PyTorch's KV cache), two lanes ask for a lane's growth a whole
/// layer before it is needed, and hold two growths of memory early (8 MiB on Phi-3's prefill).
pub const AHEAD: usize = 2;

impl Lane {
    /// Where the block replacing this lane's is expected to end, in whole granules: where its
    /// last two blocks grew alike (a cache's copies each grow by one chunk; an activation that
    /// happened to land on a smaller one's lane grows once, or by another amount), this one
    /// grown once more.
    fn expected_end(&self) -> Option<usize> {
        let g = self.grew[1];
        (g > 0 && self.grew[0] == g).then(|| (self.size + g).next_multiple_of(SPILL_GRANULE))
    }

    /// Notes a block of `size` bytes landing in the lane: whether the growth this lane would
    /// have asked for was needed (blocks that grew alike and then stopped, as a MoE's
    /// activations do at 8, 12 and 16 MiB, lose the lane its trust until a guess is right
    /// again), and what the block grew by.
    pub(super) fn landed(&mut self, size: usize) {
        // A block a little smaller (an activation between a cache's copies, on the memory the
        // last copy left) is no copy: the next copy grows over the last one. One much smaller
        // starts the lane's history again (a new sequence's cache, where the lane's memory
        // was moved away).
        if size < self.size {
            if self.size - size > SPILL {
                (self.size, self.grew, self.trusted) = (size, [0; 2], false);
            }
            return;
        }
        if let Some(end) = self.expected_end() {
            self.trusted = size.next_multiple_of(SPILL_GRANULE) >= end;
        }
        self.grew = [self.grew[1], size.saturating_sub(self.size).min(GROW)];
        self.size = size;
    }

    /// The memory beyond its block that the block replacing it is expected to need, where the
    /// lane's last guess was right: the granules the expected block reaches past this one's
    /// (none where the chunk still fits the last granule: 0.5 MiB a chunk takes a granule every
    /// fourth copy).
    #[inline]
    pub(super) fn next_growth(&self) -> usize {
        match self.expected_end() {
            Some(end) if self.trusted => {
                end.saturating_sub(self.used.next_multiple_of(SPILL_GRANULE))
            }
            _ => 0,
        }
    }
}

impl<P: Placement> Lanes<P> {
    /// A long-lived block was freed from a lane whose copies were `size` bytes asked for
    /// ([`Lane::size`]: the lane's last copy, which an activation a little smaller landing
    /// between copies leaves as it was): where the last large block is a little larger (a
    /// cache's grown copy, allocated before the old one goes), what the copy grew by is noted
    /// (see [`Lanes::growth_of`]). (Noting the freed block's own size instead, replayed: Phi-3
    /// made 1,493 pages on the allocating thread, and with its cache kept moved 891 pages.)
    pub(super) fn note_replaced(&mut self, size: usize) {
        let g = self.last_size.saturating_sub(size);
        if g > 0 && g <= GROW {
            self.copies_grew = [self.copies_grew[1], g];
        }
    }

    /// The memory beyond its block that the block replacing lane `l`'s is expected to need:
    /// the lane's own guess ([`Lane::next_growth`]), else, for a lane whose last block grew
    /// by what the last two copies replacing long-lived blocks grew by, that growth again.
    ///
    /// A lane's own guess needs three blocks of a cache in it, and while a cache is small
    /// its copies share the lanes with activations of their size (Phi-3's 8 and 16 MiB
    /// feed-forward blocks between copies of 6 to 28 MiB), so most lanes learn nothing in
    /// the first chunks, and every copy there made its growth where it landed, on the
    /// allocating thread. The copies of one cache all grow alike, so one lane's growth
    /// agreeing with the last two copies' is read as the same cache's. The H200's recorded
    /// prefills through libcupool as `cupool.torch.install()` sets it
    /// (`capi/tests/torch_replay.rs`): the pages the allocating thread made fell 1,681 ->
    /// 1,491 on Phi-3, 2,458 -> 2,379 on Llama-3 and 2,191 -> 2,181 on the MoE (about 1,000
    /// of each the weights'), the reserve 18,536 -> 18,484 MiB on Llama-3, Phi-3's 15,138 and
    /// the MoE's 16,444 alike. (Trusting one growth without the copies' agreement mapped
    /// 124 MiB more on the MoE, whose activations grow alike for a few chunks and stop.)
    ///
    /// Only for a block that has lived [`super::transient::short_life`] already: a cache's
    /// copy lives a chunk, an activation a few allocations, and activations grow by a chunk's
    /// share too (Phi-3's 3 MiB steps, its KV copies' growth). Memory named ahead behind an
    /// activation draws the next copy into the activation's lane, so the caches end the
    /// request in other lanes than they opened, and a later request, which takes the lanes
    /// again in the order they opened, put its copies where their memory was not: without this
    /// rule the recorded Phi-3 process serving three prefills with its cache kept moved 2,901
    /// pages and reserved 16.16 GB where it moves none and reserves 15.88 (`cli/tests/replay.rs`;
    /// 4,408 pages and 17.26 GB without [`Lanes::named_from_copies`] either).
    pub(super) fn growth_of(&self, l: &Lane) -> usize {
        self.growth(l, true)
    }

    /// [`Self::growth_of`]; `aged`: only for a block that has lived long already (at its
    /// landing it has not: a lane is marked growing then, and its guess named once it aged).
    pub(super) fn growth(&self, l: &Lane, aged: bool) -> usize {
        let own = l.next_growth();
        let g = self.copies_grew[1];
        if own > 0 || l.used == 0 || l.transient() || g == 0 {
            return own;
        }
        if aged && l.lives.age(self.clock) < super::transient::short_life(self.lanes.len()) {
            return 0;
        }
        if self.copies_grew[0] != g || l.grew[1] != g {
            return 0;
        }
        (l.size + g)
            .next_multiple_of(SPILL_GRANULE)
            .saturating_sub(l.used.next_multiple_of(SPILL_GRANULE))
    }

    /// Where the memory named ahead for busy lane `at`'s next copy from the pool's copies ends
    /// (0 where the lane's own guess named it, or nothing was named): noted when its block is
    /// freed, so that a lane taken again by a later request, weighed as a fresh lane
    /// ([`Lane::fresh_end`]), counts that memory as the first request's lane had it made.
    /// Recomputed here from the window [`Placement::ahead`] names, not recorded when named (a
    /// guess that changed in between is missed; replayed, 3 lanes a Phi-3 request). The lane's
    /// own guesses are weighed as they were (counting theirs too, the Phi-3 process with its
    /// cache kept moved 315 pages and reserved 15,466 MiB).
    pub(super) fn named_from_copies(&self, at: u64, l: &Lane) -> usize {
        // Nothing named was made while the core makes nothing ahead.
        if !self.predicts || !self.made || l.used == 0 || l.next_growth() > 0 {
            return 0;
        }
        let g = self.growth_of(l);
        if g == 0 || !self.in_window(at, l) {
            return 0;
        }
        (l.used + g).next_multiple_of(SPILL_GRANULE).min(l.seg.len)
    }

    /// Whether busy lane `at` is one of the [`AHEAD`] growing lanes placed longest ago, whose
    /// growth [`Lanes::name_ahead`] names: the one window the naming, the memory kept for it
    /// and the memory counted as named for a lane taken again share.
    fn in_window(&self, at: u64, l: &Lane) -> bool {
        let key = (l.placed, at);
        self.growing.range(..=key).take(AHEAD).any(|&k| k == key)
    }

    /// [`Placement::ahead`] names nothing from now on.
    pub fn predict_nothing(&mut self) {
        self.predicts = false;
    }

    /// Where a lane's free span starts: after its block, and after the growth asked for ahead
    /// for it while it is one of the [`AHEAD`] (that memory is not free to move: it would be
    /// made again).
    pub(super) fn kept(&self, at: u64, l: &Lane) -> usize {
        let g = if self.predicts && l.used > 0 {
            self.growth_of(l)
        } else {
            0
        };
        let kept = if g > 0 && self.in_window(at, l) {
            (l.used + g).next_multiple_of(SPILL_GRANULE)
        } else {
            l.used
        };
        // A lane taken again keeps the memory its earlier blocks reached (`again.rs`).
        l.kept_for_reach().map_or(kept, |k| k.max(kept))
    }

    /// Every lane's range beyond its block, or its last block while free, in whole granules;
    /// all of a free lane whose memory is kept for a request's cache (not a free span:
    /// [`Lane::kept_for_reach`]).
    pub(super) fn name_surplus(&self, f: &mut dyn FnMut(u64, usize)) {
        for (&at, l) in &self.lanes {
            let end = if l.used > 0 {
                l.used
            } else if l.kept_for_reach().is_some() {
                0
            } else {
                l.last
            };
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
        if self.predicts && self.made {
            self.name_taken_again(f);
        }
        let n = if self.predicts { AHEAD } else { 0 };
        for &(_, at) in self.growing.iter().take(n) {
            if let Some(l) = self.lanes.get(&at) {
                // Whole granules: the pages made there, each wholly inside the range (so a
                // block that needs their memory can have them shed: `core/back.rs`).
                let end = (l.used + self.growth_of(l))
                    .next_multiple_of(SPILL_GRANULE)
                    .min(l.seg.len);
                if end > l.used {
                    f(at + l.used as u64, end - l.used);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Segment;

    const MIB: usize = 1 << 20;

    /// A busy lane whose blocks of `sizes` bytes landed in turn.
    fn lane(sizes: &[usize]) -> Lane {
        let mut l = Lane {
            seg: Segment {
                ptr: 1 << 40,
                len: 1 << 30,
                handle: 0,
            },
            used: 0,
            last: 0,
            freed_at: 0,
            placed: 0,
            size: sizes[0],
            grew: [0; 2],
            trusted: false,
            handed: 0,
            reach: 0,
            left: false,
            opened: 0,
            ahead_end: 0,
            first: 0,
            shed: false,
            since_shed: 0,
            lives: Default::default(),
        };
        for &s in &sizes[1..] {
            l.landed(s);
        }
        l.used = sizes.last().unwrap().next_multiple_of(SPILL_GRANULE);
        l
    }

    /// Lanes holding one busy lane at `AT`, whose last block grew by 3 MiB as the pool's last
    /// two copies did, aged: the copies' growth is named for it ahead.
    fn lanes_with_a_growing_copy() -> (Lanes<crate::placement::bump::Bump>, Lane) {
        let mut lanes = Lanes::new(crate::placement::bump::Bump::default(), SPILL_GRANULE);
        let mut l = lane(&[9 * MIB, 12 * MIB]);
        l.placed = 1;
        lanes.clock = 1_000;
        lanes.copies_grew = [3 * MIB; 2];
        lanes.lanes.insert(AT, l);
        lanes.growing.insert((l.placed, AT));
        (lanes, l)
    }
    const AT: u64 = 1 << 40;

    #[test]
    fn memory_named_ahead_counts_only_while_the_core_makes_it() {
        let (mut lanes, l) = lanes_with_a_growing_copy();
        assert_eq!(
            l.next_growth(),
            0,
            "the lane's own guess is not trusted yet"
        );
        // 12 + 3 MiB in whole granules.
        assert_eq!(lanes.named_from_copies(AT, &l), 16 * MIB);
        assert_eq!(lanes.kept(AT, &l), 16 * MIB);
        // A block ran out of memory: the core shed what was made ahead and makes none.
        lanes.made_ahead(false);
        assert_eq!(lanes.named_from_copies(AT, &l), 0);
        lanes.made_ahead(true);
        assert_eq!(lanes.named_from_copies(AT, &l), 16 * MIB);
        // A copy of the lanes (a snapshot) keeps the state.
        lanes.made_ahead(false);
        let copy = lanes.copied().expect("Bump keeps a copy");
        assert_eq!(copy.named_from_copies(AT, &l), 0);
    }

    #[test]
    fn one_window_names_keeps_and_counts_a_lane_s_growth() {
        let (mut lanes, l) = lanes_with_a_growing_copy();
        // A lane missing from the growing set (its growth seen only after it landed) is
        // named by nobody: nothing is kept for it either.
        lanes.growing.clear();
        assert_eq!(lanes.named_from_copies(AT, &l), 0);
        assert_eq!(lanes.kept(AT, &l), l.used);
        let mut named = Vec::new();
        lanes.name_ahead(&mut |a, n| named.push((a, n)));
        assert!(named.is_empty());
        // Behind AHEAD older growing lanes it is out of the window too.
        for k in 0..AHEAD as u64 {
            lanes.growing.insert((0, k));
        }
        lanes.growing.insert((l.placed, AT));
        assert_eq!(lanes.named_from_copies(AT, &l), 0);
        assert_eq!(lanes.kept(AT, &l), l.used);
    }

    #[test]
    fn a_cache_s_copies_are_expected_to_grow_by_their_chunk_in_whole_granules() {
        // 3 MiB a chunk: 12 -> 15 MiB needs 16, 4 MiB past 12; 15 -> 18 needs 2 past 16.
        assert_eq!(
            lane(&[3 * MIB, 6 * MIB, 9 * MIB, 12 * MIB]).next_growth(),
            4 * MIB
        );
        assert_eq!(
            lane(&[6 * MIB, 9 * MIB, 12 * MIB, 15 * MIB]).next_growth(),
            2 * MIB
        );
        // Half a MiB a chunk: a granule every fourth copy.
        let half = MIB / 2;
        assert_eq!(
            lane(&[8 * MIB, 8 * MIB + half, 9 * MIB, 9 * MIB + half]).next_growth(),
            0
        );
        assert_eq!(
            lane(&[8 * MIB + half, 9 * MIB, 9 * MIB + half, 10 * MIB]).next_growth(),
            2 * MIB
        );
    }

    #[test]
    fn an_activation_between_copies_leaves_the_cache_s_growth_as_it_was() {
        let l = lane(&[3 * MIB, 6 * MIB, 9 * MIB, 5 * MIB, 12 * MIB]);
        assert_eq!(l.next_growth(), 4 * MIB);
    }

    #[test]
    fn a_much_smaller_block_starts_the_lane_s_history_again() {
        let l = lane(&[
            30 * MIB,
            33 * MIB,
            36 * MIB,
            3 * MIB,
            6 * MIB,
            9 * MIB,
            12 * MIB,
        ]);
        assert_eq!(l.next_growth(), 4 * MIB);
    }

    #[test]
    fn blocks_that_grew_alike_and_stopped_are_not_guessed_again() {
        // Not trusted before one guess was seen to hold.
        assert_eq!(lane(&[4 * MIB, 8 * MIB, 12 * MIB]).next_growth(), 0);
        // 16 would have been right: trusted, 20 expected.
        assert_eq!(
            lane(&[4 * MIB, 8 * MIB, 12 * MIB, 16 * MIB]).next_growth(),
            4 * MIB
        );
        // They stopped at 16 and started again from 8: 20 was wrong, no guess until one holds.
        let l = lane(&[
            4 * MIB,
            8 * MIB,
            12 * MIB,
            16 * MIB,
            16 * MIB,
            8 * MIB,
            12 * MIB,
        ]);
        assert_eq!(l.next_growth(), 0);
    }
}
