//! The engine: the ubatch loop over a pool and an executor. Each ubatch is a pool phase; every
//! flash-attention call takes its scratch from the pool; after each ubatch the engine records
//! the high-water, checks the budget and applies the purge policy at prefill boundaries.
//!
//! The engine owns no startup memory: [`crate::Runtime`] allocates that and hands the engine
//! its addresses; the planner runs an engine with the dry-run executor on a simulated card.

use crate::budget::Budget;
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::executor::{DeviceBuffers, Executor};
use crate::layer::{Model, Ubatch};
use crate::policy::PurgePolicy;
use crate::report::{RunReport, UbatchRow};
use crate::scratch::Scratch;
use cupool_kernels::fa;
use cupool_pool::adaptors::{Phases, Recorder};
use cupool_pool::driver::Driver;
use cupool_pool::{synchronize, OomReport, Pool, Purge};
use std::sync::Arc;
use std::time::Instant;

/// Called with each ubatch's row as it ends.
pub(crate) type Observer = Box<dyn FnMut(&UbatchRow) + Send>;

/// See the module docs.
pub(crate) struct Engine {
    pub cfg: RunConfig,
    pub driver: Arc<dyn Driver>,
    phases: Arc<Phases>,
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
}

impl Engine {
    /// Builds the pool (with phases, and a recorder if asked for) on `driver` and initialises
    /// the model in `bufs` with `exec`.
    pub fn new(
        driver: Arc<dyn Driver>,
        cfg: RunConfig,
        mut exec: Box<dyn Executor>,
        bufs: DeviceBuffers,
        budget_bytes: usize,
    ) -> Result<Self, RuntimeError> {
        let mut pool = cfg.pool.build(driver.clone())?;
        let recorder = cfg
            .record_trace
            .then(|| Arc::new(Recorder::new(pool.clone(), 0)));
        if let Some(r) = &recorder {
            pool = r.clone();
        }
        let phases = Arc::new(Phases::new(pool));
        Model {
            m: &cfg.model,
            kv: cfg.kv_type,
            b: &bufs,
        }
        .init(exec.as_mut())?;
        Ok(Self {
            budget: Budget::new(budget_bytes, bufs.cl.bytes),
            pool: phases.clone(),
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
        })
    }

    /// The hidden state of the last ubatch.
    pub fn hidden(&mut self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        let model = Model {
            m: &self.cfg.model,
            kv: self.cfg.kv_type,
            b: &self.bufs,
        };
        model.hidden(self.exec.as_mut(), n_tokens)
    }

