//! Which free lane a large block lands in, and lanes taken again by the next request.
//!
//! A free lane takes a block that its memory covers but for at most [`GROW`] bytes, and that
//! leaves no more than [`SPILL`] of its memory behind the lane's free end: a lane's memory
//! serves blocks near the size it was made for. Among those, the most memory behind the block.
//!
//! **The next request.** A model served more than once in one process (a second prompt, a
//! benchmark's repeats without `empty_cache`) grows its caches again from one chunk, while
//! the lanes the first request left are free, each cache's with the memory of its last,
//! largest copy behind it. Measured before this rule (data/cpu-2026-11-28-lanes-again,
//! replays of the recorded prefills run again with the weights kept): the second request found
//! no lane whose memory fits its small copies, opened lanes of its own and grew them by moving
//! the old lanes' pages one by one. Phi-3 moved 24,000 pages, synchronized 25 times and
//! mapped 1.062 times its live peak; Llama-3 moved 11,000 and synchronized 288 times; and the
//! lanes, their free spans and the pages every move sorts grew with each repeat (a large
//! allocation took 0.6 µs of CPU in the first request and 7 to 23 µs on average in the later ones,
//! up to 174 µs late in the fifth).
//!
//! So when every lane is free at once (the requests that used them ended), each is *left*:
//! the next lanes to open are the left ones instead, in the order they first opened (a repeat
//! opens its lanes in the same order, each for the same tensor), and each one taken again is
//! weighed as if it were new, by the memory its blocks have reached since ([`Lane::reach`]),
//! so the request places its blocks as the first one did. The memory beyond that reach, up
//! to the largest block the lane ever held, is kept out of the free spans: the request's cache
//! grows into it without a driver call, and while the lane is free all of it is named as
//! surplus, the first memory an out-of-memory sheds. A left lane not taken again is a free span
//! like any free lane's. Left lanes are taken again also where no lane may open any more (at
//! [`super::MAX_LANES`], or once the upstream refused address space apart).

use super::{Lane, Lanes, GROW, SPILL, SPILL_GRANULE};
use crate::placement::Placement;

impl Lane {
    /// The memory a fresh lane with this one's blocks would have: up to the end of the largest
    /// block since it opened or was taken again, or of the memory named ahead for its next
    /// copy from the pool's copies (`ahead.rs`, [`Lanes::named_from_copies`]: a first request
    /// has it made there, and its copies land by it), in granules. Where that is all it has (a
    /// lane never left), the lane's own memory decides. (Without the named memory the recorded
    /// Llama-3 prefill run three times put later copies on other lanes than the first request
    /// did: 46 MiB more and 2 pages moved.)
    #[inline]
    pub(super) fn fresh_end(&self) -> Option<usize> {
        (self.reach < self.handed).then(|| {
            self.reach
                .max(self.ahead_end)
                .next_multiple_of(SPILL_GRANULE)
        })
    }

    /// Where a lane's free span starts while its memory beyond the blocks of this request is
    /// kept for them to grow into (`None`: nothing kept).
    /// A free lane keeps it too: its block's copy comes back to it next (moving its pages
    /// out in between made the recorded Phi-3 requests move 20,780 pages where they moved
    /// 2,968), and its whole range is named as surplus instead, for an out-of-memory to shed.
    pub(super) fn kept_for_reach(&self) -> Option<usize> {
        (!self.left && self.fresh_end().is_some()).then(|| {
            self.handed
                .next_multiple_of(SPILL_GRANULE)
                .min(self.seg.len)
        })
    }
}

impl<P: Placement> Lanes<P> {
    /// The free lane for a block of `n` bytes (rounded), and whether it is taken again by a
    /// new request: one whose memory fits it, else a left lane where the block would open a
    /// new one. (A left lane is not taken for a block its memory fits as it is: replayed, the
    /// next requests then moved thousands of pages, `data/cpu-2026-11-28-lanes-again/review`.)
    pub(super) fn free_lane(
        &self,
        n: usize,
        unbacked: &dyn Fn(u64, usize) -> usize,
    ) -> Option<(u64, bool)> {
        if let Some(at) = self.fitting_lane(n, unbacked) {
            return Some((at, false));
        }
        if self.retakes(n) {
            if let Some(&(_, at)) = self.left_order.first() {
                return Some((at, true));
            }
        }
        None
    }

