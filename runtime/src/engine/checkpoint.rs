//! Checkpoints along one dry run, to answer dry runs of shorter prompts in less room from.
//!
//! A pool makes the same requests and driver calls in any room as in another except where the
//! room decides: an allocation fails in one and not in the other (the simulated device notes
//! the least room in which each refused one would have succeeded), or an `auto` boundary reads
//! the free memory (it decides alike in any room from what the device held at that read plus
//! the headroom's least free memory, and alike in any below it: [`Engine::room_read`]). So a
//! dry run passes through the states every run in a room between its device peak and those
//! bounds so far passes through (on an endless card: every room above them); and every prompt
//! makes the same ubatches as a longer one up to its last two ([`Engine::alike`]). A checkpoint
//! is the engine's, pool's and device's state there (an `At`, which [`super::branch`] also
//! goes back to): a dry run of a shorter prompt, in another room and context, goes on from the
//! last checkpoint both allow, and reports what a dry run from the start reports
//! (`planner/scout_tests.rs`).

use super::Engine;
use crate::error::RuntimeError;
use crate::fast_forward::FastForward;
use crate::memory::KvLayout;
use crate::report::RunReport;
use cupool_kernels::fa;
use cupool_pool::driver::sim::{SimDevice, SimSnapshot};
use cupool_pool::{OomReport, PoolSnapshot};

/// The engine's side of a snapshot: where the decode stands.
pub(super) struct At {
    pool: PoolSnapshot,
    device: SimSnapshot,
    pos: usize,
    ubatch_index: usize,
    ff: FastForward,
    room: (usize, usize),
}

/// A point of a dry run (see the module docs).
pub(crate) struct Checkpoint {
    at: At,
    /// Ubatches of the run done, boundaries included.
    pub done: usize,
    /// The rooms a run takes the same way to here, from the first up to the second: the
    /// device's peak so far and [`Engine::room_read`], [`Engine::room_below`] and the least
    /// room in which a refused allocation would have succeeded.
    pub rooms: (usize, usize),
    /// The context of the run.
    n_ctx: usize,
    /// Tokens done.
    pos: usize,
    /// The run's ubatch.
    n_ubatch: usize,
}

/// Where the checkpoints of a run go, and every how many ubatches one is taken.
pub(crate) type Keep<'a> = Option<(&'a mut Vec<Checkpoint>, usize)>;

