//! What a replay follows over time: every stream's reserve and their sum, and the points a
//! timeline plot draws (live and reserved bytes after each event, where they changed).

use std::collections::HashMap;

/// The reserve of every stream's pool and their sum, updated one pool at a time (summing all
/// pools at every event made replays quadratic in the number of streams).
#[derive(Default)]
pub(super) struct Reserved {
    of: HashMap<u64, usize>,
    pub(super) total: usize,
}

impl Reserved {
    pub(super) fn update(&mut self, stream: u64, now: usize) {
        let was = self.of.insert(stream, now).unwrap_or(0);
        self.total = self.total - was + now;
    }
}

/// Live and reserved bytes, all streams together, after an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Point {
    /// The event (1-based).
    pub event: usize,
    /// Bytes of live blocks.
    pub live: usize,
    /// Bytes the pools hold of the device.
    pub reserved: usize,
}

/// Appends a point where live or reserved bytes changed, so a trace of mostly repeated sizes
/// keeps few points.
pub(super) fn note(points: &mut Vec<Point>, p: Point) {
    match points.last() {
        Some(l) if l.live == p.live && l.reserved == p.reserved => {}
        _ => points.push(p),
    }
}
