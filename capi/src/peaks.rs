//! The peaks a user sees, as PyTorch's: they restart only when the user asks.
//!
//! The pools' own high-water marks restart at every ubatch boundary (the per-ubatch accounting
//! of an engine), and a pool behind size classes is several pools whose peaks add up to more than
//! the stream ever held at once. So libcupool counts each stream's live bytes and peaks itself,
//! at every allocation and free it serves: exact for the stream, untouched by boundaries.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// One stream pool's live bytes and its peaks since the user last reset them.
#[derive(Debug, Default)]
pub(crate) struct Peaks {
    live: AtomicUsize,
    live_peak: AtomicUsize,
    reserved_peak: AtomicUsize,
}

impl Peaks {
    /// `size` bytes handed out; the pool now holds `reserved` bytes of the device.
    #[inline]
    pub(crate) fn alloc(&self, size: usize, reserved: usize) {
        let live = self.live.fetch_add(size, Relaxed) + size;
        // A peak is written only when it rises: threads sharing a stream's pool then rarely
        // contend for these lines.
        if live > self.live_peak.load(Relaxed) {
            self.live_peak.fetch_max(live, Relaxed);
        }
        if reserved > self.reserved_peak.load(Relaxed) {
            self.reserved_peak.fetch_max(reserved, Relaxed);
        }
    }

    /// `size` bytes given back.
    #[inline]
    pub(crate) fn free(&self, size: usize) {
        // Every free matches an allocation counted above: no underflow.
        self.live.fetch_sub(size, Relaxed);
    }

    /// The peaks restart from what is held now (`reserved`: the pool's device bytes now).
    pub(crate) fn reset(&self, reserved: usize) {
        self.live_peak.store(self.live.load(Relaxed), Relaxed);
        self.reserved_peak.store(reserved, Relaxed);
    }

    /// The highest live bytes since the last reset.
    pub(crate) fn live_peak(&self) -> usize {
        self.live_peak.load(Relaxed)
    }

    /// The highest reserved bytes since the last reset, at least `now`.
    pub(crate) fn reserved_peak(&self, now: usize) -> usize {
        self.reserved_peak.load(Relaxed).max(now)
    }
}
