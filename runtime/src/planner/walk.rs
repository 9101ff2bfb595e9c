//! The search's state below the bound (`search.rs`): each context's compute buffer and
//! result, what the probes that fit had to spare, and where the next probe goes.

use super::narrow::{Beside, Bracket, Slacks};
use super::probe::{fits_beside, STEP};
use super::room_beside;
use super::scout::Scout;
use super::spare::{Claim, Spare};
use super::trajectory::Trajectory;
use super::PlanTarget;
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::profiled::LayerBytes;
use cupool_pool::PoolKind;
use std::collections::HashMap;

/// The exact search below the bound: each context's own compute buffer, replayed once.
pub(super) struct Walk<'a> {
    cfg: &'a RunConfig,
    target: &'a PlanTarget,
    /// Each context's compute buffer.
    buffer: HashMap<usize, usize>,
    /// Whether each context probed fits.
    fits: HashMap<usize, bool>,
    /// The context the answer is expected to beat, in steps ([`super::max_ctx_above`]).
    pub start: usize,
    /// Only an answer above this counts ([`super::max_ctx_above`]).
    above: &'a dyn Fn() -> usize,
    /// Whether no dry run can fail (its pool is one the device has, and the engine profile
    /// refuses no ubatch it could ask), once asked.
    refuses_nothing: Option<bool>,
    /// The profile's bytes for the short last ubatches.
    bytes: LayerBytes,
    /// What the probes that fit had to spare: where the next probes go.
    slacks: Slacks,
    /// Whether the search still predicts: no prediction of this search was off by more than
    /// the steps from it reach.
    pub predicting: bool,
    /// The trajectory of a pool that does not read its room, once made (`trajectory.rs`),
    /// and the longest context that may start, its prompt.
    trajectory: Option<Option<Trajectory>>,
    bound: usize,
    /// Whether the probes follow the trajectory (a legacy pool's, or after the slack's
    /// prediction missed); where the pool has none, the slack's.
    expecting: bool,
    /// What this walk made that no start or bar decides (`Made`).
    made: Made,
    /// The helper making the bisection's next probe ahead, once one is had (`spare.rs`).
    spare: Option<Spare>,
    /// This search's thread, counted at work.
    _claim: Claim,
}

/// What a walk makes that its start and its bar do not decide: the scouted run (`scout.rs`)
/// and each probe's result by (context, compute buffer), a function of those alone (a probe
/// from any checkpoint reports what a dry run from the start does: `scout_tests.rs`). A walk
/// made ahead of its start (the advice's, beside the configured search: `ahead.rs`) hands it
/// to the walk that searches from it, whose probes then find their results here.
#[derive(Default)]
pub(super) struct Made {
    /// The run the probes go on from, once made.
    scout: Option<Option<Scout>>,
    /// The slack of each probe that fit, `None` for one that did not; no error is kept (the
    /// walk that meets it again runs the probe again, and reports it as a probe of its own).
    probed: HashMap<(usize, usize), Option<usize>>,
}

impl<'a> Walk<'a> {
    /// A search of `cfg` on `target` below `bound` (no context above it starts), from `start`,
    /// answering above `above()`; `predict`: whether probes are predicted; `made`: what a walk
    /// of the same `cfg`, `target` and `bound` made before (`Made::default()`: nothing).
    pub fn new(
        cfg: &'a RunConfig,
        target: &'a PlanTarget,
        (start, bound): (usize, usize),
        above: &'a dyn Fn() -> usize,
        (predict, made): (bool, Made),
    ) -> Self {
        let mut slacks = Slacks::default();
        if let Some(span) = bound.checked_sub(STEP).filter(|&n| n > 0) {
            let kv = |c: usize| cfg.resident_bytes(c).1;
            let per_position = kv(bound).saturating_sub(kv(STEP)) as f64 / span as f64;
            slacks.set_least(per_position);
        }
        Self {
            cfg,
            target,
            buffer: HashMap::new(),
            fits: HashMap::new(),
            start: start.min(crate::config::MAX_CTX) / STEP * STEP,
            above,
            refuses_nothing: None,
            bytes: LayerBytes::new(cfg),
            slacks,
            predicting: predict,
            trajectory: None,
            bound,
            // A legacy pool grows in steps (1.05 of the request, whole pages), which a slack
            // that falls linearly cannot predict (the MoE with `-ub 64` and the legacy pool
            // never purged: 22 steps off, then a dozen probes of the bisection).
            expecting: cfg.pool.resolve(target.vmm) == Ok(PoolKind::Legacy),
            made,
            spare: None,
            _claim: Claim::take(),
        }
    }

