//! One dry run of the longest context a search may probe, on a card it never fills, with
//! checkpoints along it (`engine/checkpoint.rs`): each probe of the search then runs from the
//! last checkpoint its room and prompts allow, not from the start. The answers are the dry
//! runs' from the start (`scout_tests.rs`); a search near two million positions in ubatches of
//! 64 probes a score of contexts, each a run of 30,000 ubatches without it.
//!
//! Where the pool keeps no snapshots (`dry::keeps_snapshots`), or the fast-forward's skips
//! decide a run's figures (`dry::scouts`), there is no scout, and every probe is a dry run of
//! its own.

use super::dry::{dry_engine, dry_prompt, dry_runs, keeps_snapshots, quiet, scouts};
use super::trajectory::{reads_no_room, Trajectory};
use super::{PlanTarget, STEP};
use crate::config::RunConfig;
use crate::engine::checkpoint::Checkpoint;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::report::RunReport;
use cupool_pool::driver::sim::{SimDevice, MAX_CAPACITY};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

/// Checkpoints a scout keeps at most, evenly over its prompt's ubatches: a probe runs at most
/// a 128th of the longest prompt again (under a millisecond of a 100 ms run), and the snapshots of a pool
/// holding thousands of buffers stay a few tens of MB.
const POINTS: usize = 128;

/// Probe runs whose checkpoints a scout keeps, the latest: a bisection's last probes go the
/// way of one just before them for nearly their whole length.
const KEPT_RUNS: usize = 4;

/// See the module docs.
pub(super) struct Scout {
    engine: Engine,
    sim: Arc<SimDevice>,
    /// The scouted run's checkpoints, then those of the latest probes' runs where they are
    /// kept.
    runs: VecDeque<Vec<Checkpoint>>,
    /// Whether probe runs keep checkpoints: where the pool reads its room or retries, the
    /// scouted run on an endless card serves no probe long (a legacy pool purged `auto` keeps
    /// every outgrown buffer there), while runs in nearby rooms go alike.
    keep_probes: bool,
    every: usize,
    tokens: Cow<'static, [i32]>,
    trajectory: Option<Trajectory>,
}

impl Scout {
    /// The dry run of `cfg` (its context set to `top`) on a card it never fills, checkpoints
    /// kept up to the first ubatch whose held memory is more than a context just above could
    /// have (`room(c)`: the most room a context of `c` tokens can have, `None` where it does
    /// not start; no longer context has more), the trajectory's end (`trajectory.rs`), which
    /// it keeps for a pool that reads no room. `None` where `cfg`'s pool keeps no snapshots.
    pub fn new(
        cfg: &RunConfig,
        target: &PlanTarget,
        top: usize,
        room: impl Fn(usize) -> Option<usize> + Send + Sync + 'static,
    ) -> Result<Option<Self>, RuntimeError> {
        if !keeps_snapshots(cfg, target) || !scouts(cfg) || top == 0 {
            return Ok(None);
        }
        let mut c = cfg.clone();
        c.n_ctx = top;
        let tokens = dry_prompt(top);
        // A pool that reads no room keeps the trajectory, to its end; another's run stops
        // where a context just above could not go on from the checkpoint (an `auto` legacy
        // pool's least room outgrows any room long before the memory it holds does).
        let kind = cfg.pool.resolve(target.vmm)?;
        let trajectory = reads_no_room(cfg, kind);
        let room = Arc::new(room);
        let go_on = {
            let room = room.clone();
            move |pos: usize, needs: usize| {
                trajectory || room((pos / STEP + 1) * STEP).is_some_and(|r| needs <= r)
            }
        };
        let (watch, held) = Trajectory::watch(move |c| room(c));
        let (engine, sim, points, completed, every) = quiet(|| -> Result<_, RuntimeError> {
            let (mut engine, sim) = dry_engine(&c, target, MAX_CAPACITY)?;
            let every = engine.ubatch_count(top).div_ceil(POINTS).max(1);
            engine.watch = Some(watch);
            let (points, completed) = engine.scout(&tokens, &sim, every, &go_on)?;
            engine.watch = None;
            engine.watched = false;
            Ok((engine, sim, points, completed, every))
        })?;
        Ok(Some(Self {
            engine,
            sim,
            runs: VecDeque::from([points]),
            keep_probes: !trajectory,
            every,
            tokens,
            trajectory: match trajectory {
                true => Trajectory::recorded(&held, completed, top),
                false => None,
            },
        }))
    }

    /// The trajectory of the run, once (for a pool that reads no room: `trajectory.rs`).
    pub fn take_trajectory(&mut self) -> Option<Trajectory> {
        self.trajectory.take()
    }

    /// What [`dry_runs`]`(cfg, target, lens, room)` reports, `cfg` being the scouted one but
    /// for its context: from the last checkpoint of the runs kept that serves it, or from the
    /// start where none does.
    pub fn runs(
        &mut self,
        cfg: &RunConfig,
        target: &PlanTarget,
        lens: &[usize],
        room: usize,
    ) -> Result<Vec<RunReport>, RuntimeError> {
        let alike = self.engine.alike(lens);
        let from = self
            .runs
            .iter()
            .flat_map(|run| {
                run.iter()
                    .rev()
                    .find(|p| Engine::serves(p, (lens, alike), cfg.n_ctx, room))
            })
            .max_by_key(|p| p.done);
        let Some(from) = from else {
            return dry_runs(cfg, target, lens, room);
        };
        let (engine, sim, tokens) = (&mut self.engine, &self.sim, &self.tokens);
        let mut kept = Vec::new();
        let keep = self.keep_probes.then_some((&mut kept, self.every));
        let reports =
            quiet(|| engine.prompts_after(from, (tokens, lens), sim, (cfg.n_ctx, room), keep))?;
        if !kept.is_empty() {
            if self.runs.len() > KEPT_RUNS {
                self.runs.remove(1);
            }
            self.runs.push_back(kept);
        }
        Ok(reports)
    }
}
