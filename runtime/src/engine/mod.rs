//! The engine: the ubatch loop over a pool and an executor. Each ubatch is a pool phase; every
//! flash-attention call takes its scratch from the pool; after each ubatch the engine records
//! the high-water, checks the budget and applies the purge policy at prefill boundaries.
//!
//! The engine owns no startup memory: [`crate::Runtime`] allocates that and hands the engine
//! its addresses; the planner runs an engine with the dry-run executor on a simulated card.

mod branch;
pub(crate) mod checkpoint;
mod peaks;
mod ubatch;

use crate::budget::{Budget, Projection};
use crate::config::RunConfig;
use crate::engine_kind::EngineKind;
use crate::error::RuntimeError;
use crate::executor::{DeviceBuffers, Executor};
use crate::fast_forward::FastForward;
use crate::layer::Model;
use crate::report::{RunReport, UbatchRow};
use cupool_kernels::fa;
use cupool_pool::adaptors::{Phases, PurgeRetry};
use cupool_pool::driver::Driver;
use cupool_pool::trace::Recorder;
use cupool_pool::Pool;
use cupool_profiles::{Profile, Setup, UbatchShape};
use peaks::Peaks;
use std::sync::Arc;
use std::time::Instant;

/// Called with each ubatch's row as it ends.
pub(crate) type Observer = Box<dyn FnMut(&UbatchRow) + Send>;

/// Called in a dry run after each ubatch's layers (before its boundary purge) with the tokens
/// done and the bytes the device holds; `false` ends the run there (the planner's trajectory,
/// `planner/trajectory.rs`).
pub(crate) type Watch = Box<dyn FnMut(usize, usize) -> bool + Send>;

/// See the module docs.
pub(crate) struct Engine {
    pub cfg: RunConfig,
    pub driver: Arc<dyn Driver>,
    phases: Phased,
    /// `phases`, as the pool scratch is taken from.
    pub pool: Arc<dyn Pool>,
    pub recorder: Option<Arc<Recorder>>,
    exec: Box<dyn Executor>,
    pub bufs: DeviceBuffers,
    pub budget: Budget,
    pub pos: usize,
    failed: bool,
    ubatch_index: usize,
    pub observer: Option<Observer>,
    /// See [`Watch`]; `watched` is set where it ended the run.
    pub watch: Option<Watch>,
    pub watched: bool,
    /// Tokens of the prefill being decoded, from position 0.
    prefill_tokens: usize,
    /// Where the decode in progress started (its batches count from there).
    decode_start: usize,
    /// Dry runs only (the planner): skip what cannot change the pool's numbers. Such a run
    /// keeps no rows, calls no observer and checks no budget (it has none): its report's
    /// totals are its result.
    ff: FastForward,
    /// A dry run's engine-profile requests around each layer's attention, by ubatch size.
    around: crate::profiled::Around,
    /// A dry run's rooms its boundaries decided in as they did, from `room_read` and below
    /// `room_below`: above the device memory each `auto` read of it found used, what the
    /// headroom asked to be free there, wherever a short device would have released something
    /// (`checkpoint.rs`).
    room_read: usize,
    room_below: usize,
}

/// Where a ubatch's peaks come from: the pool's phases (a row's numbers), or in a dry run
/// its own peaks, which read no pool statistics ([`peaks`]).
enum Phased {
    Phases(Arc<Phases>),
    Peaks(Arc<Peaks>),
}

impl Phased {
    /// [`crate::profiled::take_ubatch`] on the engine's pool, called as the adaptor's own
    /// type rather than through `dyn Pool` (a dry run makes millions of requests);
    /// `labels`: whether the pool records the requests' names.
    fn take_ubatch(
        &self,
        labels: bool,
        u: UbatchShape,
        p: (Profile, Setup),
        ff: &FastForward,
        around: Option<&mut crate::profiled::Around>,
    ) -> Result<(), RuntimeError> {
        use crate::profiled::take_ubatch;
        match self {
            Phased::Peaks(pool) => take_ubatch((pool.as_ref(), labels), u, p, ff, around),
            Phased::Phases(pool) => take_ubatch((pool.as_ref(), labels), u, p, ff, around),
        }
    }
}

/// The pool a run of `cfg` takes its scratch from, on `driver`.
pub(crate) fn build_pool(
    cfg: &RunConfig,
    driver: Arc<dyn Driver>,
) -> Result<Arc<dyn Pool>, RuntimeError> {
    // An engine profile's legacy pool behaves as that engine's does on OOM; under a purge
    // policy it is libcupool's, which trims the device's pools and retries unless
    // CUPOOL_PURGE=never.
    let mut pool_cfg = cfg.pool_config(driver.vmm_supported())?;
    if let EngineKind::Profile { profile, .. } = cfg.engine {
        pool_cfg.legacy.flush_and_retry =
            profile.legacy_flush_and_retry() || cfg.purge != crate::policy::PurgePolicy::Never;
    }
    let mut pool = pool_cfg.build(driver)?;
    // Under a purge policy libcupool answers a failed allocation by purging every pool of
    // the device and retrying (its size classes included), and an engine profile's pool is
    // libcupool's.
    if matches!(cfg.engine, EngineKind::Profile { .. })
        && cfg.purge != crate::policy::PurgePolicy::Never
    {
        pool = Arc::new(PurgeRetry::new(pool));
    }
    Ok(pool)
}

