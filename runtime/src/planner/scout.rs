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
use crate::engine::{Engine, Watch};
use crate::error::RuntimeError;
use crate::report::RunReport;
use cupool_pool::driver::sim::{SimDevice, MAX_CAPACITY};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
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
        let made = Self::scouted(cfg, target, top, (watch, &go_on), None)?;
        let (mut scout, completed) = made;
        scout.keep_probes = !trajectory;
        if trajectory {
            scout.trajectory = Trajectory::recorded(&held, completed, top);
        }
        Ok(Some(scout))
    }

    /// Whether a search of `cfg` on `target` scouts and its probes' runs keep checkpoints (a
    /// pool that reads its room or retries: [`Scout::spare`] serves it).
    pub fn keeps_probes(cfg: &RunConfig, target: &PlanTarget) -> bool {
        keeps_snapshots(cfg, target)
            && scouts(cfg)
            && cfg
                .pool
                .resolve(target.vmm)
                .is_ok_and(|kind| !reads_no_room(cfg, kind))
    }

    /// A scout for a helper's probes (`spare.rs`), where [`Scout::keeps_probes`]: no scouted
    /// run but its start, its probes' runs kept; every run stops at the ubatch after `stop`
    /// is set (what it reports then is no probe's).
    pub fn spare(
        cfg: &RunConfig,
        target: &PlanTarget,
        top: usize,
        stop: Arc<AtomicBool>,
    ) -> Result<Option<Self>, RuntimeError> {
        if !Self::keeps_probes(cfg, target) || top == 0 {
            return Ok(None);
        }
        let watch = move || -> Watch {
            let stop = stop.clone();
            Box::new(move |_: usize, _: usize| !stop.load(Ordering::Relaxed))
        };
        let (mut scout, _) =
            Self::scouted(cfg, target, top, (watch(), &|_, _| false), Some(watch()))?;
        scout.keep_probes = true;
        Ok(Some(scout))
    }

    /// The scouted run of `cfg` (its context set to `top`) on a card it never fills, watched
    /// by `watch` and its checkpoints kept while `go_on`; its probes' runs watched by `after`.
    /// Whether it completed.
    fn scouted(
        cfg: &RunConfig,
        target: &PlanTarget,
        top: usize,
        (watch, go_on): (Watch, &dyn Fn(usize, usize) -> bool),
        after: Option<Watch>,
    ) -> Result<(Self, bool), RuntimeError> {
        let mut c = cfg.clone();
        c.n_ctx = top;
        let tokens = dry_prompt(top);
        let (engine, sim, points, completed, every) = quiet(|| -> Result<_, RuntimeError> {
            let (mut engine, sim) = dry_engine(&c, target, MAX_CAPACITY)?;
            let every = engine.ubatch_count(top).div_ceil(POINTS).max(1);
            engine.watch = Some(watch);
            let (points, completed) = engine.scout(&tokens, &sim, every, go_on)?;
            engine.watch = after;
            engine.watched = false;
            Ok((engine, sim, points, completed, every))
        })?;
        let scout = Self {
            engine,
            sim,
            runs: VecDeque::from([points]),
            keep_probes: false,
            every,
            tokens,
            trajectory: None,
        };
        Ok((scout, completed))
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
