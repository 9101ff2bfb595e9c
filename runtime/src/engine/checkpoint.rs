//! Checkpoints along one dry run, to answer dry runs of shorter prompts in less room from.
//!
//! Until an allocation fails, a pool makes the same requests and driver calls in any room as
//! on an endless card, except where it reads the free memory: an `auto` boundary decides from
//! it, and decides as on the endless card in any room from what the device held at that read
//! plus the headroom's least free memory ([`Engine::room_read`]). So a dry run on an endless
//! card passes through the states every run in more room than its device peak and its
//! `room_read` so far passes through; and every prompt makes the same ubatches as a longer one
//! up to its last two ([`Engine::alike`]). A checkpoint is the engine's, pool's and device's
//! state there ([`super::branch`]'s snapshots): a dry run of a shorter prompt, in another room
//! and context, goes on from the last checkpoint both allow, and reports what a dry run from
//! the start reports (`planner/scout_tests.rs`).

use super::branch::At;
use super::Engine;
use crate::error::RuntimeError;
use crate::memory::KvLayout;
use crate::report::RunReport;
use cupool_kernels::fa;
use cupool_pool::driver::sim::SimDevice;

/// A point of a dry run (see the module docs).
pub(crate) struct Checkpoint {
    at: At,
    /// Ubatches of the run done, boundaries included.
    pub done: usize,
    /// The least room a run takes the same way to here: the device's peak so far, and
    /// [`Engine::room_read`].
    pub needs: usize,
    /// The context of the run.
    n_ctx: usize,
    /// Tokens done.
    pos: usize,
}

impl Engine {
    /// Dry runs only, a fresh engine over `sim` (an endless card): the prefill of `tokens` with
    /// a checkpoint after every `every` ubatches (at least one) but the last, until its
    /// [`Engine::watch`] ends it or `go_on(tokens done, least room)` says no more checkpoints
    /// are wanted; whether it ran every ubatch.
    pub(crate) fn scout(
        &mut self,
        tokens: &[i32],
        sim: &SimDevice,
        every: usize,
        go_on: &dyn Fn(usize, usize) -> bool,
    ) -> Result<(Vec<Checkpoint>, bool), RuntimeError> {
        self.fresh_dry_run("a run is scouted")?;
        self.start_decode(tokens.len())?;
        self.ff.start(self.pool.as_ref());
        let list = self.split(0, tokens);
        let (mut done, mut points, mut rows) = (0, Vec::new(), Vec::new());
        while done < list.len() {
            let next = (done + every.max(1)).min(list.len());
            // Out of memory (of 256 TiB) or watched: no state to go on from.
            if self.run_ubatches(&list, done, next, &mut rows)?.is_some() || self.watched {
                return Ok((points, false));
            }
            done = next;
            let needs = sim.device_peak().max(self.room_read);
            if done == list.len() {
                break;
            }
            if !go_on(self.pos, needs) {
                return Ok((points, false));
            }
            points.push(Checkpoint {
                at: self.at(sim)?,
                done,
                needs,
                n_ctx: self.cfg.n_ctx,
                pos: self.pos,
            });
        }
        Ok((points, true))
    }

    /// Whether `from` serves prompts of `lens` tokens (at least one each) in a context of
    /// `n_ctx` on a card of `capacity` bytes, `alike` being [`Engine::alike`]`(lens)`: they
    /// run its ubatches alike, none of whose KV length the context caps (a context that is
    /// not a multiple of the padding caps those in its last 256 positions), in enough room.
    pub(crate) fn serves(
        from: &Checkpoint,
        (lens, alike): (&[usize], usize),
        n_ctx: usize,
        capacity: usize,
    ) -> bool {
        from.needs <= capacity
            && n_ctx <= from.n_ctx
            && !lens.contains(&0)
            && lens.iter().all(|&l| l <= n_ctx)
            && from.done <= alike
            && fa::n_kv(from.pos, n_ctx) == fa::n_kv(from.pos, usize::MAX)
    }

    /// Dry runs only, on the engine [`Engine::scout`] made `from` with, over the same `sim`:
    /// what [`Engine::decode_prompts`] of a fresh engine of this configuration with a context of
    /// `n_ctx` tokens, on a card of `capacity` bytes, reports for `lens` (from `tokens`). The
    /// caller picks a checkpoint that allows them: `from.done` at most [`Engine::alike`]`(lens)`,
    /// `from.needs` at most `capacity`, `n_ctx` at most the scouted context.
    pub(crate) fn prompts_after(
        &mut self,
        from: &Checkpoint,
        (tokens, lens): (&[i32], &[usize]),
        sim: &SimDevice,
        (n_ctx, capacity): (usize, usize),
    ) -> Result<Vec<RunReport>, RuntimeError> {
        let longest = lens.iter().copied().max().unwrap_or(0);
        let alike = self.alike(lens);
        if !Self::serves(from, (lens, alike), n_ctx, capacity) || longest > tokens.len() {
            return Err(RuntimeError::Invalid(format!(
                "a checkpoint after {} ubatches ({} tokens) needing {} bytes answers prompts of 1 to {} tokens that share those ubatches, in a context of at most {} that caps none of their KV lengths, and {} bytes or more; not {lens:?} in {n_ctx} and {capacity}",
                from.done, from.pos, from.needs, n_ctx.min(tokens.len()), from.n_ctx, from.needs
            )));
        }
        self.back_to(&from.at, sim)?;
        sim.set_capacity(capacity)
            .map_err(cupool_pool::PoolError::from)?;
        // Only the context's cap of each ubatch's KV length reads it, past the shared ubatches.
        self.cfg.n_ctx = n_ctx;
        self.bufs.kvl = KvLayout::new(&self.cfg.model, self.cfg.kv_type, n_ctx);
        self.prefill_tokens = longest;
        self.decode_start = 0;
        self.prompts_from(tokens, lens, sim, from.done)
    }
}
