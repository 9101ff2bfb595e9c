//! The slow paths, under the pool's lock: growth (with flush-and-retry and the out-of-memory
//! report), giving a block back, and releasing idle segments to the upstream.

use super::oom;
use super::{Ctx, State};
use crate::block::Block;
use crate::driver::DriverError;
use crate::error::{OomReport, PoolError};
use crate::owners::Parts;
use crate::placement::{Fit, Placement};
use crate::pool::{Purge, Released};
use crate::sync::{synchronize, SyncToken};
use crate::upstream::{Grow, Upstream};
use std::sync::atomic::Ordering;
impl Ctx {
    #[inline]
    pub(super) fn block(&self, fit: Fit, size: usize) -> Block {
        Block {
            ptr: fit.addr,
            size,
            capacity: fit.capacity,
            pool: self.id,
            managed_fallback: false,
        }
    }

    pub(super) fn publish<P: Placement, U: Upstream>(&self, g: &State<P, U>) {
        self.reserved
            .store(g.tracker.s.reserved_bytes, Ordering::Relaxed);
    }

    pub(super) fn sync<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
    ) -> Result<SyncToken, DriverError> {
        let t = synchronize(self.driver.as_ref())?;
        g.tracker.s.calls.syncs += 1;
        Ok(t)
    }

    #[cold]
    pub(super) fn grow<P: Placement, U: Upstream>(
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
        if let Some(len) = g.placement.apart(size) {
            match g.upstream.acquire_apart(len, &mut g.tracker.s.calls) {
                Ok(seg) => {
                    let fit = g.placement.take_apart(seg, size);
                    return self.place_new(g, seg, fit, size);
                }
                Err(e) => {
                    // A growth in the range serves it instead.
                    tracing::debug!(pool = %self.kind, error = %e, "no address space apart; blocks stay in the pool's range");
                    g.placement.apart_refused();
                }
            }
        }
        let want = Grow {
            extend: g.placement.grow_request(size),
            alone: g.placement.grow_alone(size),
        };
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
        self.adopt_leftovers(g);
        let seg = match result {
            Ok(seg) => seg,
            Err(e) => return Err(self.failed(g, size, e)),
        };
        let fit = g.placement.take_new(seg, size);
        self.place_new(g, seg, fit, size)
    }

    /// Hands out `fit`, placed in `seg` that the upstream just handed out, once memory is
    /// behind it.
    fn place_new<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        seg: crate::placement::Segment,
        fit: Fit,
        size: usize,
    ) -> Result<Block, PoolError> {
        if g.upstream.held().is_none() {
            g.tracker.on_reserve(seg.len);
            self.publish(g);
        }
        if !g.upstream.backed(fit.addr, fit.capacity) {
            if let Err(e) = self.back(g, fit) {
                // The block was never handed out: its place is free again. A segment with no
                // memory behind it goes back too (no kernel can use it: nothing to wait for),
                // so a failed growth leaves the pool as it was. (Freed now: pages moved there
                // keep old mappings until a synchronize after now, as in `back_taken`.)
                g.placement.give_back(fit, self.driver.epoch().current());
                self.shed_never_used(g);
                if g.upstream.wholly_vacant(&seg)
                    && g.upstream.release(seg, &mut g.tracker.s.calls).is_ok()
                {
                    g.placement.remove(&seg);
                }
                return Err(self.failed(g, size, e));
            }
        }
        g.tracker.on_alloc(size, fit.capacity);
        tracing::trace!(pool = %self.kind, requested = size, bytes = seg.len, reserved = g.tracker.s.reserved_bytes, "grew");
        Ok(self.block(fit, size))
    }

    /// The error of an allocation that failed in the driver, with the out-of-memory report.
    #[cold]
    pub(super) fn failed<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        size: usize,
        e: DriverError,
    ) -> PoolError {
        match e {
            e if e.is_oom() => {
                g.tracker.s.ooms += 1;
                let report = self.oom_report(g, size, e.to_string());
                // The 1st, 2nd, 4th, 8th, ... of a pool: a replay or a caller retrying in a
                // loop does not flood the log; every one is in the stats and the error.
                if g.tracker.s.ooms.is_power_of_two() {
                    tracing::warn!(pool = %self.kind, ooms_so_far = g.tracker.s.ooms, "{report}");
                } else {
                    tracing::debug!(pool = %self.kind, ooms_so_far = g.tracker.s.ooms, "{report}");
                }
                PoolError::OutOfMemory(Box::new(report))
            }
            e => e.into(),
        }
    }

    /// Counts what the upstream could not give back while undoing a failed call as reserved,
    /// and keeps it with the refused releases, so the next purge releases it.
    #[inline]
    fn adopt_leftovers<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) {
        let leftovers = g.upstream.take_leftovers();
        if leftovers.is_empty() {
            return;
        }
        for seg in leftovers {
            tracing::debug!(pool = %self.kind, bytes = seg.len, "kept memory a failed driver call left behind, to release at the next purge");
            g.tracker.on_reserve(seg.len);
            g.pending.push(seg);
        }
        self.publish(g);
    }

    pub(super) fn oom_report<P: Placement, U: Upstream>(
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
    pub(super) fn give_back<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        p: Parts,
        freed_at: u64,
    ) {
        g.tracker.on_free(p.size, p.capacity);
        g.upstream.note_free();
        let fit = Fit {
            addr: p.ptr,
            capacity: p.capacity,
        };
        let seg = g.placement.give_back(fit, freed_at);
        self.shed_never_used(g);
        if let Some(seg) = seg {
            match g.upstream.release(seg, &mut g.tracker.s.calls) {
                Ok(()) => {
                    self.count_release(g, seg.len, false);
                }
                Err(e) => {
                    tracing::error!(pool = %self.kind, error = %e, "the driver refused a free; kept for the next purge");
                    self.count_release(g, 0, false);
                    g.pending.push(seg);
                }
            }
            self.adopt_leftovers(g);
            self.publish(g);
        }
    }

    /// Releases what `what` names and `token` covers, after retrying refused releases. Stops
    /// at the first refusal (the segments of a VMM range must go from the top down); what was
    /// released until then is counted.
    pub(super) fn release<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        token: &SyncToken,
        what: &Purge,
    ) -> Result<Released, PoolError> {
        let mut out = Released::default();
        let mut first_err = None;
        // Pages in flight are counted before any release: what a release gives back is the
        // fall of the memory held (`count_release`).
        self.collect_ahead(g, true);
        // Memory freed: room to make pages ahead of need again.
        g.ahead_paused = false;
        g.placement.made_ahead(true);
        for seg in std::mem::take(&mut g.pending) {
            match g.upstream.release(seg, &mut g.tracker.s.calls) {
                Ok(()) => {
                    out.bytes += self.count_release(g, seg.len, true);
                    out.buffers += 1;
                }
                Err(e) => {
                    out.bytes += self.count_release(g, 0, true);
                    g.pending.push(seg);
                    first_err.get_or_insert(e);
                }
            }
        }
        if matches!(what, Purge::All) {
            self.shed_kept(g, token, &mut out);
        }
        for idle in g.placement.idle(what) {
            // A segment apart holds only the memory behind it, and goes in any order.
            let apart = g.upstream.apart_held(&idle.seg);
            if !token.covers(idle.freed_at) {
                out.deferred_bytes += apart.unwrap_or(idle.seg.len);
                continue;
            }
            if let Err(e) = g.upstream.release(idle.seg, &mut g.tracker.s.calls) {
                // Pages unmapped before the refusal are gone all the same. Segments of a range
                // go from the top down: one refused stops the rest.
                out.bytes += self.count_release(g, 0, true);
                first_err.get_or_insert(e);
                if apart.is_some() {
                    continue;
                }
                break;
            }
            g.placement.remove(&idle.seg);
            out.bytes += self.count_release(g, idle.seg.len, true);
            out.buffers += 1;
        }
        self.adopt_leftovers(g);
        if out.bytes > 0 {
            g.tracker.s.purges += 1;
        }
        self.publish(g);
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// A purge of everything: the memory behind the free segments the placement keeps (its
    /// free lanes) goes back to the device, their address space stays. (Released with the lanes,
    /// the address space came back at the next request with every lane's first block mapped on
    /// the allocating thread: `placement/lanes/again.rs`.)
    fn shed_kept<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        token: &SyncToken,
        out: &mut Released,
    ) {
        let kept = g.placement.kept_on_purge();
        if kept.is_empty() {
            return;
        }
        let mut spans = Vec::with_capacity(kept.len());
        let mut shed = Vec::with_capacity(kept.len());
        for k in kept {
            if token.covers(k.freed_at) {
                spans.push((k.seg.ptr, k.seg.len));
                shed.push(k.seg);
            } else {
                out.deferred_bytes += g.upstream.apart_held(&k.seg).unwrap_or(0);
            }
        }
        if g.upstream.shed(&spans, &mut g.tracker.s.calls) > 0 {
            out.bytes += self.count_release(g, 0, true);
        }
        for seg in &shed {
            g.placement.kept_given_back(seg);
        }
    }

    /// Gives back at once the memory the placement names as made ahead and never used
    /// ([`Placement::take_never_used`]): after every block given back to the placement.
    #[inline]
    pub(super) fn shed_never_used<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) {
        let never_used = g.placement.take_never_used();
        if !never_used.is_empty() && g.upstream.shed(&never_used, &mut g.tracker.s.calls) > 0 {
            self.settle(g);
        }
    }

    /// Releases everything idle after a synchronize; once no block is live, everything.
    /// Returns whether the core now holds nothing.
    pub(super) fn release_all<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) -> bool {
        let token = match self.sync(g) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(pool = %self.kind, error = %e, "synchronize failed; idle memory is kept");
                return false;
            }
        };
        // Closing: the free lanes go with their address space.
        g.placement.closing();
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
