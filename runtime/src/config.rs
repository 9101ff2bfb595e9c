//! Everything a run is configured with.

use crate::engine_kind::EngineKind;
use crate::error::RuntimeError;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::model::ModelShape;
use crate::policy::{BudgetMode, PurgePolicy};
use cupool_kernels::{KvType, QK8_0};
use cupool_pool::layering::Layering;
use cupool_pool::{AutoHeadroom, PoolConfig};
use cupool_profiles::{llama, EngineModel, Weights};

/// The longest context (and batch) cupool models, in tokens: 4M, beyond every published model;
/// it bounds the planner's search and every buffer the runtime sizes from the context.
pub const MAX_CTX: usize = 1 << 22;

/// A run's configuration. [`RunConfig::new`] gives llama.cpp-like defaults.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The model's shape.
    pub model: ModelShape,
    /// KV cache type.
    pub kv_type: KvType,
    /// Context length (KV cache positions).
    pub n_ctx: usize,
    /// Logical batch (`-b`).
    pub n_batch: usize,
    /// Physical batch (`-ub`): tokens per graph evaluation.
    pub n_ubatch: usize,
    /// Resident weights in bytes (at least what the executor's one layer of weights needs).
    pub weights_bytes: usize,
    /// Multiprocessors the split-KV heuristic targets (132 on an H100/H200).
    pub sms: usize,
    /// Seed of the prompt tokens.
    pub seed: u64,
    /// Pool choice.
    pub pool: PoolConfig,
    /// Which of libcupool's defaults an engine profile's pool takes (the pool the engine gets
    /// through the ggml shim): those the user left unset. cupool's own engine builds the
    /// library's pool as configured ([`RunConfig::pool_config`]).
    pub layering: Layering,
    /// Purge policy at prefill ubatch boundaries.
    pub purge: PurgePolicy,
    /// With `auto`: return memory only while the device's free memory is below this (as
    /// libcupool's `CUPOOL_AUTO_HEADROOM`); `Infinite` returns at every boundary.
    pub auto_headroom: AutoHeadroom,
    /// Budget mode.
    pub budget: BudgetMode,
    /// Extra bytes reserved on top of the compute buffer in `ggml` mode (ik's `--fit-margin`).
    pub margin_bytes: usize,
    /// Record the pool's allocation trace.
    pub record_trace: bool,
    /// Whose pool traffic the run takes (an engine profile plans on the dry-run executor only).
    pub engine: EngineKind,
    /// Blocks per SM of the engine's flash-attention kernel (mainline profiles; `None`: as
    /// measured on compute capability 9.0, else its launch bound, see [`cupool_profiles::llama`]).
    pub fa_occupancy: Option<usize>,
    /// The GEMM workspace each ubatch of cupool's engine takes from the pool (cuBLAS uses it on
    /// a GPU; every executor takes it, so plans match runs). 0: none.
    pub gemm_workspace_bytes: usize,
    /// How the weight matrices are stored (cupool's runtime converts q8_0 to f16 per GEMM;
    /// an engine profile takes its own path for the type).
    pub weight_type: Weights,
    /// The model as the engines' graphs see it when no preset names it (a GGUF file's header
    /// gives every dimension, expert and latent rank); `None`: the preset of `model.name`.
    pub engine_model: Option<EngineModel>,
    /// Whether an engine profile's warm-up decode runs before the first ubatch, in its phase
    /// ([`cupool_profiles::Profile::warm_up`]; the engines' `--no-warmup` turns it off).
    pub warm_up: bool,
}

impl RunConfig {
    /// Defaults: q8_0 KV, `-b 2048 -ub 512`, the model's weights, vmm/legacy by device,
    /// no purge, the ggml budget.
    pub fn new(model: ModelShape, n_ctx: usize) -> Self {
        let weights_bytes = model.weights_bytes;
        Self {
            model,
            kv_type: KvType::Q8_0,
            n_ctx,
            n_batch: 2048,
            n_ubatch: 512,
            weights_bytes,
            sms: 132,
            seed: 42,
            pool: PoolConfig::default(),
            layering: Layering::default(),
            purge: PurgePolicy::Never,
            auto_headroom: AutoHeadroom::Ubatch,
            budget: BudgetMode::Ggml,
            margin_bytes: 0,
            record_trace: false,
            engine: EngineKind::Cupool,
            fa_occupancy: None,
            gemm_workspace_bytes: cupool_kernels::blas::WORKSPACE_BYTES,
            weight_type: Weights::F16,
            engine_model: None,
            warm_up: true,
        }
    }

    /// The model an engine profile is asked about: [`Self::engine_model`] when given, else the
    /// preset of the shape's name (`None` for a name no preset has).
    pub fn profile_model(&self) -> Option<EngineModel> {
        self.engine_model
            .clone()
            .or_else(|| EngineModel::preset(&self.model.name))
    }