    /// What the walk made, for a walk of the same search from its start.
    pub fn into_made(mut self) -> Made {
        std::mem::take(&mut self.made)
    }

    /// Where the slack of probes beside `kind` (or, once it missed, the trajectory) expects
    /// the boundary in `[lo, fail)`, while the search predicts.
    pub fn predict(&mut self, kind: Beside, lo: usize, fail: usize) -> Option<usize> {
        if !self.predicting {
            return None;
        }
        if self.expecting {
            // A trajectory's expectation is probed where it is, below `start` too: the two
            // probes around it settle the bracket.
            if let Some(p) = self.expected(kind, lo, fail) {
                return Some(p);
            }
        }
        self.slacks
            .zero_from(kind, lo, STEP)
            .map(|p| self.over_bar(p))
    }

    /// Whether this search's pool has a trajectory (made at the first question).
    fn can_expect(&mut self) -> bool {
        self.expected(Beside::Floor, STEP, 2 * STEP).is_some()
    }

    /// The largest context in `[lo, fail)` the trajectory expects to fit beside `kind` (`lo`
    /// where it expects none above it); `None` without a trajectory.
    pub fn expected(&mut self, kind: Beside, lo: usize, fail: usize) -> Option<usize> {
        let t = match self.trajectory.take() {
            Some(t) => t,
            // The scouted run's, where the pool keeps snapshots; else a run of its own.
            None => match self.make_scout() {
                Ok(()) => match self.made.scout.as_mut().and_then(Option::as_mut) {
                    Some(s) => s.take_trajectory(),
                    None => Trajectory::of(self.cfg, self.target, self.bound, self.floor_room()),
                },
                Err(_) => None,
            },
        };
        let p = t.as_ref().map(|t| {
            t.expected(lo, fail, |c| {
                let (w, kv) = self.cfg.resident_bytes(c);
                let compute = match kind {
                    Beside::Floor => self.cfg.compute_floor_bytes(c),
                    Beside::Exact => self.compute(c),
                };
                room_beside(self.target, (w, kv, compute)).ok()
            })
        });
        self.trajectory = Some(t);
        p
    }

    /// Whether the search may stop with no answer, every answer it has left being at most
    /// `most`: only one above `above()` counts, and where no dry run left out could fail.
    pub fn answers_at_most(&mut self, most: usize) -> bool {
        let (cfg, vmm) = (self.cfg, self.target.vmm);
        most <= (self.above)()
            && *self.refuses_nothing.get_or_insert_with(|| {
                cfg.pool.resolve(vmm).is_ok() && crate::profiled::refuses_no_ubatch(cfg)
            })
    }

    /// `p`, or one step above `start` where `p` is at or below it: the search expects no
    /// answer there.
    fn over_bar(&self, p: usize) -> usize {
        match self.start {
            0 => p,
            s => p.max(s + STEP),
        }
    }

    pub fn compute(&mut self, n_ctx: usize) -> usize {
        let cfg = self.cfg;
        *self
            .buffer
            .entry(n_ctx)
            .or_insert_with(|| cfg.compute_buffer_bytes(n_ctx))
    }