impl Engine {
    /// Dry runs only, a fresh engine over `sim` (an endless card): the prefill of `tokens` with
    /// a checkpoint at its start and after every `every` ubatches (at least one) but the
    /// last, until its [`Engine::watch`] ends it or `go_on(tokens done, least room)` says no
    /// more checkpoints are wanted; whether it ran every ubatch.
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
        let (mut done, mut points, mut rows) = (0, vec![self.checkpoint(sim, 0)?], Vec::new());
        while done < list.len() {
            let next = (done + every.max(1)).min(list.len());
            // Out of memory (of 256 TiB) or watched: no state to go on from.
            if self.run_ubatches(&list, done, next, &mut rows)?.is_some() || self.watched {
                return Ok((points, false));
            }
            done = next;
            if done == list.len() {
                break;
            }
            let point = self.checkpoint(sim, done)?;
            if !go_on(self.pos, point.rooms.0) {
                return Ok((points, false));
            }
            points.push(point);
        }
        Ok((points, true))
    }

    /// Where the run stands after `done` of its ubatches.
    pub(super) fn checkpoint(
        &self,
        sim: &SimDevice,
        done: usize,
    ) -> Result<Checkpoint, RuntimeError> {
        Ok(Checkpoint {
            at: self.at(sim)?,
            done,
            rooms: (
                sim.device_peak().max(self.room_read),
                self.room_below
                    .min(sim.failed_below().unwrap_or(usize::MAX)),
            ),
            n_ctx: self.cfg.n_ctx,
            pos: self.pos,
            n_ubatch: self.cfg.n_ubatch,
        })
    }

    /// Whether `from` serves prompts of `lens` tokens (at least one each) in a context of
    /// `n_ctx` on a card of `capacity` bytes, `alike` being [`Engine::alike`]`(lens)`: they
    /// run its ubatches alike, none of whose KV length its run's context or this one caps (a
    /// context that is not a multiple of the padding caps those in its last 256 positions),
    /// in a room its run took the same way.
    pub(crate) fn serves(
        from: &Checkpoint,
        (lens, alike): (&[usize], usize),
        n_ctx: usize,
        capacity: usize,
    ) -> bool {
        // The boundary before the checkpoint read the next ubatch's KV length too: up to a
        // ubatch past it.
        let read_to = from.pos + from.n_ubatch;
        let uncapped = |c: usize| fa::n_kv(read_to, c) == fa::n_kv(read_to, usize::MAX);
        (from.rooms.0..from.rooms.1).contains(&capacity)
            && !lens.is_empty()
            && !lens.contains(&0)
            && lens.iter().all(|&l| l <= n_ctx)
            && from.done <= alike
            && uncapped(n_ctx)
            && uncapped(from.n_ctx)
    }

    /// Dry runs only, on the engine whose run took `from`, over the same `sim`: what
    /// [`Engine::decode_prompts`] of a fresh engine of this configuration with a context of
    /// `n_ctx` tokens, on a card of `capacity` bytes, reports for `lens` (from `tokens`), where
    /// `from` serves them ([`Engine::serves`]); the run's checkpoints into `keep`.
    pub(crate) fn prompts_after(
        &mut self,
        from: &Checkpoint,
        (tokens, lens): (&[i32], &[usize]),
        sim: &SimDevice,
        (n_ctx, capacity): (usize, usize),
        keep: Keep,
    ) -> Result<Vec<RunReport>, RuntimeError> {
        let longest = lens.iter().copied().max().unwrap_or(0);
        let alike = self.alike(lens);
        if !Self::serves(from, (lens, alike), n_ctx, capacity) || longest > tokens.len() {
            return Err(RuntimeError::Invalid(format!(
                "a checkpoint after {} ubatches ({} tokens) of a run in a context of {} answers prompts of 1 to {} tokens that share those ubatches, in a context that caps none of their KV lengths, and in {} to {} bytes; not {lens:?} in {n_ctx} and {capacity}",
                from.done, from.pos, from.n_ctx, n_ctx.min(tokens.len()), from.rooms.0, from.rooms.1
            )));
        }
        self.back_to(&from.at, sim)?;
        sim.set_capacity(capacity.min(cupool_pool::driver::sim::MAX_CAPACITY))
            .map_err(cupool_pool::PoolError::from)?;
        // Only the context's cap of each ubatch's KV length reads it, past the shared ubatches.
        self.cfg.n_ctx = n_ctx;
        self.bufs.kvl = KvLayout::new(&self.cfg.model, self.cfg.kv_type, n_ctx);
        self.prefill_tokens = longest;
        self.decode_start = 0;
        self.prompts_from(tokens, lens, sim, from.done, keep)
    }

    /// Runs `ubatches[from..to]` as [`Engine::run_ubatches`] does, with a checkpoint after
    /// every so many into `keep`.
    pub(super) fn run_kept(
        &mut self,
        ubatches: &[(usize, &[i32])],
        (from, to): (usize, usize),
        sim: &SimDevice,
        rows: &mut Vec<crate::report::UbatchRow>,
        keep: Keep,
    ) -> Result<Option<(usize, Box<OomReport>)>, RuntimeError> {
        let Some((points, every)) = keep else {
            return self.run_ubatches(ubatches, from, to, rows);
        };
        let mut done = from;
        while done < to {
            let next = (done + every.max(1)).min(to);
            if let Some(oom) = self.run_ubatches(ubatches, done, next, rows)? {
                return Ok(Some(oom));
            }
            done = next;
            points.push(self.checkpoint(sim, done)?);
        }
        Ok(None)
    }

    /// Where the decode stands, with the pool's and the device's state.
    pub(super) fn at(&self, sim: &SimDevice) -> Result<At, RuntimeError> {
        let device = sim.snapshot().ok_or_else(|| {
            RuntimeError::Invalid("a device backed by host memory keeps no snapshot".into())
        })?;
        Ok(At {
            pool: self.pool.snapshot()?,
            device,
            pos: self.pos,
            ubatch_index: self.ubatch_index,
            ff: self.ff.clone(),
            room: (self.room_read, self.room_below),
        })
    }

    /// Back to where [`Engine::at`] stood.
    pub(super) fn back_to(&mut self, at: &At, sim: &SimDevice) -> Result<(), RuntimeError> {
        // The pool first: every refusal is its own, and the device is left as it was then.
        self.pool.restore(&at.pool)?;
        if !sim.restore(&at.device) {
            return Err(RuntimeError::Invalid(
                "the device's snapshot could not be restored: it was taken of a device backed by host memory, and only a simulated device with fake addresses keeps one".into(),
            ));
        }
        self.pos = at.pos;
        self.ubatch_index = at.ubatch_index;
        self.ff = at.ff.clone();
        (self.room_read, self.room_below) = at.room;
        self.failed = false;
        Ok(())
    }
}
