//! The runtime: startup memory, the planned budget and the engine, put together.

use crate::budget::Projection;
use crate::config::RunConfig;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::executor::{Executor, ExecutorKind};
use crate::fast_forward::FastForward;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::planner::{project_oom, startup_plan, Plan, PlanTarget};
use crate::policy::BudgetMode;
use crate::report::{RunReport, UbatchRow};
use crate::startup::Startup;
use cupool_pool::driver::Driver;
use cupool_pool::trace::Recorder;
use cupool_pool::Pool;
use std::sync::Arc;

/// A model on a device, ready to prefill. See the crate docs.
#[derive(Debug)]
pub struct Runtime {
    // Dropped in this order: the engine (and its pool) first, then the startup memory.
    engine: Engine,
    plan: Option<Plan>,
    _startup: Startup,
}

impl Runtime {
    /// Checks `cfg`, plans (planned budget mode), allocates the startup memory on `driver`,
    /// builds the pool and initialises the model with `exec`. On any failure everything taken
    /// so far is given back.
    pub fn new(
        driver: Arc<dyn Driver>,
        cfg: RunConfig,
        exec: Box<dyn Executor>,
    ) -> Result<Self, RuntimeError> {
        cfg.validate()?;
        // An engine profile runs a context shorter than its ubatch as the engine does: in
        // batches of the context's length (as the plan counts it).
        let cfg = cfg.clamped_to(cfg.n_ctx).unwrap_or(cfg);
        if cfg.engine != crate::engine_kind::EngineKind::Cupool
            && exec.kind() != ExecutorKind::DryRun
        {
            return Err(RuntimeError::Invalid(format!(
                "the {} engine profile predicts the engine's pool traffic on the dry-run executor (plan, or a run on the simulated device without --compute); the {} executor runs cupool's own kernels: use --engine cupool",
                cfg.engine.name(),
                exec.kind().name()
            )));
        }
        if exec.kind() == ExecutorKind::Cpu && !driver.host_accessible() {
            return Err(RuntimeError::Invalid(
                "the cpu executor needs a backed simulated device".into(),
            ));
        }
        let m = &cfg.model;
        let (wl, kvl, cl) = (
            WeightLayout::new(m, cfg.weight_type),
            KvLayout::new(m, cfg.kv_type, cfg.n_ctx),
            ComputeLayout::new(m, cfg.n_ubatch),
        );
        let plan = match cfg.budget {
            BudgetMode::Ggml => None,
            BudgetMode::Planned => Some(startup_plan(&cfg, driver.as_ref())?),
        };
        let extra = cfg.profile_compute_bytes(cfg.n_ctx);
        let startup = Startup::allocate(driver.clone(), cfg.weights_bytes, (wl, kvl, cl), extra)?;
        let budget = cl.bytes
            + extra
            + plan
                .as_ref()
                .map_or(cfg.margin_bytes, |p| p.pool_peak_reserved_bytes);
        let bufs = *startup.buffers();
        let mut engine = Engine::new(
            driver.clone(),
            cfg,
            exec,
            bufs,
            budget,
            FastForward::default(),
        )?;
        // The device as the pool found it (free memory after the startup buffers): what a
        // projection of the rest of the run simulates.
        let room = PlanTarget::of(driver.as_ref())?;
        let c = engine.cfg.clone();
        engine
            .budget
            .project_with(Box::new(move |total| match project_oom(&c, &room, total) {
                Ok(Some(t)) => Projection::DiesAt(t),
                Ok(None) => Projection::Completes,
                Err(e) => Projection::Unknown(e.to_string()),
            }));
        tracing::info!(
            model = %engine.cfg.model.name, pool = %engine.pool.kind(),
            weights = bufs.wl.bytes.max(engine.cfg.weights_bytes), kv = kvl.bytes, compute = cl.bytes + extra, budget,
            "runtime ready"
        );
        Ok(Self {
            engine,
            plan,
            _startup: startup,
        })
    }

    /// Calls `f` with each ubatch's row as soon as the ubatch ends (progress reporting).
    pub fn set_observer(&mut self, f: impl FnMut(&UbatchRow) + Send + 'static) {
        self.engine.observer = Some(Box::new(f));
    }

    /// The pool the flash-attention scratch comes from.
    pub fn pool(&self) -> &Arc<dyn Pool> {
        &self.engine.pool
    }

    /// The allocation trace, if recording was asked for.
    pub fn recorder(&self) -> Option<&Arc<Recorder>> {
        self.engine.recorder.as_ref()
    }

    /// The plan made at startup (planned budget mode).
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// The compute buffer's size.
    pub fn compute_bytes(&self) -> usize {
        self.engine.bufs.cl.bytes
    }

    /// The reserved compute budget.
    pub fn budget_bytes(&self) -> usize {
        self.engine.budget.bytes
    }

    /// Tokens in the KV cache.
    pub fn position(&self) -> usize {
        self.engine.pos
    }

    /// The hidden state of the last ubatch, `n_tokens * n_embd` floats.
    pub fn hidden(&mut self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        self.engine.hidden(n_tokens)
    }

    /// `n` pseudo-random prompt tokens from the configured seed.
    pub fn prompt_tokens(&self, n: usize) -> Vec<i32> {
        self.engine.cfg.prompt_tokens(n)
    }

    /// Prefills `n` prompt tokens.
    pub fn prefill(&mut self, n: usize) -> Result<RunReport, RuntimeError> {
        let tokens = self.prompt_tokens(n);
        self.decode(&tokens)
    }

    /// Evaluates `tokens` after those already in the cache: batches of `n_batch`, ubatches of
    /// `n_ubatch`. An OOM ends the run with a report (`completed: false`), not an error.
    pub fn decode(&mut self, tokens: &[i32]) -> Result<RunReport, RuntimeError> {
        self.engine.decode(tokens)
    }
}