    /// The pool the run builds on a device with or without VMM: [`Self::pool`], and for an
    /// engine profile libcupool's [`Self::layering`] on the kind it resolves to (an engine
    /// profile's legacy pool under a purge policy is libcupool's too, see `engine`).
    pub fn pool_config(&self, vmm: bool) -> Result<PoolConfig, RuntimeError> {
        let mut c = self.pool.clone();
        if let EngineKind::Profile { .. } = self.engine {
            c.kind = Some(c.resolve(vmm)?);
            self.layering.apply(&mut c);
        }
        Ok(c)
    }

    /// Checks the settings; the error says which and what is accepted.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        self.model.validate(self.kv_type)?;
        let bad = |s: String| Err(RuntimeError::Invalid(s));
        if self.n_ctx == 0 || self.n_ctx > MAX_CTX {
            return bad(format!(
                "context length {} is out of range: it must be from 1 to {MAX_CTX} tokens",
                self.n_ctx
            ));
        }
        if self.n_ubatch == 0 || self.n_batch == 0 || self.n_batch > MAX_CTX {
            return bad(format!(
                "batch {} and ubatch {} must both be from 1 to {MAX_CTX}",
                self.n_batch, self.n_ubatch
            ));
        }
        if self.n_ubatch > self.n_batch {
            return bad(format!("ubatch {} is larger than batch {}: the physical batch must be at most the logical batch", self.n_ubatch, self.n_batch));
        }
        if self.weight_type == Weights::Q8_0 {
            let m = &self.model;
            let mut rows = vec![
                ("n_embd", m.n_embd),
                ("n_head * head_dim_k", m.q_dim()),
                ("n_head_kv * head_dim_k", m.kv_dim_k()),
                ("n_ff", m.n_ff),
            ];
            if !m.v_is_k {
                rows.push(("n_head_kv * head_dim_v", m.kv_dim_v()));
            }
            if let Some((name, v)) = rows.into_iter().find(|&(_, v)| v % QK8_0 != 0) {
                return bad(format!("q8_0 weights store rows in blocks of {QK8_0}: {name} is {v}; use f16 weights or a multiple of {QK8_0}"));
            }
        }
        if self.fa_occupancy == Some(0) {
            return bad("flash-attention occupancy 0: it must be at least 1 block per SM".into());
        }
        if self.sms == 0 {
            return bad("sms is 0: it must be at least 1".into());
        }
        if self.engine != EngineKind::Cupool && self.profile_model().is_none() {
            return bad(format!(
                "the {} engine profile models the presets {:?} and the models of GGUF files (--gguf), not {:?}",
                self.engine.name(),
                EngineModel::PRESETS,
                self.model.name
            ));
        }
        Ok(())
    }

    /// The startup buffers outside the pool for a context of `n_ctx`: weights (at least what
    /// the executor's layout needs), KV cache, and the compute buffer (cupool's layout, plus what
    /// an engine profile reserves beside it: mainline's f16 copies of the cache).
    pub fn startup_bytes(&self, n_ctx: usize) -> (usize, usize, usize) {
        let (weights, kv) = self.resident_bytes(n_ctx);
        (weights, kv, self.compute_buffer_bytes(n_ctx))
    }

    /// The weights and KV cache of [`Self::startup_bytes`]: closed forms, nondecreasing in the
    /// context (the compute buffer, a replay of the engine's allocator, is neither).
    pub fn resident_bytes(&self, n_ctx: usize) -> (usize, usize) {
        let m = &self.model;
        (
            self.weights_bytes
                .max(WeightLayout::new(m, self.weight_type).bytes),
            KvLayout::new(m, self.kv_type, n_ctx).bytes,
        )
    }

    /// The compute buffer of [`Self::startup_bytes`] for a context of `n_ctx`.
    pub fn compute_buffer_bytes(&self, n_ctx: usize) -> usize {
        if let Some(c) = self.clamped_to(n_ctx) {
            return c.compute_buffer_bytes(n_ctx);
        }
        ComputeLayout::new(&self.model, self.n_ubatch).bytes + self.profile_compute_bytes(n_ctx)
    }

    /// With an engine profile and a context shorter than the ubatch, the batches the engine
    /// runs: llama.cpp (mainline and ik_llama.cpp alike) clamps the logical batch to the context
    /// and the physical batch to that (`cparams.n_batch`, `cparams.n_ubatch` where the context
    /// is made), so its compute buffer is reserved for the context's length, not the ubatch's
    /// (the 4-layer MoE at `-c 256 -ub 512`: 151 MiB, not 302). ik_llama.cpp pads the context
    /// first (to 256 positions with flash attention, which its profile models); mainline pads
    /// after. `None` where nothing changes (so a clamped configuration stays as it is).
    pub(crate) fn clamped_to(&self, n_ctx: usize) -> Option<Self> {
        let EngineKind::Profile { profile, .. } = self.engine else {
            return None;
        };
        let runs = match profile {
            cupool_profiles::Profile::IkLlama => n_ctx.next_multiple_of(256),
            _ => n_ctx,
        };
        (runs > 0 && runs < self.n_ubatch).then(|| Self {
            n_batch: self.n_batch.min(runs),
            n_ubatch: runs,
            ..self.clone()
        })
    }

    /// A lower bound of [`Self::compute_buffer_bytes`] that never decreases with the context,
    /// for the planner's search. Mainline's buffer is ggml-alloc's placement replayed, which is
    /// not monotone (a mixture of experts' is 341.5 MiB at 4,096 positions and 300.75 MiB at
    /// 38,400: see `planner/search.rs`); its bound is the larger of the tensors live together
    /// at the output and at attention (`llama::device_compute_buffer_bytes` on one device), which
    /// any placement holds at once and which only grow with the mask and the K/V copies. The
    /// other profiles' buffers are closed forms that only grow: the bound is the buffer.
    pub fn compute_floor_bytes(&self, n_ctx: usize) -> usize {
        if let Some(c) = self.clamped_to(n_ctx) {
            return c.compute_floor_bytes(n_ctx);
        }
        match self.mainline() {
            Some((v, m)) => {
                let own = ComputeLayout::new(&self.model, self.n_ubatch).bytes;
                let stages = llama::device_compute_buffer_bytes(
                    v,
                    &m,
                    self.kv_type,
                    n_ctx,
                    self.n_ubatch,
                    llama::SplitPlace::WHOLE,
                );
                own.max(stages)
            }
            None => self.compute_buffer_bytes(n_ctx),
        }
    }

    /// The mainline version and the model its graph is built for, where the engine is one of
    /// the mainline profiles (`llama`, `llama-b8833`): their compute buffer is ggml-alloc's
    /// placement of the reserve graph replayed, the same allocator in both builds.
    fn mainline(&self) -> Option<(llama::Version, EngineModel)> {
        match self.engine {
            EngineKind::Profile { profile, .. } => {
                Some((profile.llama_version()?, self.profile_model()?))
            }
            _ => None,
        }
    }

    /// The compute buffer: cupool's layout, or with an engine profile at least what the
    /// engine's worst-case graph holds when its output matrix runs
    /// ([`cupool_profiles::Profile::output_stage_bytes`]). For mainline (`llama`, `llama-b8833`) the layout
    /// alone: the engine's compute buffer depends on the context and is
    /// [`Self::profile_compute_bytes`]'s.
    pub fn compute_bytes(&self) -> usize {
        let own = ComputeLayout::new(&self.model, self.n_ubatch).bytes;
        if self.mainline().is_some() {
            return own;
        }
        match (self.engine, self.profile_model()) {
            (EngineKind::Profile { profile, .. }, Some(m)) => {
                own.max(profile.output_stage_bytes(&m, self.n_ubatch))
            }
            _ => own,
        }
    }

    /// What the engine profile holds beside cupool's compute buffer for a context of `n_ctx`:
    /// the rest of the engine's own compute buffer ([`Self::compute_bytes`]) and mainline's K/V
    /// copies in it. For mainline (`llama`, `llama-b8833`) the engine's whole compute buffer is the profile's
    /// model of its worst-case graph ([`cupool_profiles::llama::compute_buffer_bytes`]: the larger
    /// of the output stage and the attention stage with the K/V copies), checked against the
    /// buffers llama.cpp logged (profiles/tests/mainline.rs); this is what it adds to cupool's
    /// layout (nothing where the layout is larger). What the engine takes outside its buffers and
    /// pool (the cuBLAS workspace, kernel modules, the CUDA context) is the planner's `Outside`,
    /// counted against the free memory before start.
    pub fn profile_compute_bytes(&self, n_ctx: usize) -> usize {
        let own = ComputeLayout::new(&self.model, self.n_ubatch).bytes;
        if let Some((v, m)) = self.mainline() {
            return llama::compute_buffer_bytes(v, &m, self.kv_type, n_ctx, self.n_ubatch)
                .saturating_sub(own);
        }
        match (self.engine, self.profile_model()) {
            (EngineKind::Profile { profile, .. }, Some(m)) => {
                let layer = profile.layer_stage_bytes(&m, self.n_ubatch, n_ctx);
                self.compute_bytes().max(layer) - own
                    + profile.startup_extra_bytes(&m, self.kv_type, n_ctx)
            }
            _ => 0,
        }
    }

    /// `n` pseudo-random prompt token ids from the seed (xorshift), the same on every
    /// executor and in the planner's dry run.
    pub fn prompt_tokens(&self, n: usize) -> Vec<i32> {
        let mut x = self.seed ^ 0x9E37_79B9_7F4A_7C15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 32000) as i32
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