impl Engine {
    /// Builds the pool (with phases, and a recorder if asked for) on `driver` and initialises
    /// the model in `bufs` with `exec`; `ff` says whether it is a dry run that fast-forwards.
    pub fn new(
        driver: Arc<dyn Driver>,
        cfg: RunConfig,
        mut exec: Box<dyn Executor>,
        bufs: DeviceBuffers,
        budget_bytes: usize,
        ff: FastForward,
    ) -> Result<Self, RuntimeError> {
        let mut pool = build_pool(&cfg, driver.clone())?;
        let recorder = cfg
            .record_trace
            .then(|| Arc::new(Recorder::new(pool.clone(), 0)));
        if let Some(r) = &recorder {
            pool = r.clone();
        }
        let (phases, phased): (_, Arc<dyn Pool>) = if ff.on() {
            let p = Arc::new(Peaks::new(pool));
            (Phased::Peaks(p.clone()), p)
        } else {
            let p = Arc::new(Phases::new(pool));
            (Phased::Phases(p.clone()), p)
        };
        Model {
            m: &cfg.model,
            kv: cfg.kv_type,
            b: &bufs,
            pool: &phased,
        }
        .init(exec.as_mut())?;
        // A dry run checks no budget (see `ff`): the compute buffer a check adds to the pool
        // is not worked out (for a mainline profile, a replay of its allocator).
        let compute = match ff.on() {
            true => 0,
            false => bufs.cl.bytes + cfg.profile_compute_bytes(cfg.n_ctx),
        };
        Ok(Self {
            prefill_tokens: 0,
            decode_start: 0,
            ff,
            around: Default::default(),
            budget: Budget::new(budget_bytes, compute),
            pool: phased,
            phases,
            cfg,
            driver,
            recorder,
            exec,
            bufs,
            pos: 0,
            failed: false,
            ubatch_index: 0,
            observer: None,
            watch: None,
            watched: false,
            room_read: 0,
            room_below: usize::MAX,
        })
    }

    /// The layers of ubatch `index` at `pos0`, shaped `u`, from the engine profile `p`.
    fn profiled_layers(
        &mut self,
        (index, pos0): (usize, usize),
        u: UbatchShape,
        p: (Profile, Setup),
    ) -> Result<(), RuntimeError> {
        // The requests' names are read only by a recorder (a trace). `phases` is the pool
        // (`Engine::new`).
        let labels = self.recorder.is_some();
        if index == 0 && pos0 == 0 && self.cfg.warm_up {
            // The engine's warm-up decode, in the first ubatch's phase (one token marks no
            // end). Its setup may differ from the run's (every expert routed), so the requests
            // around the attention kept for the run's ubatches are not used.
            if let Some((s, u)) = p.0.warm_up(&p.1, 1) {
                self.phases
                    .take_ubatch(labels, u, (p.0, s), &self.ff, None)?;
            }
        }
        let around = self.ff.on().then_some(&mut self.around);
        self.phases.take_ubatch(labels, u, p, &self.ff, around)?;
        self.exec.sync()
    }

    /// The hidden state of the last ubatch.
    pub fn hidden(&mut self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        let model = Model {
            m: &self.cfg.model,
            kv: self.cfg.kv_type,
            b: &self.bufs,
            pool: &self.pool,
        };
        model.hidden(self.exec.as_mut(), n_tokens)
    }

    /// Evaluates `tokens` after those already in the cache: batches of `n_batch`, ubatches of
    /// `n_ubatch`. An OOM ends the run with a report (`completed: false`), not an error.
    pub fn decode(&mut self, tokens: &[i32]) -> Result<RunReport, RuntimeError> {
        self.start_decode(tokens.len())?;
        let ubatches = self.split(self.pos, tokens);
        let started = Instant::now();
        let mut rows = Vec::with_capacity(ubatches.len());
        self.ff.start(self.pool.as_ref());
        let oom = self.run_ubatches(&ubatches, 0, ubatches.len(), &mut rows)?;
        Ok(self.report(oom, rows, started))
    }

    /// Checks that `n` tokens may follow those in the cache, and starts their decode.
    fn start_decode(&mut self, n: usize) -> Result<(), RuntimeError> {
        if self.failed {
            return Err(RuntimeError::Invalid("an earlier run ran out of memory mid-ubatch; the KV cache is incomplete: build a new runtime".into()));
        }
        if self.pos + n > self.cfg.n_ctx {
            return Err(RuntimeError::Invalid(format!(
                "{} tokens after position {} exceed the context of {} tokens: raise the context or shorten the prompt",
                n,
                self.pos,
                self.cfg.n_ctx
            )));
        }
        self.prefill_tokens = self.pos + n;
        self.decode_start = self.pos;
        Ok(())
    }

