//! Lanes whose blocks live short (activations that entered a lane after a replacement was
//! seen) keep their memory but grow no more: a larger block goes where its memory is shared
//! (`placement/lanes/transient.rs`).
mod common;
use common::*;
use cupool_pool::placement::lanes::{SHORT_LIFE, TRANSIENT_AFTER};
use cupool_pool::{Block, Pool};

const MIB: usize = 1 << 20;

/// A lane opened for a block of `size` bytes after a replacement was seen: a block freed while
/// its 2 MiB larger copy (kept, returned) lives.
fn open_lane(p: &dyn Pool, size: usize) -> (Block, Block) {
    let old = p.alloc(4 * MIB).unwrap();
    let copy = p.alloc(6 * MIB).unwrap();
    p.free(old).unwrap();
    (p.alloc(size).unwrap(), copy)
}

/// A pool with a lane that has held `short` blocks of 4 MiB each freed at once (the first
/// included), then, with `long`, one kept while [`SHORT_LIFE`] large blocks came and went in
/// the range; the address of the lane, and where a block of 8 MiB (4 MiB more than the lane's
/// memory) lands then. Another lane stays busy throughout (a cache's: with every lane free the
/// next request's rules apply, `again.rs`).
fn lane_then_growth(short: u32, long: bool) -> (u64, u64) {
    let dev = sim(2.0);
    let p = vmm_with(as_driver(&dev), 8 * MIB, true);
    let (cache, c1) = open_lane(&p, 4 * MIB);
    let (first, c2) = open_lane(&p, 4 * MIB);
    let lane = first.ptr();
    p.free(first).unwrap();
    for _ in 1..short {
        let b = p.alloc(4 * MIB).unwrap();
        assert_eq!(b.ptr(), lane, "the lane takes the blocks its memory covers");
        p.free(b).unwrap();
    }
    if long {
        let b = p.alloc(4 * MIB).unwrap();
        assert_eq!(b.ptr(), lane);
        let range: Vec<Block> = (0..SHORT_LIFE).map(|_| p.alloc(2 * MIB).unwrap()).collect();
        for r in range {
            p.free(r).unwrap();
        }
        p.free(b).unwrap();
    }
    let grown = p.alloc(8 * MIB).unwrap();
    let at = grown.ptr();
    for b in [grown, cache, c1, c2] {
        p.free(b).unwrap();
    }
    (lane, at)
}

/// Replayed on the Qwen3 MoE prefill trace, two lanes of its attention scores (each freed a
/// few allocations after it was made) grew by 4 MiB a chunk to 158 MiB while its logits'
/// 156 MiB stayed mapped in the range, unused at the live peak: 1.017 of the live peak
/// against 1.008 now (`cli/tests/replay.rs`).
#[test]
fn a_lane_of_short_lived_blocks_takes_no_block_that_needs_memory_there() {
    let (lane, at) = lane_then_growth(TRANSIENT_AFTER - 1, false);
    assert_eq!(at, lane, "until then a larger block grows the lane");
    let (lane, at) = lane_then_growth(TRANSIENT_AFTER, false);
    assert_ne!(at, lane, "the lane grows no more");
    // Its memory still serves the blocks it covers.
    let (lane, at) = lane_then_growth(2 * TRANSIENT_AFTER, false);
    assert_ne!(at, lane);
}

/// One long-lived block (a cache's copy that landed on the lane) makes it a cache's lane again.
#[test]
fn a_long_lived_block_lets_the_lane_grow_again() {
    let (lane, at) = lane_then_growth(TRANSIENT_AFTER, true);
    assert_eq!(at, lane);
}
