//! A large block in a recycling pool: placed where it needs the least new memory, and the
//! memory the next ones are expected to need asked for ahead (`upstream/vmm/ahead.rs`).

use super::{CorePool, Ctx, State};
use crate::block::Block;
use crate::error::PoolError;
use crate::placement::Placement;
use crate::upstream::Upstream;

impl<P: Placement, U: Upstream> CorePool<P, U> {
    /// [`crate::pool::Pool::alloc`] of a block above [`crate::placement::bump::LARGE`] in a
    /// pool whose upstream recycles.
    pub(super) fn alloc_backed(
        &self,
        g: &mut State<P, U>,
        size: usize,
    ) -> Result<Block, PoolError> {
        self.ctx.collect_ahead(g, false);
        let fit = {
            let State {
                placement,
                upstream,
                ..
            } = &mut *g;
            placement.take_backed(size, &|a, l| upstream.unbacked(a, l))
        };
        // Named by this landing alone: given back only once the block has its memory (a
        // failed backing gives the fit back, and a range kept for later could by then lie
        // under another block).
        let excess = g.placement.take_excess();
        let r = match fit {
            // A range still in flight counts as vacant here: backing it waits for it.
            Some(fit) if !g.upstream.backed(fit.addr, fit.capacity) => {
                self.ctx.back_taken(g, fit, size)
            }
            Some(fit) => {
                g.tracker.on_alloc(size, fit.capacity);
                Ok(self.ctx.block(fit, size))
            }
            None => {
                self.take_dropped(g);
                self.ctx.grow(g, size)
            }
        };
        if r.is_ok() {
            if let Some(excess) = excess {
                if g.upstream.shed(&[excess], &mut g.tracker.s.calls) > 0 {
                    self.ctx.settle(g);
                }
            }
            self.ctx.ask_ahead(g);
        }
        r
    }
}

impl Ctx {
    /// Takes in the memory made ahead that is ready (all of it, waiting, with `wait`), and
    /// counts it.
    #[inline]
    pub(in crate::core) fn collect_ahead<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        wait: bool,
    ) {
        if g.upstream.collect_ahead(wait, &mut g.tracker.s.calls) {
            self.settle(g);
        }
    }

    /// Asks the upstream for the memory the placement expects the next blocks to need.
    fn ask_ahead<P: Placement, U: Upstream>(&self, g: &mut State<P, U>) {
        if g.ahead_paused {
            return;
        }
        let State {
            placement,
            upstream,
            tracker,
            ..
        } = &mut *g;
        placement.ahead(&mut |a, l| upstream.back_ahead(a, l, &mut tracker.s.calls));
        // Made inline, it is held now.
        self.settle(g);
    }
}