    /// [`Self::fitting_lane`] weighing every lane in its size range with every lookup: what
    /// the pruned scan must agree with.
    #[cfg(feature = "check")]
    fn fitting_lane_in_full(
        &self,
        n: usize,
        unbacked: &dyn Fn(u64, usize) -> usize,
    ) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        let least = n.saturating_sub(GROW + SPILL_GRANULE);
        for &(_, at) in self.free.range((least, 0)..=(n + SPILL, u64::MAX)) {
            let Some(lane) = self.lanes.get(&at).filter(|l| !l.left) else {
                continue;
            };
            let (need, over) = match lane.fresh_end() {
                Some(end) => {
                    let inside = n.min(end);
                    let need = unbacked(at, inside).saturating_add(n - inside);
                    (need, end.saturating_sub(n))
                }
                None => (unbacked(at, n), lane.seg.len - n),
            };
            let empty = if over > 0 {
                unbacked(at + n as u64, over)
            } else {
                0
            };
            let spills = empty == usize::MAX || over - empty.min(over) > SPILL;
            if need > GROW || spills || (need > 0 && lane.transient()) {
                continue;
            }
            if best.is_none_or(|(b, _)| n - need > b) {
                best = Some((n - need, at));
            }
        }
        best.map(|(_, at)| at)
    }

    /// Whether a block of `n` bytes that no free lane fits takes a left lane: where it would
    /// open a lane, whether or not one may open (at [`super::MAX_LANES`], or once the upstream
    /// refused address space apart, the left lanes are still there to take).
    fn retakes(&self, n: usize) -> bool {
        self.pending > 0 && n <= GROW
    }

    /// A large block of `c` bytes (its capacity) left the range: where one of the last
    /// [`super::RECENT`] large blocks allocated is larger by at most [`GROW`] (its grown copy),
    /// a lane opens for the next small block (see the module docs of [`super`]).
    pub(super) fn note_free(&mut self, c: usize) {
        if c > crate::placement::bump::LARGE
            && self.room_for_pending()
            && self.recent.iter().any(|&r| c < r && r - c <= GROW)
        {
            self.pending += 1;
        }
    }

    /// Whether a replacement seen adds a lane to open or to take again.
    fn room_for_pending(&self) -> bool {
        (self.enabled && self.lanes.len() + self.pending < super::MAX_LANES)
            || self.pending < self.left_order.len()
    }

    /// The free lane whose memory fits a block of `n` bytes (see the module docs); left lanes
    /// are not among them. A lane taken again counts only the memory a fresh lane would have.
    ///
    /// On the allocation path of every large block, so each lane is weighed with the fewest
    /// lookups of the address space that decide it: the memory the block lacks first (a lane
    /// that lacks too much, or a short-lived lane that lacks any, is out without the spill's
    /// lookup), and the first lane that lacks nothing ends the scan, as no later one can have
    /// more memory behind the block (ties went to the first lane before too). The recorded MoE
    /// process weighs about six lanes a large block.
    fn fitting_lane(&self, n: usize, unbacked: &dyn Fn(u64, usize) -> usize) -> Option<u64> {
        let found = self.fitting_lane_fast(n, unbacked);
        // The checker's builds (property tests, fuzzing) weigh every lane in full as well.
        #[cfg(feature = "check")]
        assert_eq!(
            found,
            self.fitting_lane_in_full(n, unbacked),
            "the pruned scan of the free lanes for {n} bytes chose another lane than the full one"
        );
        found
    }

    fn fitting_lane_fast(&self, n: usize, unbacked: &dyn Fn(u64, usize) -> usize) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        // Memory behind a free lane covers its last block, rounded up to a granule at most.
        let least = n.saturating_sub(GROW + SPILL_GRANULE);
        for &(_, at) in self.free.range((least, 0)..=(n + SPILL, u64::MAX)) {
            let Some(lane) = self.lanes.get(&at) else {
                continue;
            };
            if lane.left {
                continue;
            }
            // What the block lacks, and the memory past it in the lane: `(need, at + n, over)`.
            let (need, over) = match lane.fresh_end() {
                Some(end) => {
                    let inside = n.min(end);
                    (
                        unbacked(at, inside).saturating_add(n - inside),
                        end.saturating_sub(n),
                    )
                }
                None => (unbacked(at, n), lane.seg.len - n),
            };
            // A lane of short-lived blocks grows no more (`transient.rs`).
            if need > GROW || (need > 0 && lane.transient()) {
                continue;
            }
            let behind = n - need;
            if best.is_some_and(|(b, _)| behind <= b) {
                continue;
            }
            let empty = if over > 0 {
                unbacked(at + n as u64, over)
            } else {
                0
            };
            if empty == usize::MAX || over - empty.min(over) > SPILL {
                continue;
            }
            best = Some((behind, at));
            if need == 0 {
                break;
            }
        }
        best.map(|(_, at)| at)
    }

    /// Leaves every lane where none is busy (see the module docs).
    pub(super) fn leave_all_if_free(&mut self) {
        if self.free.len() == self.lanes.len() {
            self.trim.retaking = false;
            self.note_never_used();
            for (&at, l) in self.lanes.iter_mut() {
                // Weighed as new by the next request: its lanes' blocks live as it makes them.
                l.lives.forget();
                l.ahead_end = 0;
                if !l.left {
                    l.left = true;
                    self.left_order.insert((l.opened, at));
                }
            }
            // Replacements seen by the ended requests open nothing for the next one, nor do
            // the blocks they free after their last lane (the large blocks they allocated are
            // forgotten). Matched against a warm-up's own allocations, its last frees had the
            // recorded Phi-3 process (data/h100-2026-11-28-next-request/call4) start its first
            // request with 3 lanes to open, place that request's blocks in lanes unlike the
            // next ones did, and move 2,968 pages over the next two (none without the warm-up).
            self.pending = 0;
            self.recent = [0; super::RECENT];
        }
    }

    /// Takes the left lane at `at` again for a new request's block of `n` bytes: weighed as
    /// new from here on, in place of a lane to open.
    pub(super) fn take_again(&mut self, at: u64, n: usize) {
        if let Some(lane) = self.lanes.get_mut(&at) {
            self.left_order.remove(&(lane.opened, at));
            self.pending = self.pending.saturating_sub(1);
            (lane.left, lane.reach, lane.first) = (false, 0, n);
            self.trim.retaking = true;
        }
    }
}
