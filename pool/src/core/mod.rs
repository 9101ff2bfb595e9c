//! The pool core: everything every pool does, written once, over a placement and an upstream.
//!
//! [`CorePool`] owns the lock, the identity and ownership checks, poisoning, the epoch stamp of
//! every free, the [`SyncToken`] check, the counters, the out-of-memory report, flush-and-retry
//! and the drop contract. The placement ([`crate::placement`]) decides where a block goes; the
//! upstream ([`crate::upstream`]) makes the driver calls. Neither sees the other, and neither
//! keeps a counter.
//!
//! The pool's state sits inline, so the hot path (a cached alloc and free) reaches it without
//! chasing a pointer. Blocks dropped instead of freed wait in the pool's inbox and are taken
//! back at the next slow path (growth, purge, stats). A pool dropped with live blocks moves its
//! state into a retired core that the owners table keeps until those blocks are dropped.

mod oom;

use crate::block::Block;
use crate::driver::{Driver, DriverError};
use crate::error::{FreeError, OomReport, PoolError};
use crate::kind::PoolKind;
use crate::owners::{self, Inbox, Parts, PoolId, Reclaim};
use crate::placement::{Fit, Placement, Segment};
use crate::pool::{checked_request, Pool, Purge, Released};
use crate::stats::{PoolStats, Tracker};
use crate::sync::{synchronize, SyncToken};
use crate::upstream::Upstream;
use parking_lot::Mutex;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What the core does on its slow paths, beyond asking the upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreOptions {
    /// On out-of-memory: synchronize, release every idle segment, retry once (ggml after
    /// PR #22155).
    pub flush_and_retry: bool,
    /// Before growing: synchronize and release idle segments smaller than the request
    /// (PR #22158's managed pool: they would sit in host memory and page later).
    pub drop_smaller_on_grow: bool,
}

struct State<P, U> {
    placement: P,
    upstream: U,
    tracker: Tracker,
    /// Segments the upstream refused to release; retried at every purge and at the drop.
    pending: Vec<Segment>,
}

/// What the slow paths need besides the state: who the pool is and what it talks to.
struct Ctx {
    id: PoolId,
    kind: PoolKind,
    driver: Arc<dyn Driver>,
    options: CoreOptions,
    /// `reserved_bytes`, readable without the lock.
    reserved: AtomicUsize,
}

/// A pool: a placement over an upstream. See the module docs.
pub struct CorePool<P: Placement, U: Upstream> {
    ctx: Ctx,
    alignment: usize,
    // On cache lines of its own; taken out once, in `drop`.
    state: Padded<ManuallyDrop<Mutex<State<P, U>>>>,
    inbox: Arc<Inbox>,
}

/// A value on cache lines of its own: the lock and counters every allocation writes must not
/// share a line with another pool's (threads on their own pools would slow each other down).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The state of a pool dropped while blocks were live, kept until they are dropped.
struct Retired<P, U> {
    ctx: Ctx,
    state: Mutex<State<P, U>>,
}

