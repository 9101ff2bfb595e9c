//! Behaviour added by wrapping a pool, in the style of RMM's resource adaptors. Each takes an
//! `Arc<dyn Pool>` and is one: stack them in any order.
//!
//! - [`Phases`]: per-phase high-water marks (the runtime's per-ubatch numbers);
//! - [`Recorder`](crate::trace::Recorder): a replayable trace of every allocation, free and
//!   phase (it lives with the trace format, in [`crate::trace`]);
//! - [`ManagedFallback`]: on device OOM, serve that one allocation from managed memory;
//! - [`PurgeRetry`]: on device OOM, purge every idle byte and try once more (libcupool's way);
//! - [`SizeClasses`]: a pool for each range of request sizes;
//! - [`ThreadCache`]: each thread keeps the small blocks it freed, for threads sharing a pool;
//! - [`label`]: the name of what is being allocated, for the recorder.
//!
//! A memory limit and fault injection wrap the driver instead (they change what the device
//! does, for every pool on it): see [`crate::driver::limit`] and [`crate::driver::fault`].

/// The `Pool` methods naming the wrapped pool: an adaptor is the pool it wraps.
macro_rules! forward_identity {
    ($inner:ident) => {
        fn id(&self) -> $crate::PoolId {
            self.$inner.id()
        }

        fn kind(&self) -> $crate::PoolKind {
            self.$inner.kind()
        }

        fn driver(&self) -> &std::sync::Arc<dyn $crate::driver::Driver> {
            self.$inner.driver()
        }

        fn alignment(&self) -> usize {
            self.$inner.alignment()
        }
    };
}

/// The `Pool` methods an adaptor that only watches allocations passes through unchanged.
macro_rules! forward_accounting {
    ($inner:ident) => {
        fn purge(
            &self,
            token: &$crate::SyncToken,
            what: $crate::Purge,
        ) -> Result<$crate::Released, $crate::PoolError> {
            self.$inner.purge(token, what)
        }

        fn releasable(&self, what: &$crate::Purge) -> usize {
            self.$inner.releasable(what)
        }

        fn stats(&self) -> $crate::PoolStats {
            self.$inner.stats()
        }

        fn reserved_bytes(&self) -> usize {
            self.$inner.reserved_bytes()
        }

        fn reset_peaks(&self) {
            self.$inner.reset_peaks()
        }

        fn sleep(
            &self,
            token: &$crate::SyncToken,
            offload: bool,
        ) -> Result<$crate::pool::Moved, $crate::PoolError> {
            self.$inner.sleep(token, offload)
        }

        fn wake(&self) -> Result<$crate::pool::Moved, $crate::PoolError> {
            self.$inner.wake()
        }
    };
}

pub mod label;
pub mod managed_fallback;
pub mod phases;
pub mod purge_retry;
pub mod size_classes;
pub mod thread_cache;

pub use managed_fallback::ManagedFallback;
pub use phases::Phases;
pub use purge_retry::PurgeRetry;
pub use size_classes::SizeClasses;
pub use thread_cache::{ThreadBins, ThreadCache, ThreadCacheConfig};
