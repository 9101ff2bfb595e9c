//! A cache per thread in front of a pool that several threads share.
//!
//! One pool serves one stream, and a framework's threads share a stream (PyTorch's default
//! stream, say): every allocation and free then takes the pool's lock, and under eight threads
//! the lock's cache line, not the work, sets the pace (micro-seconds per pair, measured). Here
//! each thread keeps the small blocks it freed, by request size, and serves the same size from
//! them without touching the pool, the way tcmalloc's and jemalloc's thread caches do. Reuse
//! stays on the pool's stream, so it is ordered like the pool's own.
//!
//! What a cache holds is bounded (blocks up to [`ThreadCacheConfig::max_block`], at most
//! [`ThreadCacheConfig::max_bytes`] per thread) and reported
//! ([`PoolStats::thread_cached_bytes`]); every slow path of the pool (purge, trim, sleep, what
//! [`Pool::releasable`] counts) first gives every thread's blocks back, so a cache never keeps
//! memory a purge should return, also the cache of a thread that has exited. The pool counts
//! cached blocks as live until then: its live *peak* can exceed what users held by at most the
//! bound per thread (the current values, `live_bytes` and `cached_bytes`, are exact).

use crate::block::Block;
use crate::error::{FreeError, PoolError};
use crate::pool::{Moved, Pool, Purge, Released};
use crate::stats::PoolStats;
use crate::sync::{synchronize, SyncToken};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use thread_local::ThreadLocal;

/// How much a thread may keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadCacheConfig {
    /// The largest block a thread keeps (capacity, bytes); larger ones go back to the pool.
    pub max_block: usize,
    /// Bytes (capacity) a thread keeps at most; beyond, frees go back to the pool.
    pub max_bytes: usize,
}

impl Default for ThreadCacheConfig {
    fn default() -> Self {
        Self {
            max_block: 1 << 20,
            max_bytes: 8 << 20,
        }
    }
}

/// Distinct request sizes a thread keeps blocks of.
const SIZES: usize = 16;

/// One thread's blocks, by request size: what a [`ThreadCache`] keeps per thread, public for a
/// caller that keeps its per-thread state itself, behind a lock it already takes (libcupool).
/// Its blocks must go back to their pool before the pool purges, sleeps or counts what it
/// could release, as [`ThreadCache`] does.
#[derive(Debug, Default)]
pub struct ThreadBins {
    /// (request size, blocks).
    bins: Vec<(usize, Vec<Block>)>,
    /// Capacity of every block held.
    bytes: usize,
    /// Request sizes of every block held (what the pool counts as live for them).
    asked: usize,
    blocks: usize,
    /// Allocations served and frees kept here, which the pool never saw.
    hits: u64,
    kept: u64,
}

impl ThreadBins {
    /// A kept block of request size `size`, if any.
    #[inline]
    pub fn take(&mut self, size: usize) -> Option<Block> {
        let i = self.bins.iter().rposition(|(s, _)| *s == size)?;
        let b = self.bins[i].1.pop()?;
        self.bytes -= b.capacity();
        self.asked -= b.size();
        self.blocks -= 1;
        self.hits += 1;
        Some(b)
    }

    /// Keeps `b` if the bounds allow; gives it back otherwise.
    #[inline]
    pub fn keep(&mut self, b: Block, config: &ThreadCacheConfig) -> Result<(), Block> {
        let (size, capacity) = (b.size(), b.capacity());
        if capacity > config.max_block || self.bytes + capacity > config.max_bytes {
            return Err(b);
        }
        match self.bins.iter().rposition(|(s, _)| *s == size) {
            Some(i) => self.bins[i].1.push(b),
            None => {
                if self.bins.len() >= SIZES {
                    // A new size while every bin is taken: an empty bin makes room, else the
                    // block goes back to the pool.
                    match self.bins.iter().position(|(_, v)| v.is_empty()) {
                        Some(i) => {
                            self.bins.remove(i);
                        }
                        None => return Err(b),
                    }
                }
                self.bins.push((size, vec![b]));
            }
        }
        self.bytes += capacity;
        self.asked += size;
        self.blocks += 1;
        self.kept += 1;
        Ok(())
    }

    /// Every kept block, the bins left empty.
    pub fn drain(&mut self) -> Vec<Block> {
        // The pool counts these frees as it takes the blocks back: no longer kept here.
        self.kept -= self.blocks as u64;
        self.bytes = 0;
        self.asked = 0;
        self.blocks = 0;
        self.bins.drain(..).flat_map(|(_, v)| v).collect()
    }

    /// Capacity of every block kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Request sizes of every block kept (what the pool counts as live for them).
    pub fn asked(&self) -> usize {
        self.asked
    }

    /// Blocks kept.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Allocations served and frees kept here, which the pool never saw.
    pub fn hits_and_kept(&self) -> (u64, u64) {
        (self.hits, self.kept)
    }
}

/// The sums of every thread's [`ThreadBins`].
#[derive(Default)]
struct Held {
    bytes: usize,
    asked: usize,
    blocks: usize,
    hits: u64,
    kept: u64,
}

/// A thread's cache on lines of its own: threads must not write each other's lines.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Slot(Mutex<ThreadBins>);

/// See the module docs.
#[derive(Debug)]
pub struct ThreadCache {
    inner: Arc<dyn Pool>,
    config: ThreadCacheConfig,
    slots: ThreadLocal<Slot>,
    /// Set by a sleep, cleared by a successful wake: the caches neither serve nor keep
    /// meanwhile, so no block is handed out over memory a sleep released.
    asleep: AtomicBool,
}

