//! The engine: the ubatch loop over a pool and an executor. Each ubatch is a pool phase; every
//! flash-attention call takes its scratch from the pool; after each ubatch the engine records
//! the high-water, checks the budget and applies the purge policy at prefill boundaries.
//!
//! The engine owns no startup memory: [`crate::Runtime`] allocates that and hands the engine
//! its addresses; the planner runs an engine with the dry-run executor on a simulated card.

use crate::budget::{Budget, Projection};
use crate::config::RunConfig;
use crate::engine_kind::EngineKind;
use crate::error::RuntimeError;
use crate::executor::{DeviceBuffers, Executor};
use crate::layer::{Model, Ubatch};
use crate::planner::{self, PlanTarget};
use crate::policy::PurgePolicy;
use crate::report::{RunReport, UbatchRow};
use crate::scratch::Scratch;
use cupool_kernels::fa;
use cupool_pool::adaptors::{label, Phases};
use cupool_pool::driver::Driver;
use cupool_pool::trace::Recorder;
use cupool_pool::{synchronize, OomReport, Pool, PoolBuffer, Purge};
use cupool_profiles::{Device, EngineModel, OpCall, Profile, Setup, UbatchShape};
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
    /// The device as the pool found it (free memory after the startup buffers): what a
    /// projection of the rest of the run simulates.
    room: PlanTarget,
    /// Tokens of the prefill being decoded, from position 0.
    prefill_tokens: usize,
    /// Where the decode in progress started (its batches count from there).
    decode_start: usize,
    /// Dry runs only (the planner): skip what cannot change the pool's numbers (see
    /// `decode`). Rows, budget checks and observers then cover the ubatches run, not all.
    pub(crate) fast_forward: bool,
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
        // An engine profile's legacy pool behaves as that engine's does on OOM.
        let mut pool_cfg = cfg.pool.clone();
        if let EngineKind::Profile { profile, .. } = cfg.engine {
            pool_cfg.legacy.flush_and_retry = profile.legacy_flush_and_retry();
        }
        let mut pool = pool_cfg.build(driver.clone())?;
        let recorder = cfg
            .record_trace
            .then(|| Arc::new(Recorder::new(pool.clone(), 0)));
        if let Some(r) = &recorder {
            pool = r.clone();
        }
        let phases = Arc::new(Phases::new(pool));
        let phased: Arc<dyn Pool> = phases.clone();
        Model {
            m: &cfg.model,
            kv: cfg.kv_type,
            b: &bufs,
            pool: &phased,
        }
        .init(exec.as_mut())?;
        let room = PlanTarget::of(driver.as_ref())?;
        Ok(Self {
            room,
            prefill_tokens: 0,
            decode_start: 0,
            fast_forward: false,
            budget: Budget::new(
                budget_bytes,
                bufs.cl.bytes + cfg.profile_compute_bytes(cfg.n_ctx),
            ),
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
        })
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
        self.prefill_tokens = self.pos + tokens.len();
        self.decode_start = self.pos;
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
        // Driver calls of the ubatches fast-forward skipped: (acquisitions, releases).
        let mut skipped = (0u64, 0u64);
        let n_ctx = self.cfg.n_ctx;
        let shape = |k: usize| {
            let (p, t): (usize, &[i32]) = ubatches[k];
            (t.len(), fa::n_kv(p + t.len(), n_ctx))
        };
        let mut empty_before = self.pool.stats().reserved_bytes == 0;
        let mut i = 0;
        while i < ubatches.len() {
            let (pos0, toks) = ubatches[i];
            let next = ubatches
                .get(i + 1)
                .map_or((pos0 + toks.len(), 1), |&(p, t)| (p, t.len()));
            let before = self.fast_forward.then(|| self.pool.stats().calls);
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
            i += 1;
            let Some(before) = before else {
                continue;
            };
            // A ubatch that made no driver call (its boundary included) left the pool's cache
            // as it found it; one that started and ended with an empty pool will do the same
            // again. Either way the next ubatches of the same shape repeat it exactly: skip
            // them, but run the last of them, whose boundary sees a different next ubatch.
            let after = self.pool.stats();
            let calls = (
                after.calls.acquisitions() - before.acquisitions(),
                after.calls.releases() - before.releases(),
            );
            let empty_after = after.reserved_bytes == 0;
            if calls == (0, 0) || (empty_before && empty_after) {
                let mut j = i;
                while j + 1 < ubatches.len()
                    && shape(j) == shape(i - 1)
                    && shape(j + 1) == shape(i - 1)
                {
                    j += 1;
                }
                let n = (j - i) as u64;
                skipped.0 += calls.0 * n;
                skipped.1 += calls.1 * n;
                self.ubatch_index += j - i;
                i = j;
            }
            empty_before = empty_after;
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
        // Decided before the phase closes in a recording: its keep list belongs to the phase.
        let purge = match (&result, prefill) {
            (Ok(()), true) => self.boundary_purge(next, phase.live_peak_bytes)?,
            _ => None,
        };
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
        let purged_bytes = match purge {
            Some(what) => self.purge(what)?,
            None => 0,
        };
        let seconds = t0.elapsed().as_secs_f64();
        let stats = self.pool.stats();
        let device = self.driver.mem_info()?;
        let (cfg, room, total) = (&self.cfg, &self.room, self.prefill_tokens);
        let over = self.budget.check(
            index,
            self.pos,
            phase.reserved_peak_bytes,
            device.free,
            || match planner::project_oom(cfg, room, total) {
                Ok(Some(t)) => Projection::DiesAt(t),
                Ok(None) => Projection::Completes,
                Err(e) => Projection::Unknown(e.to_string()),
            },
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

    /// The engine profile of the run, if any, with what it is asked about.
    fn profile(&self) -> Result<Option<(Profile, Setup)>, RuntimeError> {
        profile_setup(&self.cfg)
    }

    /// Rows with logits in a ubatch: the last token of each batch (llama-cli and llama-bench
    /// decode a prompt in batches of `-b` tokens, each asking for its last token's logits).
    fn outputs(&self, pos0: usize, n_tokens: usize) -> usize {
        let end = pos0 + n_tokens;
        usize::from(end == self.prefill_tokens || (end - self.decode_start) % self.cfg.n_batch == 0)
    }

    /// An engine profile's requests, op by op (the dry-run executor computes nothing): each op
    /// takes its held buffers, its inner ones in turn, and returns them in reverse. In a dry
    /// run, the layers between the first one that made no driver call and the last one repeat
    /// it exactly and are skipped; the last layer (output rows only) and the output matrix run.
    fn profile_layers(
        &mut self,
        u: UbatchShape,
        (profile, s): (Profile, Setup),
    ) -> Result<(), RuntimeError> {
        let m = &s.model;
        let mut l = 0;
        while l < m.n_layer {
            let before = self.fast_forward.then(|| self.pool.stats().calls);
            for c in profile.layer(&s, u, l)? {
                take_call(&self.pool, &c, self.fast_forward)?;
            }
            l += 1;
            if l + 1 < m.n_layer && before.is_some_and(|b| self.pool.stats().calls == b) {
                // The layers up to the next of another kind (the first expert layer after the
                // dense ones) or the last repeat the one that made no driver call.
                let next_kind = m.n_dense_lead;
                l = if m.moe.is_some() && l <= next_kind && next_kind < m.n_layer - 1 {
                    next_kind
                } else {
                    m.n_layer - 1
                };
            }
        }
        if let Some(c) = profile.output(&s, u) {
            take_call(&self.pool, &c, self.fast_forward)?;
        }
        self.exec.sync()
    }

    /// What an auto purge keeps for the profile's ubatch `u`: the first layer's requests (every
    /// layer of its kind repeats them), the first expert layer's after dense ones, the last
    /// layer's and the output matrix's.
    fn profile_keep(
        &self,
        u: UbatchShape,
        (profile, s): (Profile, Setup),
    ) -> Result<Vec<usize>, RuntimeError> {
        let m = &s.model;
        let mut calls = profile.layer(&s, u, 0)?;
        if m.moe.is_some() && m.n_dense_lead > 0 && m.n_dense_lead < m.n_layer - 1 {
            calls.extend(profile.layer(&s, u, m.n_dense_lead)?);
        }
        calls.extend(profile.layer(&s, u, m.n_layer - 1)?);
        calls.extend(profile.output(&s, u));
        Ok(keep_for(&calls))
    }

    fn layers(&mut self, ub: &Ubatch) -> Result<(), RuntimeError> {
        if let Some(p) = self.profile()? {
            let u = UbatchShape {
                n_tokens: ub.n_tokens,
                n_kv: ub.n_kv,
                n_outputs: self.outputs(ub.pos0, ub.n_tokens),
            };
            return self.profile_layers(u, p);
        }
        let scratch = self.scratch(ub.n_tokens, ub.n_kv);
        let workspace = take_workspace(&self.pool, self.cfg.gemm_workspace_bytes)?;
        let model = Model {
            m: &self.cfg.model,
            kv: self.cfg.kv_type,
            b: &self.bufs,
            pool: &self.pool,
        };
        let x = self.exec.as_mut();
        if let Some(w) = &workspace {
            x.set_gemm_workspace(w.ptr(), w.len())?;
        }
        model.embed(x, ub)?;
        for layer in 0..model.m.n_layer {
            let before = self.fast_forward.then(|| self.pool.stats().calls);
            model.pre_attention(x, layer, ub)?;
            let s = Scratch::take(&self.pool, scratch)?;
            model.attention(x, layer, ub, &s)?;
            drop(s);
            model.feed_forward(x, ub)?;
            // Every layer takes the same scratch: one served from the cache without a driver
            // call left it as it was, and so will the rest (the dry run computes nothing).
            if before.is_some_and(|b| self.pool.stats().calls == b) {
                break;
            }
        }
        x.sync()?;
        // The GEMMs that used it have run: it goes back to the pool with the ubatch.
        x.set_gemm_workspace(0, 0)?;
        drop(workspace);
        Ok(())
    }

    /// What the purge policy returns after a prefill ubatch whose pool held `live_peak` bytes
    /// at once (`None`: nothing), recording an `auto` decision.
    fn boundary_purge(
        &mut self,
        (next_pos, next_tokens): (usize, usize),
        live_peak: usize,
    ) -> Result<Option<Purge>, RuntimeError> {
        match self.cfg.purge {
            PurgePolicy::Never => Ok(None),
            PurgePolicy::Always => Ok(Some(Purge::All)),
            PurgePolicy::Auto => {
                // Each buffer returned is a driver free: only worth it when memory is short.
                let free = self.driver.mem_info()?.free;
                if !self.cfg.auto_headroom.short(free, live_peak) {
                    if let Some(r) = &self.recorder {
                        r.record_keep(None);
                    }
                    return Ok(None);
                }
                let n_kv = fa::n_kv(next_pos + next_tokens, self.cfg.n_ctx);
                let keep = match self.profile()? {
                    Some(p) => {
                        let u = UbatchShape {
                            n_tokens: next_tokens,
                            n_kv,
                            n_outputs: self.outputs(next_pos, next_tokens),
                        };
                        self.profile_keep(u, p)?
                    }
                    None => {
                        // The workspace, one buffer of each size the GEMMs convert q8_0
                        // weights into (one at a time), the flash-attention scratch.
                        let mut keep = vec![self.cfg.gemm_workspace_bytes];
                        keep.retain(|&b| b > 0);
                        let mut src0 =
                            crate::layer::src0_requests(&self.cfg.model, self.cfg.weight_type);
                        src0.sort_unstable_by(|a, b| b.cmp(a));
                        src0.dedup();
                        keep.extend(src0);
                        keep.extend(self.scratch(next_tokens, n_kv).request_bytes());
                        keep
                    }
                };
                if let Some(r) = &self.recorder {
                    r.record_keep(Some(keep.clone()));
                }
                let what = Purge::KeepFor(keep);
                Ok((self.pool.releasable(&what) > 0).then_some(what))
            }
        }
    }

    /// Synchronizes and returns `what`; the bytes released.
    fn purge(&mut self, what: Purge) -> Result<usize, RuntimeError> {
        let token = synchronize(self.driver.as_ref())?;
        if let Some(r) = &self.recorder {
            r.record_sync();
        }
        Ok(self.pool.purge(&token, what)?.bytes)
    }
}

/// The engine's view of the run's model: the preset's graph shape and vocabulary, the run's
/// dimensions (a run may override the layers, say).
/// What the engine profile of `cfg` asks of the pool in the first layer of a ubatch of
/// `n_tokens` over `n_kv` positions, in bytes (the sum of its requests): `None` without a
/// profile, an error where the profile refuses that ubatch.
pub(crate) fn profile_layer_bytes(
    cfg: &RunConfig,
    n_tokens: usize,
    n_kv: usize,
) -> Result<Option<usize>, RuntimeError> {
    let Some((profile, s)) = profile_setup(cfg)? else {
        return Ok(None);
    };
    let u = UbatchShape {
        n_tokens,
        n_kv,
        n_outputs: 0,
    };
    let calls = profile.layer(&s, u, 0)?;
    Ok(Some(calls.iter().flat_map(OpCall::request_bytes).sum()))
}

/// The engine profile of `cfg`, if any, with what it is asked about.
fn profile_setup(cfg: &RunConfig) -> Result<Option<(Profile, Setup)>, RuntimeError> {
    let EngineKind::Profile { profile, cc } = cfg.engine else {
        return Ok(None);
    };
    let setup = Setup {
        model: engine_model(&cfg.model)?,
        weights: cfg.weight_type,
        kv: cfg.kv_type,
        dev: Device {
            cc,
            nsm: cfg.sms,
            occupancy: cfg.fa_occupancy,
        },
    };
    Ok(Some((profile, setup)))
}

fn engine_model(s: &crate::model::ModelShape) -> Result<EngineModel, RuntimeError> {
    let preset = EngineModel::preset(&s.name).ok_or_else(|| {
        RuntimeError::Invalid(format!(
            "engine profiles model the presets {:?}, not {:?}",
            EngineModel::PRESETS,
            s.name
        ))
    })?;
    if preset.mla.is_some() {
        // The shape describes MLA as flash attention sees it (576/512 over one cache head);
        // the profile takes the preset's latent ranks and heads, and the run's layers.
        let dense_lead = preset.n_dense_lead.min(s.n_layer.saturating_sub(1));
        return Ok(EngineModel {
            n_layer: s.n_layer,
            n_dense_lead: dense_lead,
            ..preset
        });
    }
    if s.head_dim_k != s.head_dim_v || s.v_is_k {
        return Err(RuntimeError::Invalid(format!(
            "engine profiles model K and V heads of one dimension, not {} and {}",
            s.head_dim_k, s.head_dim_v
        )));
    }
    Ok(EngineModel {
        n_layer: s.n_layer,
        n_embd: s.n_embd,
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim_k,
        n_ff: s.n_ff,
        ..preset
    })
}

/// Takes one op's requests from `pool` in the engine's order and gives them back.
/// The ubatch's GEMM workspace (`cublas_workspace` in a trace), if it has one.
fn take_workspace(
    pool: &Arc<dyn Pool>,
    bytes: usize,
) -> Result<Option<PoolBuffer<u8>>, RuntimeError> {
    if bytes == 0 {
        return Ok(None);
    }
    Ok(Some(label::with("cublas_workspace", || {
        PoolBuffer::alloc(pool, bytes)
    })?))
}

/// Takes `c`'s requests from `pool`, `c.repeat` times. With `fast_forward` (dry runs), a run
/// that made no driver call left the pool as it found it, and the runs after it would repeat it
/// exactly: they are skipped.
fn take_call(pool: &Arc<dyn Pool>, c: &OpCall, fast_forward: bool) -> Result<(), RuntimeError> {
    for _ in 0..c.repeat {
        let before = pool.stats().calls;
        let mut held = Vec::with_capacity(c.held.len());
        for r in &c.held {
            held.push(label::with(r.name, || {
                PoolBuffer::<u8>::alloc(pool, r.bytes)
            })?);
        }
        for r in &c.inner {
            drop(label::with(r.name, || {
                PoolBuffer::<u8>::alloc(pool, r.bytes)
            })?);
        }
        for n in &c.nested {
            take_call(pool, n, fast_forward)?;
        }
        while let Some(b) = held.pop() {
            drop(b);
        }
        if fast_forward && pool.stats().calls == before {
            break;
        }
    }
    Ok(())
}

/// What an auto purge keeps for a ubatch of `calls`: for each request size, as many buffers as
/// one op holds at once (ops run one after another), largest first.
fn keep_for(calls: &[OpCall]) -> Vec<usize> {
    let mut most: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for c in calls {
        let mut here: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for b in c.request_bytes() {
            *here.entry(b).or_default() += 1;
        }
        for (b, n) in here {
            let e = most.entry(b).or_default();
            *e = (*e).max(n);
        }
    }
    let mut keep: Vec<usize> = most
        .into_iter()
        .flat_map(|(b, n)| std::iter::repeat_n(b, n))
        .collect();
    keep.sort_unstable_by(|a, b| b.cmp(a));
    keep
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
