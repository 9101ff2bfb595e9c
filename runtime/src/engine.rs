//! The runtime: startup allocations, the ubatch loop, per-ubatch high-water, budget warnings
//! and the purge at prefill boundaries.

use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::executor::{DeviceBuffers, Executor, ExecutorKind, Scratch, Ubatch};
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::planner::{plan, Plan, PlanTarget};
use crate::policy::{BudgetMode, PurgePolicy};
use cupool_kernels::fa;
use cupool_pool::adaptors::Recorder;
use cupool_pool::driver::{DevicePtr, Driver};
use cupool_pool::{synchronize, OomReport, Pool, PoolKind, Purge};
use std::sync::Arc;
use std::time::Instant;

const GIB: f64 = (1u64 << 30) as f64;

/// One ubatch's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct UbatchRow {
    /// Index within the run.
    pub index: usize,
    /// Position of its first token.
    pub pos0: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// KV length its attention saw.
    pub n_kv: usize,
    /// Highest live pool bytes during the ubatch.
    pub live_peak_bytes: usize,
    /// Highest pool reserve during the ubatch.
    pub reserved_bytes: usize,
    /// Pool cache after the boundary purge.
    pub cached_bytes: usize,
    /// Device bytes in use after the ubatch (by everyone).
    pub device_used_bytes: usize,
    /// The reserved compute budget.
    pub budget_bytes: usize,
    /// Whether compute buffer + pool reserve exceeded the budget.
    pub over_budget: bool,
    /// Driver allocations (mallocs and maps) during the ubatch.
    pub driver_mallocs: u64,
    /// Bytes the boundary purge returned.
    pub purged_bytes: usize,
    /// Wall time of the ubatch, in seconds.
    pub seconds: f64,
}

/// A run's outcome.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Pool kind.
    pub pool: PoolKind,
    /// Purge policy.
    pub purge: PurgePolicy,
    /// Budget mode.
    pub budget_mode: BudgetMode,
    /// Whether every token was processed.
    pub completed: bool,
    /// Tokens processed before the OOM, if one happened.
    pub oom_at_token: Option<usize>,
    /// The OOM's full picture.
    pub oom: Option<Box<OomReport>>,
    /// Pool peak live bytes.
    pub peak_live_bytes: usize,
    /// Pool peak reserve.
    pub peak_reserved_bytes: usize,
    /// The reserved compute budget.
    pub budget_bytes: usize,
    /// The compute buffer.
    pub compute_bytes: usize,
    /// Budget warnings emitted.
    pub budget_warnings: usize,
    /// Driver allocations by the pool (mallocs, managed mallocs and maps).
    pub driver_mallocs: u64,
    /// Driver releases by the pool.
    pub driver_frees: u64,
    /// Allocations served by the managed fallback.
    pub fallbacks: u64,
    /// Per ubatch.
    pub ubatches: Vec<UbatchRow>,
    /// Wall time of the run.
    pub seconds: f64,
}

/// Called with each ubatch's row as it ends.
type Observer = Box<dyn FnMut(&UbatchRow) + Send>;

/// See the module docs.
pub struct Runtime {
    cfg: RunConfig,
    driver: Arc<dyn Driver>,
    pool: Arc<dyn Pool>,
    recorder: Option<Arc<Recorder>>,
    exec: Box<dyn Executor>,
    bufs: DeviceBuffers,
    startup: Vec<DevicePtr>,
    budget_bytes: usize,
    plan: Option<Plan>,
    pos: usize,
    failed: bool,
    over_budget: bool,
    warnings: usize,
    ubatch_index: usize,
    prev_reserved: usize,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("model", &self.cfg.model.name)
            .field("pool", &self.pool.kind())
            .field("pos", &self.pos)
            .finish()
    }
}