    /// Evaluates `tokens` after those already in the cache: batches of `n_batch`, ubatches of
    /// `n_ubatch`. An OOM ends the run with a report (`completed: false`), not an error.
    pub fn decode(&mut self, tokens: &[i32]) -> Result<RunReport, RuntimeError> {
        if self.failed {
            return Err(RuntimeError::Invalid("an earlier run ran out of memory mid-ubatch; the KV cache is incomplete: build a new runtime".into()));
        }
        if self.pos + tokens.len() > self.cfg.n_ctx {
            return Err(RuntimeError::Invalid(format!(
                "{} tokens after position {} exceed the context of {} tokens: raise the context or shorten the prompt",
                tokens.len(),
                self.pos,
                self.cfg.n_ctx
            )));
        }
        let mut ubatches = Vec::new();
        let mut at = 0;
        for batch in tokens.chunks(self.cfg.n_batch) {
            for ub in batch.chunks(self.cfg.n_ubatch) {
                ubatches.push((self.pos + at, ub));
                at += ub.len();
            }
        }
        let started = Instant::now();
        let mut rows = Vec::with_capacity(ubatches.len());
        let mut oom = None;
        for (i, &(pos0, toks)) in ubatches.iter().enumerate() {
            let next = ubatches
                .get(i + 1)
                .map_or((pos0 + toks.len(), 1), |&(p, t)| (p, t.len()));
            match self.ubatch(pos0, toks, next)? {
                Ok(row) => {
                    if let Some(f) = self.observer.as_mut() {
                        f(&row);
                    }
                    rows.push(row)
                }
                Err(report) => {
                    oom = Some((pos0, report));
                    break;
                }
            }
        }
        let s = self.pool.stats();
        Ok(RunReport {
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
            driver_mallocs: s.calls.acquisitions(),
            driver_frees: s.calls.releases(),
            fallbacks: s.fallbacks,
            ubatches: rows,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// One ubatch. The outer error is fatal; the inner one is an OOM that ends the run.
    fn ubatch(
        &mut self,
        pos0: usize,
        tokens: &[i32],
        next: (usize, usize),
    ) -> Result<Result<UbatchRow, Box<OomReport>>, RuntimeError> {
        let n_tokens = tokens.len();
        let n_kv = fa::n_kv(pos0 + n_tokens, self.cfg.n_ctx);
        let index = self.ubatch_index;
        self.ubatch_index += 1;
        let ub = Ubatch {
            index,
            pos0,
            n_tokens,
            n_kv,
            tokens,
        };
        let prefill = n_tokens > 1;
        let t0 = Instant::now();
        let name = format!("ubatch {index}");
        self.phases.begin_phase(&name);
        if let Some(r) = &self.recorder {
            r.record_phase_begin(&name);
        }
        let result = self.layers(&ub);
        let phase = self.phases.end_phase().unwrap_or_default();
        if let Some(r) = &self.recorder {
            r.record_phase_end(prefill);
        }
        match result {
            Ok(()) => {}
            Err(RuntimeError::OutOfMemory(report)) => {
                self.failed = true;
                tracing::error!(
                    ubatch = index,
                    tokens_done = pos0,
                    requested = report.requested,
                    "run ended: out of memory in ubatch {index} after {pos0} tokens"
                );
                return Ok(Err(report));
            }
            Err(e) => {
                self.failed = true;
                return Err(e);
            }
        }
        self.pos = pos0 + n_tokens;
        let purged_bytes = if prefill {
            self.purge_boundary(next)?
        } else {
            0
        };
        let seconds = t0.elapsed().as_secs_f64();
        let stats = self.pool.stats();
        let device = self.driver.mem_info()?;
        let over = self.budget.check(
            index,
            self.pos,
            n_tokens,
            phase.reserved_peak_bytes,
            device.free,
        );
        Ok(Ok(UbatchRow {
            index,
            pos0,
            n_tokens,
            n_kv,
            live_peak_bytes: phase.live_peak_bytes,
            reserved_bytes: phase.reserved_peak_bytes,
            cached_bytes: stats.cached_bytes,
            device_used_bytes: device.used(),
            budget_bytes: self.budget.bytes,
            over_budget: over,
            driver_mallocs: phase.calls.acquisitions(),
            purged_bytes,
            seconds,
        }))
    }

    fn scratch(&self, n_tokens: usize, n_kv: usize) -> fa::FaScratch {
        let c = &self.cfg;
        fa::scratch(&c.model.attn(), c.kv_type, n_tokens, n_kv, c.sms)
    }

    fn layers(&mut self, ub: &Ubatch) -> Result<(), RuntimeError> {
        let scratch = self.scratch(ub.n_tokens, ub.n_kv);
        let model = Model {
            m: &self.cfg.model,
            kv: self.cfg.kv_type,
            b: &self.bufs,
        };
        let x = self.exec.as_mut();
        model.embed(x, ub)?;
        for layer in 0..model.m.n_layer {
            model.pre_attention(x, layer, ub)?;
            let s = Scratch::take(&self.pool, scratch)?;
            model.attention(x, layer, ub, &s)?;
            drop(s);
            model.feed_forward(x, ub)?;
        }
        x.sync()
    }

    /// Applies the purge policy after a prefill ubatch; returns the bytes released.
    fn purge_boundary(
        &mut self,
        (next_pos, next_tokens): (usize, usize),
    ) -> Result<usize, RuntimeError> {
        let what = match self.cfg.purge {
            PurgePolicy::Never => return Ok(0),
            PurgePolicy::Always => Purge::All,
            PurgePolicy::Auto => {
                let n_kv = fa::n_kv(next_pos + next_tokens, self.cfg.n_ctx);
                let what = Purge::KeepFor(self.scratch(next_tokens, n_kv).request_bytes());
                if self.pool.releasable(&what) == 0 {
                    return Ok(0);
                }
                what
            }
        };
        let token = synchronize(self.driver.as_ref())?;
        if let Some(r) = &self.recorder {
            r.record_sync();
        }
        Ok(self.pool.purge(&token, what)?.bytes)
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
