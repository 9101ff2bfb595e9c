//! The reserved peak a user sees, as PyTorch's: it restarts only when the user asks.
//!
//! The pools' own high-water marks restart at every ubatch boundary (the per-ubatch accounting
//! of an engine), and a pool behind size classes is several pools whose peaks add up to more than
//! the stream ever held at once. So libcupool keeps each stream's reserved peak itself, written
//! only when it rises. The live bytes and their peak are counted per thread with the request
//! sizes (`usage.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// One stream pool's reserved peak since the user last reset it.
#[derive(Debug, Default)]
pub(crate) struct Peaks {
    reserved_peak: AtomicUsize,
}

impl Peaks {
    /// The pool now holds `reserved` bytes of the device.
    #[inline]
    pub(crate) fn note(&self, reserved: usize) {
        // Written only when it rises: threads sharing a stream's pool rarely contend here.
        if reserved > self.reserved_peak.load(Relaxed) {
            self.reserved_peak.fetch_max(reserved, Relaxed);
        }
    }

    /// The peak restarts from what is held now (`reserved`: the pool's device bytes now).
    pub(crate) fn reset(&self, reserved: usize) {
        self.reserved_peak.store(reserved, Relaxed);
    }

    /// The highest reserved bytes since the last reset, at least `now`.
    pub(crate) fn reserved_peak(&self, now: usize) -> usize {
        self.reserved_peak.load(Relaxed).max(now)
    }
}
