//! Lanes of short-lived blocks: they keep their memory but no longer grow.
//!
//! A lane opens for the next small block after a replacement is seen, and in a model's forward
//! pass that is as often an activation as a cache's copy: freeing a 12 MiB activation while a
//! 16 MiB one was just allocated looks like a replacement. Such lanes then serve the activations
//! of their size, and where those grow (the Qwen3 MoE's attention scores, 4 MiB more each chunk
//! up to 158 MiB, freed a few allocations after they are made) the lane grows with them, in
//! address space of its own. In the range the same blocks would share their memory with
//! whatever else is short-lived: the MoE's 148 MiB logits landed in a range hole for 30 chunks
//! and then, once the scores' two lanes had grown past them, in those lanes, leaving 156 MiB
//! of the range mapped and unused at the live peak (replayed: 1.017 of the live peak with lanes,
//! 1.006 without; data/cpu-2026-11-28-moe-lanes).
//!
//! So a lane counts how long its blocks lived, in large allocations (the lanes' and the
//! range's: a clock that does not depend on the device or on time; [`short_life`]). A cache's copy lives until
//! the next chunk replaces it (489 large allocations on the MoE, 1,127 on Phi-3), an
//! activation a few (the MoE's scores 4, nine in ten of its other activations at most 41). After
//! [`TRANSIENT_AFTER`] short-lived blocks in a row a lane is *transient*: it still takes the
//! blocks its memory covers, but none that needs new memory there; that block takes another
//! lane, opens one, or goes to the range, where its memory is shared. One long-lived block makes
//! the lane a cache's again. When every lane is free at once (the next request, `again.rs`) the
//! count starts again: the lanes taken again are weighed as new.
//!
//! Replayed (data/cpu-2026-11-28-moe-lanes, libcupool's setting): Phi-3 1.020 -> 1.012 of the
//! live peak, Llama-3 1.019 -> 1.014, the MoE 1.017 -> 1.008, no page moved on any, nor in
//! the repeated requests. What the MoE still maps over its live peak is mostly the transient
//! lanes' memory (about 130 MiB, its expert activations', free at the peak). Lanes that stop
//! growing once transient were tried against the
//! alternatives listed there (the block sent to the range, shedding the transient lanes'
//! memory, no lane opened for short-lived replacements): each lost Phi-3 or moved pages.

use super::Lane;

/// A block freed within this many large allocations of landing lived short (module docs: an
/// activation lives a few, a cache's copy hundreds). Replayed, 32 to 256 map alike (within
/// 0.0002 of the live peak). Fewer where the pool has fewer lanes (`short_life`).
pub const SHORT_LIFE: u64 = 64;

/// The least life below which a block is short-lived, however few lanes there are.
const SHORT_LIFE_LEAST: u64 = 16;

/// The life below which a block is short-lived in a pool of `lanes` lanes: [`SHORT_LIFE`], or
/// the number of lanes where that is less (but [`SHORT_LIFE_LEAST`]). A cache's copy lives a
/// chunk, and a chunk lands at least one block in each lane in use: a small model's cache (a
/// few layers, one chunk within 64 large allocations: `tests/ahead.rs`'s, 24) is no
/// activation. (Without the least, Phi-3's first lanes counted every block long-lived and it
/// mapped 1.0205 of its live peak, not 1.0118.)
#[inline]
pub(super) fn short_life(lanes: usize) -> u64 {
    SHORT_LIFE.min((lanes as u64).max(SHORT_LIFE_LEAST))
}

/// Short-lived blocks in a row after which a lane takes no block that needs memory. Replayed,
/// 6 to 8 took Phi-3 to 1.010–1.012 (8: 10 pages moved by a half request then a whole one,
/// with the growth made ahead); from 10 up its lanes grew as before (1.020), and at 1 to 3 the
/// MoE kept 1.010–1.012.
pub const TRANSIENT_AFTER: u32 = 6;

/// How long a lane's blocks lived (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Lives {
    /// The clock when its block landed.
    born: u64,
    /// Its last blocks that lived short, in a row.
    short: u32,
}

impl Lives {
    /// A lane whose first block lands at `clock`.
    pub(super) fn at(clock: u64) -> Self {
        Self {
            born: clock,
            short: 0,
        }
    }

    /// How long its block has lived at `clock`, in large allocations.
    #[inline]
    pub(super) fn age(&self, clock: u64) -> u64 {
        clock.saturating_sub(self.born)
    }

    /// A block landed at `clock`.
    #[inline]
    pub(super) fn landed(&mut self, clock: u64) {
        self.born = clock;
    }

    /// Its block was freed at `clock`: whether it lived short, below `short` ([`short_life`]).
    #[inline]
    pub(super) fn freed(&mut self, clock: u64, short: u64) -> bool {
        let lived_short = clock.saturating_sub(self.born) < short;
        self.short = if lived_short {
            self.short.saturating_add(1)
        } else {
            0
        };
        lived_short
    }

    /// Forgets the blocks so far: the lane is weighed as new.
    pub(super) fn forget(&mut self) {
        self.short = 0;
    }
}

impl Lane {
    /// Whether the lane takes no block that needs new memory in it (see the module docs).
    #[inline]
    pub(super) fn transient(&self) -> bool {
        self.lives.short >= TRANSIENT_AFTER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_lived_blocks_in_a_row_make_a_lane_transient_and_one_long_lived_block_undoes_it() {
        let mut l = Lives::at(0);
        let mut clock = 0;
        for _ in 0..TRANSIENT_AFTER {
            assert!(l.short < TRANSIENT_AFTER);
            clock += SHORT_LIFE - 1;
            l.freed(clock, SHORT_LIFE);
            l.landed(clock);
        }
        assert_eq!(l.short, TRANSIENT_AFTER);
        clock += SHORT_LIFE;
        l.freed(clock, SHORT_LIFE);
        assert_eq!(l.short, 0);
        l.short = TRANSIENT_AFTER;
        l.forget();
        assert_eq!(l.short, 0);
    }
}