impl Runtime {
    /// Allocates the startup memory on `driver`, builds the pool and initialises `exec`.
    pub fn new(
        driver: Arc<dyn Driver>,
        cfg: RunConfig,
        mut exec: Box<dyn Executor>,
    ) -> Result<Self, RuntimeError> {
        cfg.validate()?;
        if exec.kind() == ExecutorKind::Cpu && !driver.host_accessible() {
            return Err(RuntimeError::Invalid(
                "the cpu executor needs a backed simulated device".into(),
            ));
        }
        let m = &cfg.model;
        let (wl, kvl, cl) = (
            WeightLayout::new(m),
            KvLayout::new(m, cfg.kv_type, cfg.n_ctx),
            ComputeLayout::new(m, cfg.n_ubatch),
        );
        let weights_bytes = cfg.weights_bytes.max(wl.bytes);
        let plan = match cfg.budget {
            BudgetMode::Ggml => None,
            BudgetMode::Planned => {
                let target = PlanTarget::of(driver.as_ref())?;
                let mut p = plan(&cfg, &target, cfg.n_ctx)?;
                // The budget must hold for any prompt, not just one that fills the context.
                p.pool_peak_reserved_bytes = crate::planner::worst_case_pool_peak(&cfg, &target)?;
                p.total_bytes =
                    p.weights_bytes + p.kv_bytes + p.compute_bytes + p.pool_peak_reserved_bytes;
                p.fits = p.total_bytes <= p.device_bytes;
                tracing::info!(
                    pool_peak = p.pool_peak_reserved_bytes,
                    total = p.total_bytes,
                    device = p.device_bytes,
                    fits = p.fits,
                    "planned the whole context"
                );
                if !p.fits {
                    return Err(RuntimeError::PlanDoesNotFit {
                        needed: p.total_bytes,
                        device: p.device_bytes,
                        max_ctx: p.max_ctx_that_fits,
                    });
                }
                Some(p)
            }
        };
        let mut startup = Vec::new();
        let mut take = |what: &str, bytes: usize| -> Result<DevicePtr, RuntimeError> {
            match driver.malloc(bytes) {
                Ok(p) => {
                    startup.push(p);
                    Ok(p)
                }
                Err(e) => {
                    let free = driver.mem_info().map(|i| i.free).unwrap_or(0);
                    for &p in &startup {
                        let _ = driver.free(p);
                    }
                    Err(RuntimeError::DoesNotFit(format!(
                        "the {what} ({:.2} GiB) does not fit at startup ({:.2} GiB free): {e}",
                        bytes as f64 / GIB,
                        free as f64 / GIB
                    )))
                }
            }
        };
        let weights = take("weights", weights_bytes)?;
        let kv = take("KV cache", kvl.bytes)?;
        let compute = take("compute buffer", cl.bytes)?;
        let bufs = DeviceBuffers {
            weights,
            kv,
            compute,
            wl,
            kvl,
            cl,
        };
        let base = cfg
            .pool
            .build(driver.clone())
            .map_err(RuntimeError::Config)?;
        let (pool, recorder): (Arc<dyn Pool>, _) = if cfg.record_trace {
            let r = Arc::new(Recorder::new(base, 0));
            (r.clone(), Some(r))
        } else {
            (base, None)
        };
        exec.init(&bufs)?;
        let budget_bytes = cl.bytes
            + plan
                .as_ref()
                .map_or(cfg.margin_bytes, |p| p.pool_peak_reserved_bytes);
        tracing::info!(
            model = %cfg.model.name, pool = %pool.kind(), executor = exec.kind().name(),
            weights = weights_bytes, kv = kvl.bytes, compute = cl.bytes, budget = budget_bytes,
            "runtime ready"
        );
        Ok(Self {
            cfg,
            driver,
            pool,
            recorder,
            exec,
            bufs,
            startup,
            budget_bytes,
            plan,
            pos: 0,
            failed: false,
            over_budget: false,
            warnings: 0,
            ubatch_index: 0,
            prev_reserved: 0,
            observer: None,
        })
    }

    /// Calls `f` with each ubatch's row as soon as the ubatch ends (progress reporting).
    pub fn set_observer(&mut self, f: impl FnMut(&UbatchRow) + Send + 'static) {
        self.observer = Some(Box::new(f));
    }

    /// The pool the flash-attention scratch comes from.
    pub fn pool(&self) -> &Arc<dyn Pool> {
        &self.pool
    }