impl ThreadCache {
    /// Thread caches in front of `inner`, bounded by `config`.
    pub fn new(inner: Arc<dyn Pool>, config: ThreadCacheConfig) -> Self {
        Self {
            inner,
            config,
            slots: ThreadLocal::new(),
            asleep: AtomicBool::new(false),
        }
    }

    /// Gives every thread's blocks back to the pool; returns how many.
    pub fn flush(&self) -> usize {
        let mut n = 0;
        for slot in self.slots.iter() {
            let blocks = slot.0.lock().drain();
            n += blocks.len();
            self.give_back(blocks);
        }
        n
    }

    /// Gives kept blocks back to the pool.
    fn give_back(&self, blocks: Vec<Block>) {
        for b in blocks {
            if let Err(e) = self.inner.free(b) {
                // Only blocks this pool handed out are kept: this is a bug, and the block
                // goes back to its pool through its drop.
                tracing::error!(error = %e.error, "a thread-cached block was refused by its pool");
            }
        }
    }

    /// Flushes before a purge or a sleep under `token`. The pool stamps the flushed blocks as
    /// freed now, after the token's synchronize, so it would keep them (a free after the
    /// synchronize may still be in use by queued work): when anything was flushed, a fresh
    /// synchronize covers them. A token of another device is left for the pool to refuse.
    fn flush_and_sync(&self, token: &SyncToken) -> Result<Option<SyncToken>, PoolError> {
        if self.flush() == 0 || !token.is_for(self.inner.driver().epoch()) {
            return Ok(None);
        }
        Ok(Some(synchronize(self.inner.driver().as_ref())?))
    }

    /// What every thread keeps now, and the allocations and frees the caches served.
    fn held(&self) -> Held {
        self.slots.iter().fold(Held::default(), |h, s| {
            let g = s.0.lock();
            Held {
                bytes: h.bytes + g.bytes,
                asked: h.asked + g.asked,
                blocks: h.blocks + g.blocks,
                hits: h.hits + g.hits,
                kept: h.kept + g.kept,
            }
        })
    }
}

impl Pool for ThreadCache {
    forward_identity!(inner);

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        if self.asleep.load(Ordering::Acquire) {
            return self.inner.alloc(bytes);
        }
        if let Some(slot) = self.slots.get() {
            let mut bins = slot.0.lock();
            if let Some(b) = bins.take(bytes.max(1)) {
                return Ok(b);
            }
            // A miss the pool could serve only with new memory: what this thread keeps goes
            // back first, where it may serve the request (kept blocks must not make the pool
            // grow).
            if bins.blocks > 0 && bytes <= self.config.max_block {
                if let Some(b) = self.inner.alloc_held(bytes)? {
                    return Ok(b);
                }
                self.give_back(bins.drain());
            }
        }
        self.inner.alloc(bytes)
    }

    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        if !self.asleep.load(Ordering::Acquire) {
            if let Some(slot) = self.slots.get() {
                if let Some(b) = slot.0.lock().take(bytes.max(1)) {
                    return Ok(Some(b));
                }
            }
        }
        self.inner.alloc_held(bytes)
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        if block.pool_id() != self.inner.id()
            || block.capacity() > self.config.max_block
            || self.asleep.load(Ordering::Acquire)
        {
            return self.inner.free(block);
        }
        let slot = self.slots.get_or_default();
        let kept = slot.0.lock().keep(block, &self.config);
        match kept {
            Ok(()) => Ok(()),
            Err(block) => self.inner.free(block),
        }
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        // A pool may release a block's memory as the flush frees it (legacy's full slots):
        // that is released by this purge too.
        let before = self.inner.reserved_bytes();
        let fresh = self.flush_and_sync(token)?;
        let flushed = before.saturating_sub(self.inner.reserved_bytes());
        let mut r = self.inner.purge(fresh.as_ref().unwrap_or(token), what)?;
        r.bytes += flushed;
        Ok(r)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.flush();
        self.inner.releasable(what)
    }

    fn stats(&self) -> PoolStats {
        let h = self.held();
        let mut s = self.inner.stats();
        s.live_bytes = s.live_bytes.saturating_sub(h.asked);
        s.live_blocks = s.live_blocks.saturating_sub(h.blocks);
        s.cached_bytes += h.bytes;
        s.thread_cached_bytes += h.bytes;
        s.allocs += h.hits;
        s.frees += h.kept;
        s
    }

    fn reserved_bytes(&self) -> usize {
        self.inner.reserved_bytes()
    }

    fn reset_peaks(&self) {
        self.flush();
        self.inner.reset_peaks()
    }

    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        // Raised first: a block freed while the flush runs goes to the pool, not a cache.
        self.asleep.store(true, Ordering::Release);
        let fresh = self.flush_and_sync(token)?;
        let r = self.inner.sleep(fresh.as_ref().unwrap_or(token), offload);
        if let Err(PoolError::CannotSleep { .. } | PoolError::WrongDevice { .. }) = &r {
            // Refused before anything changed: the pool serves on, and so do the caches.
            self.asleep.store(false, Ordering::Release);
        }
        r
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        let moved = self.inner.wake()?;
        self.asleep.store(false, Ordering::Release);
        Ok(moved)
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        self.flush();
    }
}
