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

mod ahead;
mod back;
mod oom;
mod retire;
mod sleep;
mod slow;
mod snapshot;

use crate::block::Block;
use crate::driver::Driver;
use crate::error::{FreeError, PoolError};
use crate::kind::PoolKind;
use crate::owners::{self, Inbox, PoolId};
use crate::placement::{Placement, Segment};
use crate::pool::{checked_request, Moved, Pool, Purge, Released};
use crate::stats::{PoolStats, Tracker};
use crate::sync::SyncToken;
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
    /// Some of the memory is asleep (`sleep.rs`): allocations are refused until a wake.
    asleep: bool,
    /// A block ran out of memory: nothing is made ahead of need until a purge (`ahead.rs`).
    ahead_paused: bool,
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
                asleep: false,
                ahead_paused: false,
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

    /// [`Pool::alloc`] of `size` bytes (checked) under the lock, the block handed to `put`:
    /// a cached block goes straight where `put` keeps it, never through a `Result` of its own
    /// (whose copy stalls on the stores just made).
    #[inline(always)]
    fn alloc_locked<R>(
        &self,
        g: &mut State<P, U>,
        size: usize,
        put: impl FnOnce(Block) -> R,
    ) -> Result<R, PoolError> {
        if g.asleep {
            return Err(self.ctx.asleep(g));
        }
        if size > crate::placement::bump::LARGE && g.upstream.recycles() {
            return self.alloc_backed(g, size).map(put);
        }
        if let Some(fit) = g.placement.take(size) {
            if !g.upstream.backed(fit.addr, fit.capacity) {
                return self.ctx.back_taken(g, fit, size).map(put);
            }
            g.tracker.on_alloc(size, fit.capacity);
            return Ok(put(self.ctx.block(fit, size)));
        }
        self.take_dropped(g);
        self.ctx.grow(g, size).map(put)
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
        self.alloc_locked(&mut self.state.lock(), size, |b| b)
    }

    #[inline]
    fn alloc_onto(&self, bytes: usize, out: &mut Vec<Block>) -> Result<(), PoolError> {
        let size = checked_request(bytes)?;
        self.alloc_locked(&mut self.state.lock(), size, |b| out.push(b))
    }

    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        let size = checked_request(bytes)?;
        let mut g = self.state.lock();
        if g.asleep {
            return Err(self.ctx.asleep(&g));
        }
        // A large block's place is chosen by the memory behind it (`alloc_backed`): not
        // something to try and undo.
        if size > crate::placement::bump::LARGE && g.upstream.recycles() {
            return Ok(None);
        }
        let Some(fit) = g.placement.take(size) else {
            return Ok(None);
        };
        if !g.upstream.backed(fit.addr, fit.capacity) {
            // Never handed out: its place is free again. Stamped as freed now, so no purge
            // under an older token takes it for idle (it was free before; that only waits).
            // A placement that would release it instead (none takes unbacked memory today)
            // leaves it to the next purge, as a release the upstream refused.
            if let Some(seg) = g
                .placement
                .give_back(fit, self.ctx.driver.epoch().current())
            {
                g.pending.push(seg);
            }
            return Ok(None);
        }
        g.tracker.on_alloc(size, fit.capacity);
        Ok(Some(self.ctx.block(fit, size)))
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
        if g.asleep {
            // What is cached went at the sleep; the rest has no physical memory to return.
            return Ok(Released::default());
        }
        if what == Purge::All {
            let host = g.upstream.drop_host_buffers();
            if host > 0 {
                tracing::debug!(pool = %self.ctx.kind, bytes = host, "gave back the host buffers kept for offloads");
            }
        }
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
        if g.asleep {
            return 0;
        }
        let pending: usize = g.pending.iter().map(|s| s.len).sum();
        let upstream = &g.upstream;
        // The memory behind the free segments a purge of everything keeps goes back too.
        let kept: usize = match what {
            Purge::All => g
                .placement
                .kept_on_purge()
                .iter()
                .map(|k| upstream.apart_held(&k.seg).unwrap_or(0))
                .sum(),
            _ => 0,
        };
        pending
            + kept
            + g.placement
                .idle_bytes(what, &mut |seg| upstream.apart_held(seg).unwrap_or(seg.len))
    }

    fn stats(&self) -> PoolStats {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        // The reserve counts every page the device holds for the pool: a page in flight is
        // waited for (a stats call is no hot path).
        self.ctx.collect_ahead(&mut g, true);
        let mut s = g.tracker.snapshot();
        s.asleep_bytes = g.upstream.asleep_bytes();
        s
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

    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        self.ctx.sleep(&mut g, token, offload)
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        let mut g = self.state.lock();
        self.ctx.wake(&mut g)
    }

    fn snapshot(&self) -> Result<crate::PoolSnapshot, PoolError> {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        self.ctx.snapshot(&g)
    }

    fn restore(&self, snapshot: &crate::PoolSnapshot) -> Result<(), PoolError> {
        let mut g = self.state.lock();
        self.take_dropped(&mut g);
        self.ctx.restore(&mut g, snapshot)
    }
}