    pub fn fits(&mut self, n_ctx: usize) -> Result<bool, RuntimeError> {
        if let Some(&f) = self.fits.get(&n_ctx) {
            return Ok(f);
        }
        let compute = self.compute(n_ctx);
        let slack = self.probe(n_ctx, compute)?;
        if let Some(s) = slack {
            self.slacks.note(Beside::Exact, n_ctx, s);
        }
        self.fits.insert(n_ctx, slack.is_some());
        Ok(slack.is_some())
    }

    /// Whether every prompt up to `n_ctx` completes beside the floor of its compute buffer.
    pub fn fits_floor(&mut self, n_ctx: usize) -> Result<bool, RuntimeError> {
        let floor = self.cfg.compute_floor_bytes(n_ctx);
        let slack = self.probe(n_ctx, floor)?;
        if let Some(s) = slack {
            self.slacks.note(Beside::Floor, n_ctx, s);
        }
        Ok(slack.is_some())
    }

    /// [`fits_beside`] of `n_ctx` beside a compute buffer of `compute` bytes, from the scouted
    /// run of the longest context that may start: made at the first probe, with checkpoints
    /// as far as a context's room beside the floor of its buffer could use them.
    fn probe(&mut self, n_ctx: usize, compute: usize) -> Result<Option<usize>, RuntimeError> {
        if let Some(&slack) = self.made.probed.get(&(n_ctx, compute)) {
            return Ok(slack);
        }
        if let Some(slack) = self.spare.as_ref().and_then(|s| s.take((n_ctx, compute))) {
            self.made.probed.insert((n_ctx, compute), slack);
            return Ok(slack);
        }
        self.make_scout()?;
        let scout = self.made.scout.as_mut().and_then(Option::as_mut);
        let slack = fits_beside(
            self.cfg,
            self.target,
            n_ctx,
            compute,
            &mut self.bytes,
            scout,
        )?;
        self.made.probed.insert((n_ctx, compute), slack);
        Ok(slack)
    }

    /// Makes the scouted run, once.
    fn make_scout(&mut self) -> Result<(), RuntimeError> {
        if self.made.scout.is_none() {
            self.made.scout = Some(Scout::new(
                self.cfg,
                self.target,
                self.bound,
                self.floor_room(),
            )?);
        }
        Ok(())
    }