    /// `tokens` from position `pos` in ubatches: (position, tokens) each, batches of `n_batch`
    /// split into ubatches of `n_ubatch`.
    fn split<'t>(&self, pos: usize, tokens: &'t [i32]) -> Vec<(usize, &'t [i32])> {
        self.cuts(pos, pos, pos + tokens.len())
            .map(|(p, n)| (p, &tokens[p - pos..p - pos + n]))
            .collect()
    }

    /// The ubatches of a decode that starts at position `origin`, from position `from` (where
    /// one starts) to `to`: (position, tokens) each. Batches of `n_batch` from `origin`,
    /// ubatches of `n_ubatch` within each, the last of each cut where the batch or `to` ends.
    fn cuts(&self, origin: usize, from: usize, to: usize) -> impl Iterator<Item = (usize, usize)> {
        let (batch, ubatch) = (self.cfg.n_batch.max(1), self.cfg.n_ubatch.max(1));
        let mut p = from;
        std::iter::from_fn(move || {
            if p >= to {
                return None;
            }
            let batch_end = origin + ((p - origin) / batch + 1) * batch;
            let end = (p + ubatch).min(batch_end).min(to);
            let at = p;
            p = end;
            Some((at, end - at))
        })
    }

    /// Runs `ubatches[from..n]` (each with its boundary, the next one read from `ubatches`):
    /// where one ran out of memory, its position and report.
    fn run_ubatches(
        &mut self,
        ubatches: &[(usize, &[i32])],
        from: usize,
        n: usize,
        rows: &mut Vec<UbatchRow>,
    ) -> Result<Option<(usize, Box<cupool_pool::OomReport>)>, RuntimeError> {
        let mut i = from;
        while i < n {
            let (pos0, toks) = ubatches[i];
            let next = ubatches
                .get(i + 1)
                .map_or((pos0 + toks.len(), 1), |&(p, t)| (p, t.len()));
            let mark = self.ff.mark_ubatch(self.pool.as_ref());
            match self.ubatch(pos0, toks, next)? {
                Ok(Some(row)) => {
                    if let Some(f) = self.observer.as_mut() {
                        f(&row);
                    }
                    rows.push(row)
                }
                Ok(None) => {}
                Err(report) => return Ok(Some((pos0, report))),
            }
            if self.watched {
                break;
            }
            i += 1 + self.skip_after(ubatches, i, n, mark);
        }
        Ok(None)
    }

    /// After ubatch `i` of `ubatches` (marked with `mark` before it), how many of those after
    /// it, up to `n`, the fast-forward skips (counted as run).
    fn skip_after(
        &mut self,
        ubatches: &[(usize, &[i32])],
        i: usize,
        n: usize,
        mark: crate::fast_forward::Mark,
    ) -> usize {
        let n_ctx = self.cfg.n_ctx;
        let shape = |k: usize| {
            let (p, t): (usize, &[i32]) = ubatches[k];
            (t.len(), fa::n_kv(p + t.len(), n_ctx))
        };
        // The first ubatch of an engine profile's run may hold its warm-up.
        let alone = ubatches[i].0 == 0
            && self.ubatch_index == 1
            && self.cfg.warm_up
            && matches!(self.cfg.engine, EngineKind::Profile { .. });
        let skip = self
            .ff
            .ubatches_to_skip(self.pool.as_ref(), (mark, alone), i, n, shape);
        self.ubatch_index += skip;
        skip
    }

    /// The decode's report: `oom` where it ran out of memory, its rows, its start.
    fn report(
        &self,
        oom: Option<(usize, Box<cupool_pool::OomReport>)>,
        rows: Vec<UbatchRow>,
        started: Instant,
    ) -> RunReport {
        let skipped = self.ff.skipped();
        let s = self.pool.stats();
        RunReport {
            pool: self.pool.kind(),
            purge: self.cfg.purge,
            budget_mode: self.cfg.budget,
            completed: oom.is_none(),
            oom_at_token: oom.as_ref().map(|(p, _)| *p),
            oom: oom.map(|(_, r)| r),
            peak_live_bytes: s.live_peak_bytes,
            peak_reserved_bytes: s.reserved_peak_bytes,
            budget_bytes: self.budget.bytes,
            compute_bytes: self.bufs.cl.bytes,
            budget_warnings: self.budget.warnings,
            projected_oom_at_token: match self.budget.projection {
                Some(Projection::DiesAt(t)) => Some(t),
                _ => None,
            },
            driver_mallocs: s.calls.acquisitions() + skipped.0,
            driver_frees: s.calls.releases() + skipped.1,
            fallbacks: s.fallbacks,
            fallback_peak_bytes: s.fallback_live_peak_bytes,
            ubatches: rows,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.cfg.model.name)
            .field("pool", &self.pool.kind())
            .field("pos", &self.pos)
            .finish()
    }
}
