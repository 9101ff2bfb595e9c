//! Phases: the high-water marks of a named stretch of work.
//!
//! The runtime opens a phase per ubatch; closing it returns that stretch's peak of live and
//! reserved bytes, where it ended, and the driver calls and OOMs made in it. Phases nest:
//! [`Phases::begin_phase`] pushes one, [`Phases::end_phase`] pops the innermost, and an outer
//! phase's peak includes its inner phases'. The counters are atomics, so the hot path costs a
//! few uncontended atomic operations and no lock; the stack is only locked to push and pop.

use crate::block::Block;
use crate::error::{FreeError, PoolError};
use crate::pool::Pool;
use crate::stats::{PhaseStats, PoolStats};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
struct Frame {
    name: String,
    /// The enclosing phase's peaks, restored (merged) when this one ends.
    outer_live_peak: usize,
    outer_reserved_peak: usize,
    at_start: PoolStats,
}

/// See the module docs.
#[derive(Debug)]
pub struct Phases {
    inner: Arc<dyn Pool>,
    /// Bytes of the blocks that passed through this adaptor and are live.
    live: AtomicUsize,
    /// Peaks of the innermost open phase.
    live_peak: AtomicUsize,
    reserved_peak: AtomicUsize,
    stack: Mutex<Vec<Frame>>,
}

impl Phases {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Pool>) -> Self {
        Self {
            inner,
            live: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
            reserved_peak: AtomicUsize::new(0),
            stack: Mutex::new(Vec::new()),
        }
    }

    /// The wrapped pool.
    pub fn inner(&self) -> &Arc<dyn Pool> {
        &self.inner
    }

    /// Opens a phase named `name`, inside the open one if any.
    pub fn begin_phase(&self, name: &str) {
        let mut stack = self.stack.lock();
        let live = self.live.load(Ordering::Relaxed);
        stack.push(Frame {
            name: name.to_owned(),
            outer_live_peak: self.live_peak.swap(live, Ordering::Relaxed),
            outer_reserved_peak: self
                .reserved_peak
                .swap(self.inner.reserved_bytes(), Ordering::Relaxed),
            at_start: self.inner.stats(),
        });
    }

    /// Closes the innermost phase and returns its numbers, or `None` if none is open.
    pub fn end_phase(&self) -> Option<PhaseStats> {
        let mut stack = self.stack.lock();
        let f = stack.pop()?;
        let now = self.inner.stats();
        let live_peak = self.live_peak.load(Ordering::Relaxed);
        let reserved_peak = self.reserved_peak.load(Ordering::Relaxed);
        self.live_peak
            .store(live_peak.max(f.outer_live_peak), Ordering::Relaxed);
        self.reserved_peak
            .store(reserved_peak.max(f.outer_reserved_peak), Ordering::Relaxed);
        Some(PhaseStats {
            name: f.name,
            live_peak_bytes: live_peak,
            reserved_peak_bytes: reserved_peak.max(now.reserved_bytes),
            live_end_bytes: now.live_bytes,
            reserved_end_bytes: now.reserved_bytes,
            cached_end_bytes: now.cached_bytes,
            calls: now.calls.since(&f.at_start.calls),
            ooms: now.ooms.saturating_sub(f.at_start.ooms),
        })
    }

    /// How many phases are open.
    pub fn depth(&self) -> usize {
        self.stack.lock().len()
    }
}

impl Pool for Phases {
    forward_identity!(inner);
    forward_accounting!(inner);

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let block = self.inner.alloc(bytes)?;
        let live = self.live.fetch_add(block.size(), Ordering::Relaxed) + block.size();
        self.live_peak.fetch_max(live, Ordering::Relaxed);
        self.reserved_peak
            .fetch_max(self.inner.reserved_bytes(), Ordering::Relaxed);
        Ok(block)
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        let size = block.size();
        self.inner.free(block)?;
        self.live.fetch_sub(size, Ordering::Relaxed);
        Ok(())
    }
}
