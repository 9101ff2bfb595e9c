//! A ubatch's peaks in a dry run, without the pool's statistics.
//!
//! [`Phases`](cupool_pool::adaptors::Phases) reads the pool's statistics when a phase opens
//! and when it closes, and a VMM pool's statistics walk every page it maps: a dry run of a
//! million-token prefill maps a page or more per ubatch, so reading them per ubatch made its
//! cost grow with the square of the prompt. A dry run needs only the live peak the boundary
//! purge reads (it keeps no rows: see [`super::Engine`]), and this adaptor keeps it as `Phases`
//! does and reads nothing else. A dry run allocates from one thread: the peak is kept with
//! plain loads and stores, not read-modify-write operations (a few per request, and a dry run
//! of a long prompt makes millions).

use cupool_pool::driver::Driver;
use cupool_pool::{
    Block, FreeError, Moved, Pool, PoolError, PoolId, PoolKind, PoolSnapshot, PoolStats, Purge,
    Released, SyncToken,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Peaks {
    inner: Arc<dyn Pool>,
    /// Bytes of the blocks that passed through this adaptor and are live.
    live: AtomicUsize,
    /// The peak of `live` since [`Peaks::begin`].
    live_peak: AtomicUsize,
}

impl Peaks {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Pool>) -> Self {
        Self {
            inner,
            live: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
        }
    }

    /// Starts a ubatch: its peak starts from what is live now.
    pub fn begin(&self) {
        self.live_peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The ubatch's live peak since [`Peaks::begin`], as a phase's.
    pub fn end(&self) -> usize {
        self.live_peak.load(Ordering::Relaxed)
    }

    /// Counts a block of `size` bytes handed out.
    #[inline]
    fn note_live(&self, size: usize) {
        let live = self.live.load(Ordering::Relaxed) + size;
        self.live.store(live, Ordering::Relaxed);
        if live > self.live_peak.load(Ordering::Relaxed) {
            self.live_peak.store(live, Ordering::Relaxed);
        }
    }
}

impl Pool for Peaks {
    fn id(&self) -> PoolId {
        self.inner.id()
    }

    fn kind(&self) -> PoolKind {
        self.inner.kind()
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        self.inner.driver()
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let block = self.inner.alloc(bytes)?;
        self.note_live(block.size());
        Ok(block)
    }

    #[inline]
    fn alloc_onto(&self, bytes: usize, out: &mut Vec<Block>) -> Result<(), PoolError> {
        self.inner.alloc_onto(bytes, out)?;
        if let Some(b) = out.last() {
            self.note_live(b.size());
        }
        Ok(())
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        let size = block.size();
        self.inner.free(block)?;
        self.live
            .store(self.live.load(Ordering::Relaxed) - size, Ordering::Relaxed);
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        self.inner.purge(token, what)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.inner.releasable(what)
    }

    fn stats(&self) -> PoolStats {
        self.inner.stats()
    }

    fn reserved_bytes(&self) -> usize {
        self.inner.reserved_bytes()
    }

    fn reset_peaks(&self) {
        self.inner.reset_peaks()
    }

    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        self.inner.sleep(token, offload)
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        self.inner.wake()
    }

    fn snapshot(&self) -> Result<PoolSnapshot, PoolError> {
        let live = (
            self.live.load(Ordering::Relaxed),
            self.live_peak.load(Ordering::Relaxed),
        );
        Ok(PoolSnapshot::new((self.inner.snapshot()?, live)))
    }

    fn restore(&self, snapshot: &PoolSnapshot) -> Result<(), PoolError> {
        let Some((inner, (live, peak))) = snapshot.get::<(PoolSnapshot, (usize, usize))>() else {
            return Err(cupool_pool::snapshot_unsupported(
                self.kind(),
                "a restore from another pool's snapshot",
            ));
        };
        self.inner.restore(inner)?;
        self.live.store(*live, Ordering::Relaxed);
        self.live_peak.store(*peak, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupool_pool::adaptors::Phases;
    use cupool_pool::driver::sim::{SimConfig, SimDevice};
    use cupool_pool::{PoolConfig, PoolKind};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Over any allocations and frees, split into ubatches anywhere, a ubatch's live peak
        /// is the one the pool's phases report.
        #[test]
        fn the_live_peak_is_the_phase_s(
            kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
            // (bytes, whether to free a live block instead, which, whether a ubatch ends)
            ops in prop::collection::vec((1usize..(8 << 20), any::<bool>(), any::<usize>(), any::<bool>()), 1..120),
        ) {
            let build = || {
                let sim = Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap());
                PoolConfig::default().kind(kind).build(sim).unwrap()
            };
            let peaks = Arc::new(Peaks::new(build()));
            let phases = Arc::new(Phases::new(build()));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            peaks.begin();
            phases.begin_phase("ubatch");
            for (bytes, free, which, ends) in ops {
                if free && !a.is_empty() {
                    let i = which % a.len();
                    peaks.free(a.swap_remove(i)).unwrap();
                    phases.free(b.swap_remove(i)).unwrap();
                } else if bytes % 2 == 1 {
                    peaks.alloc_onto(bytes, &mut a).unwrap();
                    phases.alloc_onto(bytes, &mut b).unwrap();
                } else {
                    a.push(peaks.alloc(bytes).unwrap());
                    b.push(phases.alloc(bytes).unwrap());
                }
                if ends {
                    let phase = phases.end_phase().unwrap();
                    prop_assert_eq!(peaks.end(), phase.live_peak_bytes);
                    peaks.begin();
                    phases.begin_phase("ubatch");
                }
            }
            prop_assert_eq!(peaks.end(), phases.end_phase().unwrap().live_peak_bytes);
            for (x, y) in a.into_iter().zip(b) {
                peaks.free(x).unwrap();
                phases.free(y).unwrap();
            }
        }
    }
}
