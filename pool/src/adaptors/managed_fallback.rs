//! Managed-memory fallback on device OOM (ggml's `GGML_CUDA_ALLOC_FALLBACK_MANAGED`).
//!
//! Wraps any pool. When the inner pool runs out of device memory, that one allocation is
//! served from managed memory instead, by a pool core of its own ([`Direct`] placement over
//! [`ManagedMalloc`]): the block is tagged, counted (`fallbacks`, `fallback_live_bytes`, and as
//! live and reserved memory like any other), logged with a warning, and returned to the driver
//! when freed. Managed memory is admitted against the device's managed ledger, so the
//! fallback and every managed pool on the device together stay within its free memory unless
//! oversubscription was allowed explicitly.

use crate::block::Block;
use crate::core::{CoreOptions, CorePool};
use crate::error::{FreeError, PoolError};
use crate::kind::PoolKind;
use crate::placement::direct::Direct;
use crate::pool::{Moved, Pool, Purge, Released};
use crate::stats::PoolStats;
use crate::sync::SyncToken;
use crate::upstream::managed::ManagedMalloc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct ManagedFallback {
    inner: Arc<dyn Pool>,
    managed: CorePool<Direct, ManagedMalloc>,
    /// Live bytes of both, and the peaks of the sums (the pools' own peaks cannot be added).
    live: AtomicUsize,
    live_peak: AtomicUsize,
    reserved_peak: AtomicUsize,
}

impl ManagedFallback {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Pool>, allow_oversubscription: bool) -> Self {
        let driver = inner.driver().clone();
        Self {
            managed: CorePool::from_parts(
                PoolKind::Managed,
                Direct,
                ManagedMalloc::new(driver, allow_oversubscription),
                CoreOptions::default(),
            ),
            inner,
            live: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
            reserved_peak: AtomicUsize::new(0),
        }
    }

    /// The wrapped pool.
    pub fn inner(&self) -> &Arc<dyn Pool> {
        &self.inner
    }

    #[cold]
    fn fall_back(&self, bytes: usize, original: PoolError) -> Result<Block, PoolError> {
        match self.managed.alloc(bytes) {
            Ok(mut block) => {
                block.managed_fallback = true;
                let s = self.managed.stats();
                tracing::warn!(pool = %self.inner.kind(), requested = bytes, fallback_live = s.live_bytes, "device out of memory: served from managed memory");
                Ok(block)
            }
            Err(e) => {
                tracing::warn!(error = %e, "managed fallback refused too");
                let mut original = original;
                if let PoolError::OutOfMemory(report) = &mut original {
                    // The device's report stands; say why the fallback could not help either.
                    let why = match &e {
                        PoolError::OutOfMemory(r) => r.cause.clone(),
                        other => other.to_string(),
                    };
                    report.suggestion = format!(
                        "the managed fallback was refused too ({why}); managed memory is kept within the device's free memory unless oversubscription is allowed (CUPOOL_ALLOW_OVERSUBSCRIPTION=1: paging, and a risk of hanging the GPU)"
                    );
                }
                Err(original)
            }
        }
    }

    fn note_alloc(&self, size: usize) {
        let live = self.live.fetch_add(size, Ordering::Relaxed) + size;
        self.live_peak.fetch_max(live, Ordering::Relaxed);
        self.reserved_peak
            .fetch_max(self.reserved_bytes(), Ordering::Relaxed);
    }
}

impl Pool for ManagedFallback {
    forward_identity!(inner);

    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let result = match self.inner.alloc(bytes) {
            Err(e @ PoolError::OutOfMemory(_)) => self.fall_back(bytes, e),
            other => other,
        };
        match result {
            Ok(block) => {
                self.note_alloc(block.size());
                Ok(block)
            }
            Err(e) => {
                // A failed growth may still leave memory reserved (what the driver refused to
                // undo is kept until the next purge): the peak of the sums must see it.
                self.reserved_peak
                    .fetch_max(self.reserved_bytes(), Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        // Held device memory only: the fallback is for what the device cannot hold.
        let b = self.inner.alloc_held(bytes)?;
        if let Some(b) = &b {
            self.note_alloc(b.size());
        }
        Ok(b)
    }

    fn free(&self, block: Block) -> Result<(), FreeError> {
        let size = block.size();
        if block.pool_id() == self.managed.id() {
            self.managed.free(block)?;
        } else {
            self.inner.free(block)?;
        }
        self.live.fetch_sub(size, Ordering::Relaxed);
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        // Retries managed frees the driver refused, then purges the pool.
        let m = self.managed.purge(token, Purge::All)?;
        let mut r = self.inner.purge(token, what)?;
        r.bytes += m.bytes;
        r.buffers += m.buffers;
        Ok(r)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.inner.releasable(what) + self.managed.releasable(&Purge::All)
    }

    fn stats(&self) -> PoolStats {
        let mut s = self.inner.stats();
        let m = self.managed.stats();
        s.live_bytes += m.live_bytes;
        s.live_blocks += m.live_blocks;
        s.reserved_bytes += m.reserved_bytes;
        s.cached_bytes += m.cached_bytes;
        s.live_peak_bytes = s
            .live_peak_bytes
            .max(self.live_peak.load(Ordering::Relaxed));
        s.reserved_peak_bytes = s
            .reserved_peak_bytes
            .max(self.reserved_peak.load(Ordering::Relaxed));
        s.allocs += m.allocs;
        s.frees += m.frees;
        s.calls = s.calls.plus(&m.calls);
        // Every fallback answered one OOM of the inner pool: the caller saw no failure.
        s.ooms = s.ooms.saturating_sub(m.allocs);
        s.fallbacks = m.allocs;
        s.fallback_live_bytes = m.live_bytes;
        s.fallback_live_peak_bytes = m.live_peak_bytes;
        s.purges += m.purges;
        s.purged_bytes += m.purged_bytes;
        s
    }

    fn reserved_bytes(&self) -> usize {
        self.inner.reserved_bytes() + self.managed.reserved_bytes()
    }

    fn reset_peaks(&self) {
        self.inner.reset_peaks();
        self.managed.reset_peaks();
        self.live_peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
        self.reserved_peak
            .store(self.reserved_bytes(), Ordering::Relaxed);
    }

    // The managed blocks stay where they are (the driver pages them): only the pool sleeps.
    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        self.inner.sleep(token, offload)
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        self.inner.wake()
    }
}
