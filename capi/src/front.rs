//! What a thread's state (`local.rs`) reaches of its stream's pool on the hot path: the pool
//! itself, the bounds of what a thread keeps, whether the pool sleeps, and the directory of
//! which state holds each block (`owners.rs`). Generic over the holder's type, so this sits
//! below the states it serves.

use crate::owners::Owners;
use crate::peaks::Peaks;
use crate::status::Failure;
use cupool_pool::adaptors::ThreadCacheConfig;
use cupool_pool::{Block, Pool, PoolKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A stream's pool as its threads' states see it; `T` is the state type.
pub(crate) struct Front<T> {
    pub inner: Arc<dyn Pool>,
    config: ThreadCacheConfig,
    /// Set by a sleep, cleared by a successful wake: the bins neither serve nor keep meanwhile.
    asleep: AtomicBool,
    /// Which state holds each block taken from the pool.
    pub owners: Owners<T>,
    /// The stream and tag of the pool (what the memory history and the segments name).
    pub at: (u64, u32),
}

/// What a thread keeps at most where the blocks it keeps share the VMM pool's range with larger
/// ones: one granule's worth.
pub(crate) const SHARED_RANGE_KEPT: usize = 2 << 20;

/// Whether the blocks a thread keeps (up to [`ThreadCacheConfig::max_block`]) have an address
/// range of their own under `size_classes` (a pool's bounds): the first class ends at the
/// largest of them.
pub(crate) fn kept_apart(size_classes: &[usize]) -> bool {
    size_classes.first() == Some(&ThreadCacheConfig::default().max_block)
}

impl<T> Front<T> {
    /// `kept_apart`: see [`kept_apart`].
    pub(crate) fn new(inner: Arc<dyn Pool>, at: (u64, u32), kept_apart: bool) -> Self {
        let config = match inner.kind() {
            // ggml's legacy pool decides which cached buffer serves each request (the
            // smallest that fits, whatever size it was made for); blocks a thread kept by
            // request size would be missing from that choice, and the pool would grow for
            // requests they could serve (13.4 MiB more on ik_llama.cpp's MoE prefill,
            // data/h100-2026-11-27-ik-warmup). So a legacy pool's threads keep nothing.
            PoolKind::Legacy => ThreadCacheConfig {
                max_block: 0,
                max_bytes: 0,
            },
            // A kept block is live to the pool, and in one range with larger blocks it pins
            // the page it lies in, which recycling would otherwise move to a large block: on
            // the recorded MoE prefill, against keeping nothing, 8 MiB kept cost 18 MiB of
            // reserve and 2 MiB cost 4, where keeping nothing doubles a small allocation's
            // time (docs/pytorch.md, "One range for a framework's tensors").
            PoolKind::Vmm if !kept_apart => ThreadCacheConfig {
                max_bytes: SHARED_RANGE_KEPT,
                ..ThreadCacheConfig::default()
            },
            _ => ThreadCacheConfig::default(),
        };
        Self {
            inner,
            config,
            asleep: AtomicBool::new(false),
            owners: Owners::default(),
            at,
        }
    }

    #[inline]
    pub(crate) fn asleep(&self) -> bool {
        self.asleep.load(Ordering::Acquire)
    }

    pub(crate) fn set_asleep(&self, asleep: bool) {
        self.asleep.store(asleep, Ordering::Release);
    }

    #[inline]
    pub(crate) fn config(&self) -> &ThreadCacheConfig {
        &self.config
    }

    /// A block of `size` bytes from the pool for `owner`, listed under it; `peaks` notes what
    /// the pool holds now.
    #[inline]
    pub(crate) fn take_from_pool(
        &self,
        owner: &Arc<T>,
        size: usize,
        peaks: &Peaks,
    ) -> Result<Block, Failure> {
        // Memory the pool takes from the driver for this block is this stream's segment.
        let b = crate::segments::on_stream(self.at.0, self.at.1, || self.inner.alloc(size))?;
        self.listed(owner, b, peaks)
    }

    /// A block of `size` bytes from memory the pool holds already, listed under `owner`;
    /// `None` where the pool would need new memory for it.
    pub(crate) fn take_held(
        &self,
        owner: &Arc<T>,
        size: usize,
        peaks: &Peaks,
    ) -> Result<Option<Block>, Failure> {
        match self.inner.alloc_held(size)? {
            Some(b) => self.listed(owner, b, peaks).map(Some),
            None => Ok(None),
        }
    }

    /// A block the pool handed out, listed under `owner`, once the stream may use it.
    fn listed(&self, owner: &Arc<T>, b: Block, peaks: &Peaks) -> Result<Block, Failure> {
        // Where the driver maps pages behind the pool's back (CUPOOL_VMM_DEFER), the stream
        // waits for what is queued before it runs anything queued after this allocation. A
        // block from a thread's bins needs none: it was handed out on this stream before.
        if let Err(e) = self.inner.driver().fence(self.at.0) {
            if let Err(back) = self.inner.free(b) {
                tracing::error!(error = %back.error, "a block refused at its fence could not go back to the pool");
            }
            return Err(Failure::from(cupool_pool::PoolError::from(e)));
        }
        self.owners.insert(b.ptr(), owner.clone());
        peaks.note(self.inner.reserved_bytes());
        Ok(b)
    }

    /// Gives a block a thread held back to the pool.
    #[inline]
    pub(crate) fn give_to_pool(&self, b: Block) -> Result<(), Failure> {
        // Unlisted first: the next thread the pool hands the address to lists itself after.
        self.owners.remove(b.ptr());
        self.inner.free(b).map_err(|e| Failure::from(e.error))
    }
}