    /// The room of a context beside the floor of its compute buffer (`None`: it does not
    /// start): no longer context has more.
    fn floor_room(&self) -> impl Fn(usize) -> Option<usize> + Send + Sync + 'static {
        let (cfg, target) = (self.cfg.clone(), *self.target);
        move |c: usize| {
            let (w, kv) = cfg.resident_bytes(c);
            room_beside(&target, (w, kv, cfg.compute_floor_bytes(c))).ok()
        }
    }

    /// The largest context at or below `bound` whose start-up buffers fit beside what lies
    /// outside them; `None` if none does.
    pub fn starts_at_or_below(&mut self, bound: usize) -> Option<usize> {
        (1..=bound / STEP).rev().map(|s| s * STEP).find(|&c| {
            let (w, kv) = self.cfg.resident_bytes(c);
            let compute = self.compute(c);
            room_beside(self.target, (w, kv, compute)).is_ok()
        })
    }

    /// The largest context from `lo` (which fits) below `fail` (which does not), where every
    /// context between them lies in one run of contexts whose buffer does not decrease: there
    /// whether a context fits is monotone.
    pub fn bisect(
        &mut self,
        kind: Beside,
        lo: usize,
        fail: usize,
    ) -> Result<Option<usize>, RuntimeError> {
        let mut b = Bracket::new(lo, fail);
        while b.fail - b.lo > STEP {
            // The answer is below the bracket's end.
            if self.answers_at_most(b.fail - STEP) {
                return Ok(None);
            }
            let predicted = self.predict(kind, b.lo, b.fail);
            let c = b.next(predicted, STEP);
            if !self.predicting {
                self.ask_ahead(kind, c, b.fail);
            }
            // The slack's steps ran out: where a trajectory can be had, the bracket starts
            // again from its expectation (once a search; it is made only here, where the
            // slack failed, since a dry run of its own costs what a probe or two do).
            if b.missed() && !self.expecting && self.can_expect() {
                self.expecting = true;
                b = Bracket::new(b.lo, b.fail);
                continue;
            }
            let fits = match kind {
                Beside::Floor => self.fits_floor(c)?,
                Beside::Exact => self.fits(c)?,
            };
            b.probed(c, fits, STEP);
        }
        self.predicting &= !b.missed();
        Ok(Some(b.lo))
    }

    /// While the bisection probes `c` in a bracket ending at `fail` (no prediction: the
    /// midpoint next), the midpoint it goes on to where `c` fits is made on the spare core
    /// where a core is free (`spare.rs`), or here where the spare core makes `c` (an error
    /// here is left for the bisection to meet, if it probes there).
    fn ask_ahead(&mut self, kind: Beside, c: usize, fail: usize) {
        let next = (c + fail) / 2 / STEP * STEP;
        let mut key = |x: usize| match kind {
            Beside::Floor => (x, self.cfg.compute_floor_bytes(x)),
            Beside::Exact => (x, self.compute(x)),
        };
        let (now, next) = (key(c), key(next));
        if fail - c <= STEP || self.made.probed.contains_key(&next) {
            return;
        }
        if self.spare.is_none() {
            self.spare = Spare::new(self.cfg, self.target, self.bound);
        }
        match &self.spare {
            Some(s) if s.has(now) => {
                let _ = self.probe(next.0, next.1);
            }
            Some(s) => s.ask(next),
            None => {}
        }
    }

    /// Where the largest context at or below `top` that fits beside its own buffer is
    /// predicted to be, from `top`'s slack beside its floor and the buffer's excess over it.
    fn predicted_below(&mut self, top: usize) -> Option<usize> {
        if !self.predicting {
            return None;
        }
        let excess = self
            .compute(top)
            .saturating_sub(self.cfg.compute_floor_bytes(top));
        self.slacks
            .covering(top, excess, STEP)
            .map(|p| self.over_bar(p))
    }

    /// The largest context at or below `top` that fits, when none above `top` does: run by run
    /// downwards, each run probed at its top (or, in the run that holds it, first where the
    /// slack predicts the answer), at doubling distances below that and at its bottom.
    pub fn largest_from(&mut self, top: usize) -> Result<Option<usize>, RuntimeError> {
        let mut hi = top;
        // The first probe where `top`'s slack beside its floor predicts the largest context
        // that fits beside the context's own buffer, rather than at `top`.
        let mut first = self.predicted_below(top);
        loop {
            // What is left to answer is at most `hi`.
            if self.answers_at_most(hi) {
                return Ok(None);
            }
            // Every context above `hi` fails; the run goes down from `hi` while the buffer
            // does not grow below.
            let mut fail = hi + STEP;
            let start = first.filter(|&p| p <= hi).unwrap_or(hi);
            let (mut c, mut probe, mut gap) = (hi, start, STEP);
            loop {
                if c == probe {
                    if self.fits(c)? {
                        return self.bisect(Beside::Exact, c, fail);
                    }
                    fail = c;
                    // What is left to answer is below `fail`.
                    if self.answers_at_most(fail - STEP) {
                        return Ok(None);
                    }
                    probe = c.saturating_sub(gap);
                    gap *= 2;
                }
                if c == STEP || self.compute(c - STEP) > self.compute(c) {
                    break;
                }
                c -= STEP;
            }
            // The prediction was probed in this run, or lies below it: kept for its own run.
            if first.is_some_and(|p| p >= c) {
                first = None;
            }
            // `c` is the run's bottom: if it fails, so does the whole run.
            if fail != c && self.fits(c)? {
                return self.bisect(Beside::Exact, c, fail);
            }
            if c == STEP {
                return Ok(None);
            }
            hi = c - STEP;
        }
    }
}