impl<P: Placement, U: Upstream> std::fmt::Debug for CorePool<P, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CorePool")
            .field("id", &self.ctx.id)
            .field("kind", &self.ctx.kind)
            .field("reserved", &self.ctx.reserved.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<P: Placement, U: Upstream> CorePool<P, U> {
    /// A pool of `kind` placing blocks with `placement` in memory from `upstream`.
    pub fn from_parts(kind: PoolKind, placement: P, upstream: U, options: CoreOptions) -> Self {
        // Releasing a block the moment it is freed is safe only if the release waits for the
        // device: a kernel queued on the block may still be running.
        const { assert!(!P::RELEASES_ON_FREE || U::RELEASE_WAITS) };
        let id = PoolId::fresh();
        Self {
            ctx: Ctx {
                id,
                kind,
                driver: upstream.driver().clone(),
                options,
                reserved: AtomicUsize::new(0),
            },
            alignment: placement.alignment(),
            state: Padded(ManuallyDrop::new(Mutex::new(State {
                placement,
                upstream,
                tracker: Tracker::default(),
                pending: Vec::new(),
            }))),
            inbox: owners::register(id),
        }
    }

    /// Runs `f` on the placement and the upstream, under the pool's lock.
    pub fn inspect<R>(&self, f: impl FnOnce(&P, &U) -> R) -> R {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        f(&g.placement, &g.upstream)
    }

    /// Takes back the blocks that were dropped instead of freed.
    fn take_dropped(&self, g: &mut State<P, U>) {
        let dropped = self.inbox.take();
        if !dropped.is_empty() {
            let freed_at = self.ctx.driver.epoch().current();
            for p in dropped {
                self.ctx.give_back(g, p, freed_at);
            }
        }
    }
}

impl Ctx {
    #[inline]
    fn block(&self, fit: Fit, size: usize) -> Block {
        Block {
            ptr: fit.addr,
            size,
            capacity: fit.capacity,
            pool: self.id,
            managed_fallback: false,
        }
    }

    fn publish<P: Placement, U: Upstream>(&self, g: &State<P, U>) {
        self.reserved
            .store(g.tracker.s.reserved_bytes, Ordering::Relaxed);
    }

    fn sync<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
    ) -> Result<SyncToken, DriverError> {
        let t = synchronize(self.driver.as_ref())?;
        g.tracker.s.calls.syncs += 1;
        Ok(t)
    }

    #[cold]
    fn grow<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        size: usize,
    ) -> Result<Block, PoolError> {
        if self.options.drop_smaller_on_grow
            && !g.placement.idle(&Purge::SmallerThan(size)).is_empty()
        {
            let token = self.sync(g)?;
            let r = self.release(g, &token, &Purge::SmallerThan(size))?;
            tracing::debug!(pool = %self.kind, bytes = r.bytes, buffers = r.buffers, "released idle smaller buffers before growing");
        }
        let want = g.placement.grow_request(size);
        let mut result = g.upstream.acquire(want, &mut g.tracker.s.calls);
        if matches!(&result, Err(e) if e.is_oom())
            && self.options.flush_and_retry
            && !g.placement.idle(&Purge::All).is_empty()
        {
            let token = self.sync(g)?;
            let r = self.release(g, &token, &Purge::All)?;
            g.tracker.s.retries += 1;
            tracing::warn!(pool = %self.kind, requested = size, flushed = r.bytes, "allocation failed; flushed the cache and retrying once");
            result = g.upstream.acquire(want, &mut g.tracker.s.calls);
        }
        match result {
            Ok(seg) => {
                g.tracker.on_reserve(seg.len);
                self.publish(g);
                let fit = g.placement.take_new(seg, size);
                g.tracker.on_alloc(size, fit.capacity);
                tracing::trace!(pool = %self.kind, requested = size, bytes = seg.len, reserved = g.tracker.s.reserved_bytes, "grew");
                Ok(self.block(fit, size))
            }
            Err(e) if e.is_oom() => {
                g.tracker.s.ooms += 1;
                let report = self.oom_report(g, size, e.to_string());
                // The 1st, 2nd, 4th, 8th, ... of a pool: a replay or a caller retrying in a
                // loop does not flood the log; every one is in the stats and the error.
                if g.tracker.s.ooms.is_power_of_two() {
                    tracing::warn!(pool = %self.kind, ooms_so_far = g.tracker.s.ooms, "{report}");
                } else {
                    tracing::debug!(pool = %self.kind, ooms_so_far = g.tracker.s.ooms, "{report}");
                }
                Err(PoolError::OutOfMemory(Box::new(report)))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn oom_report<P: Placement, U: Upstream>(
        &self,
        g: &State<P, U>,
        requested: usize,
        cause: String,
    ) -> OomReport {
        oom::report(
            self.driver.as_ref(),
            self.kind,
            requested,
            &g.tracker.snapshot(),
            g.placement.stranded(requested),
            cause,
        )
    }

    /// Takes a block back; a segment the placement does not keep is released at once.
    #[inline]
    fn give_back<P: Placement, U: Upstream>(&self, g: &mut State<P, U>, p: Parts, freed_at: u64) {
        g.tracker.on_free(p.size, p.capacity);
        g.upstream.note_free();
        let fit = Fit {
            addr: p.ptr,
            capacity: p.capacity,
        };
        if let Some(seg) = g.placement.give_back(fit, freed_at) {
            match g.upstream.release(seg, &mut g.tracker.s.calls) {
                Ok(()) => g.tracker.on_release(seg.len, false),
                Err(e) => {
                    tracing::error!(pool = %self.kind, error = %e, "the driver refused a free; kept for the next purge");
                    g.pending.push(seg);
                }
            }
            self.publish(g);
        }
    }

    /// Releases what `what` names and `token` covers, after retrying refused releases. Stops
    /// at the first refusal (the segments of a VMM range must go from the top down); what was
    /// released until then is counted.
    fn release<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        token: &SyncToken,
        what: &Purge,
    ) -> Result<Released, PoolError> {
        let mut out = Released::default();
        let mut first_err = None;
        for seg in std::mem::take(&mut g.pending) {
            match g.upstream.release(seg, &mut g.tracker.s.calls) {
                Ok(()) => {
                    g.tracker.on_release(seg.len, true);
                    out.bytes += seg.len;
                    out.buffers += 1;
                }
                Err(e) => {
                    g.pending.push(seg);
                    first_err.get_or_insert(e);
                }
            }
        }
        for idle in g.placement.idle(what) {
            if !token.covers(idle.freed_at) {
                out.deferred_bytes += idle.seg.len;
                continue;
            }
            if let Err(e) = g.upstream.release(idle.seg, &mut g.tracker.s.calls) {
                first_err.get_or_insert(e);
                break;
            }
            g.placement.remove(&idle.seg);
            g.tracker.on_release(idle.seg.len, true);
            out.bytes += idle.seg.len;
            out.buffers += 1;
        }
        if out.bytes > 0 {
            g.tracker.s.purges += 1;
        }
        self.publish(g);
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// Releases everything idle after a synchronize; once no block is live, everything.
    /// Returns whether the core now holds nothing.
    fn release_all<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) -> bool {
        let token = match self.sync(g) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(pool = %self.kind, error = %e, "synchronize failed; idle memory is kept");
                return false;
            }
        };
        if let Err(e) = self.release(g, &token, &Purge::All) {
            tracing::error!(pool = %self.kind, error = %e, "could not release every idle segment");
        }
        if g.tracker.s.live_blocks > 0
            || !g.pending.is_empty()
            || !g.placement.segments().is_empty()
        {
            return false;
        }
        if let Err(e) = g.upstream.close(&mut g.tracker.s.calls) {
            tracing::error!(pool = %self.kind, error = %e, "could not release the pool's own resources");
        }
        true
    }
}

