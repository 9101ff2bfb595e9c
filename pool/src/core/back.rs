//! Memory behind a placed block, where the upstream has none yet (a VMM segment's vacant
//! range), and the reserved count of an upstream that holds less than its segments.
//!
//! Recycling moves free pages out of holes to where the block lands. A kernel queued before a
//! block's free may still read it, and unmapping its pages under that kernel would fault, so
//! a moved page stays mapped at its old address too until a synchronize that began after the
//! move has finished (`upstream/vmm/stale.rs`): one the pool asks for, or any other on the
//! device since. The pool asks for one only where a block lands on such an old mapping the
//! device may still use, or where busy ones cover more than a quarter of the memory it holds.
//! (A large block lands where it needs the least new memory in the first place:
//! [`crate::placement::Placement::take_backed`].)

use super::{Ctx, State};
use crate::block::Block;
use crate::driver::DriverError;
use crate::error::PoolError;
use crate::placement::{Fit, Placement};
use crate::upstream::Upstream;

impl Ctx {
    /// A block the placement found room for, on a range with no memory behind it yet.
    #[cold]
    pub(super) fn back_taken<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        fit: Fit,
        size: usize,
    ) -> Result<Block, PoolError> {
        if let Err(e) = self.back(g, fit) {
            // Never handed out: its place is free again, from now on. Pages moved there before
            // the failure keep their old mappings, which the device may use until a
            // synchronize after now: a purge under an older token must not release them.
            g.placement.give_back(fit, self.driver.epoch().current());
            self.shed_never_used(g);
            return Err(self.failed(g, size, e));
        }
        g.tracker.on_alloc(size, fit.capacity);
        Ok(self.block(fit, size))
    }

    /// Puts memory behind `fit`, recycling free pages when that is safe (see the module docs).
    pub(super) fn back<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        fit: Fit,
    ) -> Result<(), DriverError> {
        // Pages in flight are taken in first: every choice below sees the pool as it would be
        // with them made at once (`upstream/vmm/ahead.rs`).
        self.collect_ahead(g, true);
        let mut donors = Vec::new();
        let mut idle = false;
        // Recycling costs driver calls on this thread (23–34 µs per page moved on an H100,
        // `benches/vmm_calls.rs`), creating costs memory: the upstream weighs them
        // (`VmmConfig::recycle_free`). A move does not wait for the device
        // (`upstream/vmm/stale.rs`).
        let snap = g.tracker.snapshot();
        // Memory made ahead of need is spoken for: it is no reason to move pages.
        let mut early = 0;
        g.placement.ahead(&mut |_, l| early += l);
        if g.upstream
            .worth_recycling(snap.cached_bytes.saturating_sub(early), snap.reserved_bytes)
        {
            let (spans, freed_at) = g.placement.free_spans();
            if g.upstream.movable(&spans) {
                idle = self.driver.epoch().idle_since(freed_at);
                donors = spans;
            }
        }
        if g.upstream.must_wait(fit.addr, fit.capacity) {
            match self.sync(g) {
                // Every free so far is covered now.
                Ok(_) => idle = true,
                Err(e) => {
                    tracing::warn!(pool = %self.kind, error = %e, "synchronize failed; the block's range still has old mappings of moved pages");
                    return Err(e);
                }
            }
        }
        let mut r = g.upstream.back(
            fit.addr,
            fit.capacity,
            &donors,
            idle,
            &mut g.tracker.s.calls,
        );
        if matches!(&r, Err(e) if e.is_oom()) && g.upstream.recycles() {
            r = self.shed_and_retry(g, fit).unwrap_or(r);
        }
        self.settle(g);
        r
    }

    /// Out of memory while backing `fit` in a recycling pool: pages too long to move into its
    /// gaps, or straddling its edge into free space, may hold what it needs. (Without
    /// recycling the pool keeps ggml's behaviour, which the engine profiles predict.) After a synchronize, every page wholly
    /// inside the free ranges and the block's own range goes back to the device, and the block
    /// is backed once more; `None` if nothing could be released.
    #[cold]
    fn shed_and_retry<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        fit: Fit,
    ) -> Option<Result<(), DriverError>> {
        // Memory made ahead of need, and free lanes' memory kept for a request's cache, goes
        // first, alone: the pool then holds about what it would with nothing made ahead or kept
        // (a wider shed empties the other free lanes too, whose next copies then map whole).
        // Nothing more is made ahead until a purge.
        let mut early = Vec::new();
        g.placement.surplus(&mut |a, l| early.push((a, l)));
        g.ahead_paused = true;
        g.placement.made_ahead(false);
        let (mut spans, freed_at) = g.placement.free_spans();
        if !self.driver.epoch().idle_since(freed_at) {
            if let Err(e) = self.sync(g) {
                tracing::warn!(pool = %self.kind, error = %e, "synchronize failed; cannot release free pages for a block that does not fit");
                return None;
            }
        }
        if !early.is_empty() && g.upstream.shed(&early, &mut g.tracker.s.calls) > 0 {
            let r = g
                .upstream
                .back(fit.addr, fit.capacity, &[], true, &mut g.tracker.s.calls);
            if !matches!(&r, Err(e) if e.is_oom()) {
                return Some(r);
            }
        }
        spans.push((fit.addr, fit.capacity));
        let gone = g.upstream.shed(&spans, &mut g.tracker.s.calls);
        if gone == 0 {
            return None;
        }
        tracing::debug!(pool = %self.kind, released = gone, "out of memory backing a block; released free pages and retrying");
        Some(
            g.upstream
                .back(fit.addr, fit.capacity, &[], true, &mut g.tracker.s.calls),
        )
    }

    /// Brings the reserved count to what an upstream that reports it holds.
    pub(super) fn settle<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) {
        if let Some(held) = g.upstream.held() {
            let reserved = g.tracker.s.reserved_bytes;
            if held > reserved {
                g.tracker.on_reserve(held - reserved);
            } else if held < reserved {
                g.tracker.on_release(reserved - held, false);
            }
            self.publish(g);
        }
    }

    /// Counts a release of a segment of `len` bytes (0: a refused one, which may still have
    /// given back part of its memory); returns the bytes the device got back.
    pub(super) fn count_release<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        len: usize,
        purged: bool,
    ) -> usize {
        let gone = match g.upstream.held() {
            None => len,
            Some(held) => g.tracker.s.reserved_bytes.saturating_sub(held),
        };
        g.tracker.on_release(gone, purged);
        self.publish(g);
        gone
    }
}
