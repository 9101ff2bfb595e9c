//! Managed-memory fallback on device OOM (ggml's `GGML_CUDA_ALLOC_FALLBACK_MANAGED`).
//!
//! Wraps any pool. When the inner pool runs out of device memory, that one allocation is
//! served from managed memory instead: the block is tagged, counted in the stats
//! (`fallbacks`, `fallback_live_bytes`) and logged with a warning, and freeing it returns it
//! straight to the driver. Managed memory is never requested beyond what the physical device
//! has free unless oversubscription was allowed explicitly.

use crate::block::{Block, PoolId};
use crate::driver::Driver;
use crate::error::{FreeError, PoolError};
use crate::pools::{Pool, PoolKind, Purge, Released};
use crate::stats::{PhaseStats, PoolStats};
use crate::sync::SyncToken;
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Debug, Default)]
struct Counters {
    fallbacks: u64,
    live_bytes: usize,
    frees: u64,
    /// Managed blocks the driver refused to free: (pointer, size), retried later.
    pending: Vec<(u64, usize)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct ManagedFallback {
    id: PoolId,
    inner: Arc<dyn Pool>,
    allow_oversubscription: bool,
    counters: Mutex<Counters>,
}

impl ManagedFallback {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Pool>, allow_oversubscription: bool) -> Self {
        Self {
            id: PoolId::fresh(),
            inner,
            allow_oversubscription,
            counters: Mutex::new(Counters::default()),
        }
    }

    /// The wrapped pool.
    pub fn inner(&self) -> &Arc<dyn Pool> {
        &self.inner
    }

    /// Retries frees the driver refused earlier.
    fn retry_pending(&self) {
        let mut c = self.counters.lock();
        let driver = self.inner.driver();
        c.pending
            .retain(|&(ptr, _)| driver.free_managed(ptr).is_err());
    }

    #[cold]
    fn fall_back(&self, size: usize, original: PoolError) -> Result<Block, PoolError> {
        let driver = self.inner.driver();
        if !self.allow_oversubscription {
            match driver.managed_headroom() {
                Ok(free) if size <= free => {}
                Ok(free) => {
                    tracing::warn!(requested = size, device_free = free, "managed fallback refused: the request exceeds the device's free memory and oversubscription is not allowed");
                    return Err(original);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "managed fallback refused: device free memory unknown");
                    return Err(original);
                }
            }
        }
        match driver.malloc_managed(size) {
            Ok(ptr) => {
                let mut c = self.counters.lock();
                c.fallbacks += 1;
                c.live_bytes += size;
                tracing::warn!(pool = %self.inner.kind(), requested = size, fallback_live = c.live_bytes, "device out of memory: served from managed memory");
                Ok(Block {
                    ptr,
                    size,
                    capacity: size,
                    pool: self.id,
                    managed_fallback: true,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "managed fallback failed too");
                Err(original)
            }
        }
    }
}

impl Drop for ManagedFallback {
    fn drop(&mut self) {
        self.retry_pending();
        let c = self.counters.get_mut();
        if !c.pending.is_empty() {
            tracing::error!(
                blocks = c.pending.len(),
                "managed fallback blocks could not be freed"
            );
        }
    }
}

impl Pool for ManagedFallback {
    fn id(&self) -> PoolId {
        self.id
    }

    fn kind(&self) -> PoolKind {
        self.inner.kind()
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        self.inner.driver()
    }

    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        match self.inner.alloc(bytes) {
            Err(e @ PoolError::OutOfMemory(_)) => self.fall_back(bytes.max(1), e),
            other => other,
        }
    }

    fn free(&self, block: Block) -> Result<(), FreeError> {
        if !block.managed_fallback {
            return self.inner.free(block);
        }
        if block.pool != self.id {
            let error = PoolError::WrongPool {
                owner: block.pool,
                given_to: self.id,
            };
            return Err(FreeError { error, block });
        }
        // cuMemFree waits for the device, so queued work on this block finishes first.
        let result = self.inner.driver().free_managed(block.ptr);
        let mut c = self.counters.lock();
        c.live_bytes -= block.size;
        c.frees += 1;
        if let Err(e) = result {
            tracing::error!(error = %e, "driver refused to free a managed fallback block; kept for a later retry");
            c.pending.push((block.ptr, block.size));
        }
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        self.retry_pending();
        self.inner.purge(token, what)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.inner.releasable(what)
    }

    fn stats(&self) -> PoolStats {
        let mut s = self.inner.stats();
        let c = self.counters.lock();
        s.fallbacks = c.fallbacks;
        s.fallback_live_bytes = c.live_bytes;
        s.calls.managed_mallocs += c.fallbacks;
        s.calls.managed_frees += c.frees;
        s
    }

    fn reset_peaks(&self) {
        self.inner.reset_peaks()
    }

    fn begin_phase(&self, name: &str) {
        self.inner.begin_phase(name)
    }

    fn end_phase(&self) -> Option<PhaseStats> {
        self.inner.end_phase()
    }

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
}
