//! The drop contract: a pool dropped with live blocks moves its state into a retired core that
//! the owners table keeps until those blocks are dropped; then nothing of the pool remains.

use super::{CorePool, Ctx, State};
use crate::owners::{Parts, Reclaim};
use crate::placement::Placement;
use crate::upstream::Upstream;
use parking_lot::Mutex;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The state of a pool dropped while blocks were live, kept until they are dropped.
struct Retired<P, U> {
    ctx: Ctx,
    state: Mutex<State<P, U>>,
}

impl<P: Placement, U: Upstream> Reclaim for Retired<P, U> {
    fn reclaim(&self, parts: Parts) -> bool {
        let freed_at = self.ctx.driver.epoch().current();
        let mut g = self.state.lock();
        self.ctx.give_back(&mut g, parts, freed_at);
        self.ctx.release_all(&mut g)
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