impl<P: Placement, U: Upstream> Reclaim for Retired<P, U> {
    fn reclaim(&self, parts: Parts) -> bool {
        let freed_at = self.ctx.driver.epoch().current();
        let mut g = self.state.lock();
        self.ctx.give_back(&mut g, parts, freed_at);
        self.ctx.release_all(&mut g)
    }
}

impl<P: Placement, U: Upstream> Pool for CorePool<P, U> {
    fn id(&self) -> PoolId {
        self.ctx.id
    }

    fn kind(&self) -> PoolKind {
        self.ctx.kind
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.ctx.driver
    }

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let size = checked_request(bytes)?;
        let mut g = self.state.lock();
        if let Some(fit) = g.placement.take(size) {
            g.tracker.on_alloc(size, fit.capacity);
            return Ok(self.ctx.block(fit, size));
        }
        self.take_dropped(&mut g);
        self.ctx.grow(&mut g, size)
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        if block.pool != self.ctx.id {
            let error = PoolError::WrongPool {
                owner: block.pool,
                given_to: self.ctx.id,
            };
            return Err(FreeError { error, block });
        }
        let p = block.into_parts();
        #[cfg(feature = "poison")]
        if let Err(e) = self.ctx.driver.poison(p.ptr, p.capacity) {
            tracing::error!(error = %e, "poisoning a freed block failed");
        }
        let freed_at = self.ctx.driver.epoch().current();
        let mut g = self.state.lock();
        self.ctx.give_back(&mut g, p, freed_at);
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        if !token.is_for(self.ctx.driver.epoch()) {
            return Err(PoolError::WrongDevice {
                device: self.ctx.driver.ordinal(),
            });
        }
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        let r = self.ctx.release(&mut g, token, &what);
        if let Ok(r) = &r {
            if r.bytes > 0 || r.deferred_bytes > 0 {
                tracing::debug!(pool = %self.ctx.kind, released = r.bytes, buffers = r.buffers, deferred = r.deferred_bytes, reserved = g.tracker.s.reserved_bytes, "purged");
            }
        }
        r
    }

    fn releasable(&self, what: &Purge) -> usize {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        let pending: usize = g.pending.iter().map(|s| s.len).sum();
        pending
            + g.placement
                .idle(what)
                .iter()
                .map(|i| i.seg.len)
                .sum::<usize>()
    }

    fn stats(&self) -> PoolStats {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        g.tracker.snapshot()
    }

    #[inline]
    fn reserved_bytes(&self) -> usize {
        self.ctx.reserved.load(Ordering::Relaxed)
    }

    fn reset_peaks(&self) {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        g.tracker.reset_peaks()
    }

    fn alignment(&self) -> usize {
        self.alignment
    }
}

impl<P: Placement, U: Upstream> Drop for CorePool<P, U> {
    fn drop(&mut self) {
        // SAFETY: the state is taken out once, here, and the pool is not used again.
        let mut state = unsafe { ManuallyDrop::take(&mut self.state.0) }.into_inner();
        let ctx = Ctx {
            id: self.ctx.id,
            kind: self.ctx.kind,
            driver: self.ctx.driver.clone(),
            options: self.ctx.options,
            reserved: AtomicUsize::new(self.ctx.reserved.load(Ordering::Relaxed)),
        };
        // Under the inbox's lock, so a block dropped meanwhile is either among `dropped` or
        // finds the retired core.
        self.inbox.retire(move |dropped| {
            let freed_at = ctx.driver.epoch().current();
            for p in dropped {
                ctx.give_back(&mut state, p, freed_at);
            }
            let live = (state.tracker.s.live_blocks, state.tracker.s.live_bytes);
            if ctx.release_all(&mut state) {
                return None;
            }
            if live.0 > 0 {
                tracing::warn!(pool = %ctx.kind, blocks = live.0, bytes = live.1, "pool dropped with live blocks: their memory stays until they are dropped");
            } else {
                tracing::error!(pool = %ctx.kind, "pool dropped but the driver refused to take all of its memory back");
            }
            Some(Box::new(Retired {
                ctx,
                state: Mutex::new(state),
            }) as Box<dyn Reclaim>)
        });
    }
}