    /// The allocation trace, if recording was asked for.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.recorder.as_ref()
    }

    /// The plan made at startup (planned budget mode).
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// The compute buffer's size.
    pub fn compute_bytes(&self) -> usize {
        self.bufs.cl.bytes
    }

    /// The reserved compute budget.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Tokens in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The executor's hidden state for the last ubatch.
    pub fn hidden(&self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        self.exec.hidden(n_tokens)
    }

    /// `n` pseudo-random prompt tokens from the configured seed.
    pub fn prompt_tokens(&self, n: usize) -> Vec<i32> {
        let mut x = self.cfg.seed ^ 0x9E37_79B9_7F4A_7C15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 32000) as i32
            })
            .collect()
    }

    /// Prefills `n` prompt tokens.
    pub fn prefill(&mut self, n: usize) -> Result<RunReport, RuntimeError> {
        let tokens = self.prompt_tokens(n);
        self.decode(&tokens)
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
        for i in 0..ubatches.len() {
            let (pos0, toks) = ubatches[i];
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
            budget_bytes: self.budget_bytes,
            compute_bytes: self.bufs.cl.bytes,
            budget_warnings: self.warnings,
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
        let m = self.cfg.model.clone();
        let n_tokens = tokens.len();
        let n_kv = fa::n_kv(pos0 + n_tokens, self.cfg.n_ctx);
        let scratch = fa::scratch(&m.attn(), self.cfg.kv_type, n_tokens, n_kv, self.cfg.sms);
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
        self.pool.begin_phase(&format!("ubatch {index}"));
        let result = self.layers(&m, &ub, scratch);
        let phase = match &self.recorder {
            Some(r) => r.end_phase_marked(prefill),
            None => self.pool.end_phase(),
        }
        .unwrap_or_default();
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
            self.purge_boundary(&m, next)?
        } else {
            0
        };
        let seconds = t0.elapsed().as_secs_f64();
        let stats = self.pool.stats();
        let device = self.driver.mem_info()?;
        let high_water = self.bufs.cl.bytes + phase.reserved_peak_bytes;
        let over = high_water > self.budget_bytes;
        if over && !self.over_budget {
            self.warnings += 1;
            self.warn_budget(
                index,
                pos0 + n_tokens,
                n_tokens,
                high_water,
                phase.reserved_peak_bytes,
                device.free,
            );
        }
        self.over_budget = over;
        self.prev_reserved = phase.reserved_peak_bytes;
        Ok(Ok(UbatchRow {
            index,
            pos0,
            n_tokens,
            n_kv,
            live_peak_bytes: phase.live_peak_bytes,
            reserved_bytes: phase.reserved_peak_bytes,
            cached_bytes: stats.cached_bytes,
            device_used_bytes: device.used(),
            budget_bytes: self.budget_bytes,
            over_budget: over,
            driver_mallocs: phase.calls.acquisitions(),
            purged_bytes,
            seconds,
        }))
    }

    fn layers(
        &mut self,
        m: &crate::model::ModelShape,
        ub: &Ubatch,
        scratch: fa::FaScratch,
    ) -> Result<(), RuntimeError> {
        self.exec.begin_ubatch(ub)?;
        for layer in 0..m.n_layer {
            self.exec.pre_attention(layer, ub)?;
            let s = Scratch::take(&self.pool, scratch)?;
            self.exec.attention(layer, ub, &s)?;
            drop(s);
            self.exec.post_attention(layer, ub)?;
        }
        self.exec.end_ubatch(ub)
    }

    /// Applies the purge policy after a prefill ubatch; returns the bytes released.
    fn purge_boundary(
        &mut self,
        m: &crate::model::ModelShape,
        (next_pos, next_tokens): (usize, usize),
    ) -> Result<usize, RuntimeError> {
        let what = match self.cfg.purge {
            PurgePolicy::Never => return Ok(0),
            PurgePolicy::Always => Purge::All,
            PurgePolicy::Auto => {
                let n_kv = fa::n_kv(next_pos + next_tokens, self.cfg.n_ctx);
                let next =
                    fa::scratch(&m.attn(), self.cfg.kv_type, next_tokens, n_kv, self.cfg.sms);
                let what = Purge::KeepFor(next.request_bytes());
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
        let released = self.pool.purge(&token, what).map_err(RuntimeError::from)?;
        Ok(released.bytes)
    }

    fn warn_budget(
        &self,
        index: usize,
        pos: usize,
        n_tokens: usize,
        high_water: usize,
        reserved: usize,
        device_free: usize,
    ) {
        let overshoot = high_water - self.budget_bytes;
        // The reserve's growth per token: over this ubatch, or on average if it did not grow.
        let step = reserved.saturating_sub(self.prev_reserved) as f64 / n_tokens.max(1) as f64;
        let per_token = if step > 0.0 {
            step
        } else {
            reserved as f64 / pos.max(1) as f64
        };
        let runs_out_at =
            (per_token > 0.0).then(|| pos + (device_free as f64 / per_token) as usize);
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        tracing::warn!(
            ubatch = index,
            tokens = pos,
            compute_buffer = self.bufs.cl.bytes,
            pool_reserved = reserved,
            budget = self.budget_bytes,
            overshoot,
            device_free,
            runs_out_at_token = runs_out_at,
            "compute budget exceeded: compute buffer {:.1} MiB + pool {:.1} MiB > reserved {:.1} MiB (over by {:.1} MiB); at {:.1} KiB/token the card runs out at token {}",
            mib(self.bufs.cl.bytes),
            mib(reserved),
            mib(self.budget_bytes),
            mib(overshoot),
            per_token / 1024.0,
            runs_out_at.map_or("never".to_string(), |t| t.to_string()),
        );
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Err(e) = synchronize(self.driver.as_ref()) {
            tracing::error!(error = %e, "synchronize failed while dropping the runtime");
        }
        for &p in &self.startup {
            if let Err(e) = self.driver.free(p) {
                tracing::error!(error = %e, "freeing a startup buffer failed");
            }
        }
    }
}
