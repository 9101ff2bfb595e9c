//! A stream's pool with its threads' states in front (`local.rs`): the `Pool` the library's
//! slow paths see. Each thread keeps the small blocks it freed, by request size, as the pool's
//! `ThreadCache` does, but inside the state libcupool already locks for the call, so a cached
//! pair takes one uncontended lock.
//!
//! What a thread keeps is bounded (`ThreadCacheConfig`) and reported (`thread_cached_bytes`);
//! every slow path of the pool (purge, sleep, what `releasable` counts, a reset of its peaks)
//! first gives every thread's blocks back, and a sleep stops the bins serving or keeping until
//! the wake. The pool counts kept blocks as live: the statistics move them to cached.

use crate::front::Front;
use crate::local::Local;
use crate::status::Failure;
use cupool_pool::driver::Driver;
use cupool_pool::{
    synchronize, Block, FreeError, Moved, Pool, PoolError, PoolId, PoolKind, PoolStats, Purge,
    Released, SyncToken,
};
use parking_lot::Mutex;
use std::sync::Arc;

/// What states that were dropped (their threads exited, nothing of theirs live) still count
/// for: a peak stays until the user resets it, the counts of served calls always, and what the
/// interval since the last boundary held.
#[derive(Default)]
struct Gone {
    live_peak: usize,
    hits: u64,
    kept: u64,
    keep: Vec<usize>,
}

/// See the module docs; `P` is the stream pool the states serve from.
pub(crate) struct Cached<P> {
    pub front: Front<Local<P>>,
    /// Every thread's state (the shared way's first).
    locals: Mutex<Vec<Arc<Local<P>>>>,
    gone: Mutex<Gone>,
}

impl<P> Cached<P> {
    /// `at`: the stream and tag of the pool; `kept_apart`: see [`crate::front::kept_apart`].
    pub(crate) fn new(
        inner: Arc<dyn Pool>,
        shared: Arc<Local<P>>,
        at: (u64, u32),
        kept_apart: bool,
    ) -> Self {
        Self {
            front: Front::new(inner, at, kept_apart),
            locals: Mutex::new(vec![shared]),
            gone: Mutex::new(Gone::default()),
        }
    }

    /// A new thread's state, serving from `s` (whose pool this is).
    pub(crate) fn join(&self, s: Arc<P>) -> Arc<Local<P>> {
        let l = Arc::new(Local::serving(s));
        self.locals.lock().push(l.clone());
        l
    }

    /// Every state listed now.
    fn locals(&self) -> Vec<Arc<Local<P>>> {
        self.locals.lock().clone()
    }

    /// Frees `ptr` wherever it is live: a free from another thread than the one that allocated
    /// (or from one whose state is gone). `None` if no state holds it live.
    pub(crate) fn free_any(
        &self,
        device: usize,
        ptr: u64,
        size: usize,
    ) -> Option<Result<(), Failure>> {
        let owner = self.front.owners.get(ptr)?;
        let (r, idle) = {
            let mut st = owner.lock();
            let r = st.held.free(&self.front, device, ptr, size);
            (r, st.held.retired && st.held.live.is_empty())
        };
        if idle {
            self.unlist_if_idle(&owner);
        }
        r
    }

    /// The size asked for and the usable size of `ptr`, if it is a live block of this pool (not
    /// one a thread keeps for reuse).
    pub(crate) fn live_sizes(&self, ptr: u64) -> Option<(usize, usize)> {
        let owner = self.front.owners.get(ptr)?;
        let st = owner.lock();
        st.held
            .live
            .get(&ptr)
            .map(|(asked, b)| (*asked, b.capacity()))
    }

    /// Every live block (not those a thread keeps for reuse): its address, the size asked for
    /// and its usable size, for the memory snapshot.
    pub(crate) fn live(&self) -> Vec<(u64, usize, usize)> {
        let mut out = Vec::new();
        for l in self.locals() {
            let st = l.lock();
            out.extend(
                st.held
                    .live
                    .iter()
                    .map(|(&ptr, (asked, b))| (ptr, *asked, b.capacity())),
            );
        }
        out
    }

    /// Drops `l` from the list if its thread exited and nothing of it is live; what it counted
    /// stays in the statistics.
    pub(crate) fn unlist_if_idle(&self, l: &Arc<Local<P>>) {
        let mut locals = self.locals.lock();
        let mut st = l.lock();
        if !st.held.retired || !st.held.live.is_empty() {
            return;
        }
        let Some(i) = locals.iter().position(|x| Arc::ptr_eq(x, l)) else {
            return;
        };
        let mut gone = self.gone.lock();
        gone.live_peak += st.held.usage.live_peak();
        let (hits, kept) = st.held.bins.hits_and_kept();
        gone.hits += hits;
        gone.kept += kept;
        let keep = st.held.usage.take_keep();
        gone.keep.extend(keep);
        drop(st);
        locals.swap_remove(i);
    }

    /// Gives every thread's kept blocks back to the pool; returns how many.
    pub(crate) fn flush(&self) -> usize {
        self.locals()
            .iter()
            .map(|l| l.lock().held.flush(&self.front))
            .sum()
    }

