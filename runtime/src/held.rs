//! An engine profile's op, its requests taken from the pool and returned as the engine does
//! (`crate::profiled` says which ops a ubatch runs).

use crate::error::RuntimeError;
use crate::fast_forward::FastForward;
use cupool_pool::adaptors::label;
use cupool_pool::{Block, Pool};
use cupool_profiles::{OpCall, Request};

/// Takes `c`'s requests from `held`'s pool, `c.repeat` times. When fast-forwarding (dry runs),
/// a run that made no driver call left the pool as it found it, and the runs after it would
/// repeat it exactly: they are skipped.
pub(crate) fn take_call<P: Pool + ?Sized>(
    held: &mut Held<P>,
    c: &OpCall,
    ff: &FastForward,
) -> Result<(), RuntimeError> {
    for _ in 0..c.repeat {
        let mark = ff.mark();
        let base = held.blocks.len();
        if let Err(e) = take_once(held, c, ff) {
            // As the buffers of an op whose request failed drop: in the order taken.
            held.give_back_from(base, false);
            return Err(e);
        }
        held.give_back_from(base, true);
        if ff.repeats(mark) {
            break;
        }
    }
    Ok(())
}

/// One run of `c`: its held buffers stay on `held` (above where they started) for the caller
/// to return, a nested step's are returned by that step.
fn take_once<P: Pool + ?Sized>(
    held: &mut Held<P>,
    c: &OpCall,
    ff: &FastForward,
) -> Result<(), RuntimeError> {
    let (pool, labels) = (held.pool, held.labels);
    let blocks = &mut held.blocks;
    let take = |r: &Request, blocks: &mut Vec<Block>| match labels {
        true => label::with(r.name, || pool.alloc_onto(r.bytes, blocks)),
        false => pool.alloc_onto(r.bytes, blocks),
    };
    for r in &c.held {
        take(r, blocks)?;
    }
    for r in &c.inner {
        take(r, blocks)?;
        if let Some(b) = blocks.pop() {
            give_back(pool, b);
        }
    }
    for n in &c.nested {
        take_call(held, n, ff)?;
    }
    Ok(())
}

/// The blocks the ops of a ubatch hold, innermost last, taken from the pool as they are (a dry
/// run makes millions of requests: no buffer object, no reference count, no list of its own
/// each). Whatever is left when it drops (a panic) goes back to the pool. The pool is the
/// engine's outermost adaptor as its own type where the engine has one (its calls then reach
/// the adaptor directly, not through `dyn Pool`).
pub(crate) struct Held<'a, P: Pool + ?Sized> {
    pool: &'a P,
    blocks: Vec<Block>,
    /// Whether each request is made under its name ([`label`]): only a recorder reads it.
    labels: bool,
}

impl<'a, P: Pool + ?Sized> Held<'a, P> {
    /// None yet, from `pool`; `labels`: whether a recorder in `pool` reads the requests' names.
    pub fn new(pool: &'a P, labels: bool) -> Self {
        Self {
            pool,
            blocks: Vec::new(),
            labels,
        }
    }

    /// Returns the blocks from `base` on: the last first (`reverse`, as an op ends), or in the
    /// order taken.
    fn give_back_from(&mut self, base: usize, reverse: bool) {
        if reverse {
            while self.blocks.len() > base {
                if let Some(b) = self.blocks.pop() {
                    give_back(self.pool, b);
                }
            }
        } else {
            for b in self.blocks.drain(base..) {
                give_back(self.pool, b);
            }
        }
    }
}

impl<P: Pool + ?Sized> Drop for Held<'_, P> {
    fn drop(&mut self) {
        self.give_back_from(0, false);
    }
}

/// Returns `b` to `pool`, as a buffer's drop does: a refusal is logged (the block then goes
/// back to its pool core when dropped).
fn give_back<P: Pool + ?Sized>(pool: &P, b: Block) {
    if let Err(e) = pool.free(b) {
        tracing::error!(error = %e, "returning a buffer to its pool failed");
    }
}
