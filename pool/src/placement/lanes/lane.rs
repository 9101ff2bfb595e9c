//! One lane's state: its address range, its block, and what its blocks did.

use super::transient;
use crate::placement::Segment;

/// A lane (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(super) struct Lane {
    pub(super) seg: Segment,
    /// Capacity of the block at its start; 0 while free.
    pub(super) used: usize,
    /// Capacity of its last block: about the memory behind it while free.
    pub(super) last: usize,
    /// Epoch of the latest free of its block.
    pub(super) freed_at: u64,
    /// When its block was placed (the lanes' own count): its key in `Lanes::growing`.
    pub(super) placed: u64,
    /// Bytes asked for by its last block (before rounding).
    pub(super) size: usize,
    /// What its block grew by over the lane's last, in bytes asked for (0: not larger, or a
    /// lane just opened), and what the block before did; a block a little smaller than the
    /// last (an activation between copies) leaves it as it was (`Lane::landed`).
    pub(super) grew: [usize; 2],
    /// Whether the last growth this lane would have been asked ahead for was needed by the
    /// block that came (`ahead.rs`).
    pub(super) trusted: bool,
    /// The end of the largest block it has held: memory beyond it was only ever made ahead
    /// of need, never handed out.
    pub(super) handed: usize,
    /// The end of the largest block it has held since it opened or was taken again: what a
    /// fresh lane's memory would be (`again.rs`).
    pub(super) reach: usize,
    /// Free since every lane was free at once: the requests that used it ended, and the next
    /// lane to open takes it (`again.rs`).
    pub(super) left: bool,
    /// When it opened (the lanes' count of blocks placed then): left lanes are taken again in
    /// the order they opened.
    pub(super) opened: u64,
    /// Where the memory named ahead from the pool's copies for the block replacing its last
    /// one ended, while it is free (0: none named so; `ahead.rs`, [`Lane::fresh_end`]).
    pub(super) ahead_end: usize,
    /// Capacity of the first block since it opened or was taken again: what the next request
    /// puts there first (`again.rs`).
    pub(super) first: usize,
    /// Its memory went back to the device at a purge while it was free, and the request that
    /// uses it next has not ended: its memory is made ahead of its blocks, up to
    /// [`Lane::handed`] (`trim.rs`).
    pub(super) shed: bool,
    /// The end of the largest block it has held since its memory went back (0 before): no
    /// block used the memory beyond it since then.
    pub(super) since_shed: usize,
    /// How long its blocks lived (`transient.rs`).
    pub(super) lives: transient::Lives,
}

impl Lane {
    /// A lane just opened at `seg` for a block of `size` bytes asked for (`n` placed), the
    /// `placed`th block placed in lanes, at `clock` large allocations.
    pub(super) fn opened(seg: Segment, n: usize, size: usize, placed: u64, clock: u64) -> Self {
        Lane {
            seg,
            used: n,
            last: n,
            freed_at: 0,
            placed,
            size,
            grew: [0; 2],
            trusted: false,
            handed: n,
            reach: n,
            left: false,
            opened: placed,
            ahead_end: 0,
            first: n,
            shed: false,
            since_shed: 0,
            lives: transient::Lives::at(clock),
        }
    }
}