    /// Flushes before a purge or a sleep under `token`. The pool stamps the flushed blocks as
    /// freed now, after the token's synchronize, so it would keep them: when anything was
    /// flushed, a fresh synchronize covers them (libcupool's tokens are always of this pool's
    /// device).
    fn flush_and_sync(&self) -> Result<Option<SyncToken>, PoolError> {
        if self.flush() == 0 {
            return Ok(None);
        }
        Ok(Some(synchronize(self.front.inner.driver().as_ref())?))
    }

    /// Waits for every call in flight through a thread's state to end.
    pub(crate) fn wait_calls(&self) {
        for l in self.locals() {
            drop(l.lock());
        }
    }

    /// The library closes: every thread's blocks go back, and no state serves from this pool
    /// any more (nor keeps it alive).
    pub(crate) fn close(&self) {
        for l in self.locals() {
            let mut st = l.lock();
            st.held.flush(&self.front);
            // A remote free still in flight gives its block to the pool, not to a bin.
            st.held.keeps = false;
            st.pool = None;
        }
        self.front.owners.clear();
    }

    /// Blocks live now.
    pub(crate) fn live_blocks(&self) -> usize {
        self.locals().iter().map(|l| l.lock().held.live.len()).sum()
    }

    /// Threads' states listed, the shared way's apart.
    #[cfg(test)]
    pub(crate) fn threads(&self) -> usize {
        self.locals.lock().len() - 1
    }

    /// The requests to keep buffers for at a boundary, largest first: for each size, the most
    /// each thread held at once, added up (exact with one thread per stream, an engine's, an
    /// upper bound with several). Every thread's interval starts afresh.
    pub(crate) fn take_keep(&self) -> Vec<usize> {
        let mut keep = std::mem::take(&mut self.gone.lock().keep);
        for l in self.locals() {
            keep.extend(l.lock().held.usage.take_keep());
        }
        keep.sort_unstable_by(|a, b| b.cmp(a));
        keep
    }

    /// The live peak since the last reset: the threads' own peaks added up (exact with one
    /// thread, an upper bound with several).
    pub(crate) fn live_peak(&self) -> usize {
        let locals = self.locals.lock();
        let threads: usize = locals.iter().map(|l| l.lock().held.usage.live_peak()).sum();
        threads + self.gone.lock().live_peak
    }

    /// Every thread's live peak restarts from what it holds now.
    pub(crate) fn reset_live_peaks(&self) {
        let locals = self.locals.lock();
        for l in locals.iter() {
            l.lock().held.usage.reset_peak();
        }
        self.gone.lock().live_peak = 0;
    }
}

impl<P> std::fmt::Debug for Cached<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("inner", &self.front.inner)
            .field("config", self.front.config())
            .finish_non_exhaustive()
    }
}

impl<P: Send + Sync + 'static> Pool for Cached<P> {
    fn id(&self) -> PoolId {
        self.front.inner.id()
    }

    fn kind(&self) -> PoolKind {
        self.front.inner.kind()
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        self.front.inner.driver()
    }

    fn alignment(&self) -> usize {
        self.front.inner.alignment()
    }

    /// Straight from the pool: libcupool's calls go through the threads' states.
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        self.front.inner.alloc(bytes)
    }

    fn free(&self, block: Block) -> Result<(), FreeError> {
        self.front.inner.free(block)
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        // A pool may release a block's memory as the flush frees it (legacy's full slots):
        // that is released by this purge too.
        let before = self.front.inner.reserved_bytes();
        let fresh = self.flush_and_sync()?;
        let flushed = before.saturating_sub(self.front.inner.reserved_bytes());
        let mut r = self
            .front
            .inner
            .purge(fresh.as_ref().unwrap_or(token), what)?;
        r.bytes += flushed;
        Ok(r)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.flush();
        self.front.inner.releasable(what)
    }

    fn stats(&self) -> PoolStats {
        let (mut asked, mut bytes, mut blocks, mut hits, mut kept) = (0, 0, 0, 0, 0);
        {
            // The list stays locked: a state unlisted meanwhile would count twice.
            let locals = self.locals.lock();
            for l in locals.iter() {
                let st = l.lock();
                let (a, b, n) = st.held.kept();
                let (h, k) = st.held.bins.hits_and_kept();
                (asked, bytes, blocks) = (asked + a, bytes + b, blocks + n);
                (hits, kept) = (hits + h, kept + k);
            }
            let g = self.gone.lock();
            hits += g.hits;
            kept += g.kept;
        }
        let mut s = self.front.inner.stats();
        s.live_bytes = s.live_bytes.saturating_sub(asked);
        s.live_blocks = s.live_blocks.saturating_sub(blocks);
        s.cached_bytes += bytes;
        s.thread_cached_bytes += bytes;
        s.allocs += hits;
        s.frees += kept;
        s
    }

    fn reserved_bytes(&self) -> usize {
        self.front.inner.reserved_bytes()
    }

    fn reset_peaks(&self) {
        self.flush();
        self.front.inner.reset_peaks()
    }

    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        // Raised first: a block freed while the flush runs goes to the pool, not a bin.
        self.front.set_asleep(true);
        let fresh = self.flush_and_sync()?;
        let r = self
            .front
            .inner
            .sleep(fresh.as_ref().unwrap_or(token), offload);
        if let Err(PoolError::CannotSleep { .. } | PoolError::WrongDevice { .. }) = &r {
            // Refused before anything changed: the pool serves on, and so do the bins.
            self.front.set_asleep(false);
        }
        r
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        let moved = self.front.inner.wake()?;
        self.front.set_asleep(false);
        Ok(moved)
    }
}
