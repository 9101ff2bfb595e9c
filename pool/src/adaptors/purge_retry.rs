//! Purge and retry on out-of-memory: what libcupool does when an allocation fails under a
//! purge policy (`capi/src/api/memory.rs`, `purge_and_retry`): synchronize, give every idle
//! byte of the pool back to the driver, and try once more.
//!
//! A pool core retries on its own only where its policy says so (ggml's legacy pool flushes
//! its cache, [`crate::pools::LegacyConfig::flush_and_retry`]), and only with its own cache.
//! Behind size classes a request can fail in one class while another class holds the idle
//! memory it needs: wrapped around the whole stack, this purges every class. A plan of an
//! engine under libcupool wraps its pool in it, so that it runs on where the engine does.

use crate::block::Block;
use crate::error::{FreeError, PoolError};
use crate::pool::{Pool, Purge};
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct PurgeRetry {
    inner: Arc<dyn Pool>,
}

impl PurgeRetry {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Pool>) -> Self {
        Self { inner }
    }

    /// The failed request's second chance: `failed` comes back unchanged where nothing idle
    /// could be given back.
    #[cold]
    #[inline(never)]
    fn retry(&self, bytes: usize, failed: PoolError) -> Result<Block, PoolError> {
        if self.inner.releasable(&Purge::All) == 0 {
            return Err(failed);
        }
        let token = crate::sync::synchronize(self.inner.driver().as_ref())?;
        let released = self.inner.purge(&token, Purge::All)?;
        if released.bytes == 0 {
            return Err(failed);
        }
        tracing::info!(pool = %self.inner.kind(), requested = bytes, released = released.bytes, "out of memory: purged the pool and retrying");
        self.inner.alloc(bytes)
    }
}

impl Pool for PurgeRetry {
    forward_identity!(inner);
    forward_accounting!(inner);

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        match self.inner.alloc(bytes) {
            Err(e @ PoolError::OutOfMemory(_)) => self.retry(bytes, e),
            r => r,
        }
    }

    #[inline]
    fn alloc_onto(&self, bytes: usize, out: &mut Vec<Block>) -> Result<(), PoolError> {
        match self.inner.alloc_onto(bytes, out) {
            Ok(()) => Ok(()),
            Err(e @ PoolError::OutOfMemory(_)) => {
                out.push(self.retry(bytes, e)?);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        // No growth, so nothing to purge and retry.
        self.inner.alloc_held(bytes)
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        self.inner.free(block)
    }

    // Nothing of its own to keep: the pool it wraps is the state.
    fn snapshot(&self) -> Result<crate::PoolSnapshot, PoolError> {
        self.inner.snapshot()
    }

    fn restore(&self, snapshot: &crate::PoolSnapshot) -> Result<(), PoolError> {
        self.inner.restore(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::{SimConfig, SimDevice};
    use crate::{PoolConfig, PoolKind};

    /// A card whose memory the small class holds idle: the large request fails in its own
    /// class and succeeds once every class is purged.
    #[test]
    fn another_class_s_idle_memory_serves_the_failed_request() {
        let sim =
            Arc::new(SimDevice::new(SimConfig::gib(16.0 / 1024.0).granularity(2 << 20)).unwrap());
        let mut cfg = PoolConfig::default().kind(PoolKind::Vmm);
        cfg.size_classes = vec![1 << 20];
        let bare = cfg.build(sim.clone()).unwrap();
        let small: Vec<Block> = (0..48).map(|_| bare.alloc(256 << 10).unwrap()).collect();
        for b in small {
            bare.free(b).unwrap();
        }
        let big = 12 << 20;
        assert!(bare.alloc(big).is_err(), "the small class holds the card");
        let wrapped = PurgeRetry::new(bare.clone());
        let b = wrapped.alloc(big).unwrap();
        assert_eq!(b.size(), big);
        wrapped.free(b).unwrap();
        // The same through `alloc_onto`, once the small class holds the card again.
        let token = crate::sync::synchronize(bare.driver().as_ref()).unwrap();
        bare.purge(&token, Purge::All).unwrap();
        let small: Vec<Block> = (0..48).map(|_| bare.alloc(256 << 10).unwrap()).collect();
        for b in small {
            bare.free(b).unwrap();
        }
        assert!(bare.alloc(big).is_err(), "the small class holds the card");
        let mut out = Vec::new();
        wrapped.alloc_onto(big, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].size(), big);
        for b in out {
            wrapped.free(b).unwrap();
        }
        // Nothing idle to give back: the failure comes back as it was.
        let all: Vec<Block> = (0..7).filter_map(|_| wrapped.alloc(2 << 20).ok()).collect();
        let e = wrapped.alloc(big).unwrap_err();
        assert!(matches!(e, PoolError::OutOfMemory(_)), "{e}");
        for b in all {
            wrapped.free(b).unwrap();
        }
    }
}
