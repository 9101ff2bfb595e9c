//! Predicting the memory of a run before it starts.
//!
//! The plan runs an engine with the dry-run executor through the whole prefill, with the same
//! pool and purge policy, on a simulated device large enough never to run out, so the pool
//! figure is exactly what the real run will reserve (to the byte on the simulated device).
//! Weights, KV cache and compute buffer are computed from the shape. Planning is a function of
//! the configuration and the target device: it builds no runtime and allocates no startup
//! memory.

use crate::config::RunConfig;
use crate::engine::Engine;
use crate::error::RuntimeError;
use crate::executor::dry_run::DryRun;
use crate::executor::DeviceBuffers;
use crate::fast_forward::FastForward;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::policy::BudgetMode;
use crate::report::RunReport;
use cupool_pool::driver::sim::{SimConfig, SimDevice, MAX_CAPACITY};
use cupool_pool::driver::Driver;
use std::sync::Arc;

/// The device a plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanTarget {
    /// Bytes free for the run.
    pub free_bytes: usize,
    /// Whether it supports VMM.
    pub vmm: bool,
    /// Its VMM granularity (2 MiB when unknown).
    pub granularity: usize,
}

impl PlanTarget {
    /// Reads `driver`'s free memory, VMM support and granularity.
    pub fn of(driver: &dyn Driver) -> Result<Self, RuntimeError> {
        let vmm = driver.vmm_supported();
        let granularity = if vmm { driver.granularity()? } else { 2 << 20 };
        Ok(Self {
            free_bytes: driver.mem_info()?.free,
            vmm,
            granularity,
        })
    }
}

/// A prediction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Prompt tokens planned for.
    pub n_prompt: usize,
    /// Peak pool reserve over the whole prefill.
    pub pool_peak_reserved_bytes: usize,
    /// Peak pool live bytes over the whole prefill.
    pub pool_peak_live_bytes: usize,
    /// Driver allocations the pool will make.
    pub pool_driver_mallocs: u64,
    /// KV cache.
    pub kv_bytes: usize,
    /// Compute buffer.
    pub compute_bytes: usize,
    /// Resident weights.
    pub weights_bytes: usize,
    /// Everything.
    pub total_bytes: usize,
    /// What the device has free.
    pub device_bytes: usize,
    /// Whether the total fits.
    pub fits: bool,
    /// The largest context (prompt filling it) that fits, in multiples of 256; `None` if none.
    pub max_ctx_that_fits: Option<usize>,
    /// When it does not fit: the tokens a run processes before it runs out of memory (0 when
    /// the startup buffers alone do not fit), simulated under the pool and purge policy.
    pub oom_at_token: Option<usize>,
}

/// A dry run of a prefill of `n_prompt` tokens with `cfg`'s pool and purge policy on a
/// simulated card whose pool has `pool_bytes` to itself (the startup buffers take none of it).
/// `fast` skips the layers and ubatches that repeat one before them exactly (the engine's
/// fast-forward): the same peaks, driver calls and failure, in a fraction of the time.
fn dry_run(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    pool_bytes: usize,
    fast: bool,
) -> Result<RunReport, RuntimeError> {
    let mut c = cfg.clone();
    c.budget = BudgetMode::Ggml;
    // The dry run measures; it has no budget to warn about (and so projects nothing itself).
    c.margin_bytes = usize::MAX / 4;
    c.record_trace = false;
    c.pool.kind = Some(cfg.pool.resolve(target.vmm)?);
    let mut sim = SimConfig::gib(0.0)
        .vmm(target.vmm)
        .granularity(target.granularity)
        .backed(false)
        .record_calls(false);
    sim.capacity = pool_bytes.min(MAX_CAPACITY);
    let driver: Arc<dyn Driver> =
        Arc::new(SimDevice::new(sim).map_err(cupool_pool::PoolError::from)?);
    let m = &c.model;
    // The dry run touches no memory: the startup buffers need no addresses.
    let bufs = DeviceBuffers {
        weights: 0,
        kv: 0,
        compute: 0,
        wl: WeightLayout::new(m, c.weight_type),
        kvl: KvLayout::new(m, c.kv_type, c.n_ctx),
        cl: ComputeLayout::new(m, c.n_ubatch),
    };
    let tokens = c.prompt_tokens(n_prompt);
    // A simulation's out-of-memory is its result, not news: its pool and engine log nothing.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        let mut engine = Engine::new(driver, c, Box::new(DryRun), bufs, usize::MAX)?;
        engine.ff = FastForward::new(fast);
        engine.decode(&tokens)
    })
}

/// The pool's peaks over a prefill of `n_prompt` tokens, by dry run.
fn pool_peaks(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<(usize, usize, u64), RuntimeError> {
    let report = dry_run(cfg, target, n_prompt, MAX_CAPACITY, true)?;
    if !report.completed {
        return Err(RuntimeError::Invalid(
            "the dry run ran out of a 256 TiB simulated card".into(),
        ));
    }
    Ok((
        report.peak_reserved_bytes,
        report.peak_live_bytes,
        report.driver_mallocs,
    ))
}

/// Where a prefill of `n_prompt` tokens with `cfg` runs out of memory when its pool has
/// `target.free_bytes` of the device to itself: the tokens processed before the allocation
/// that fails (as [`RunReport::oom_at_token`] says it), or `None` when the prefill completes.
/// Simulated to the end under the run's pool and purge policy, so exact on the simulated
/// device, and on a GPU as long as nothing else takes or returns device memory meanwhile.
pub fn project_oom(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<Option<usize>, RuntimeError> {
    Ok(dry_run(cfg, target, n_prompt, target.free_bytes, true)?.oom_at_token)
}

/// The worst pool peak any prompt up to the full context can reach: the larger of a prompt that
/// fills the context and one whose last, short ubatch takes the most scratch at the full KV
/// length (short ubatches split the KV range and take `dst_tmp`).
pub fn worst_case_pool_peak(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, RuntimeError> {
    let full = pool_peaks(cfg, target, cfg.n_ctx)?.0;
    let attn = cfg.model.attn();
    let n_kv = cupool_kernels::fa::n_kv(cfg.n_ctx, cfg.n_ctx);
    // The tail whose ubatch asks the most: cupool's scratch, or the engine profile's requests
    // (among the tails it models).
    let mut tails = Vec::with_capacity(cfg.n_ubatch);
    for t in 1..cfg.n_ubatch.min(cfg.n_ctx) {
        let bytes = match crate::profiled::layer_bytes(cfg, t, n_kv) {
            Ok(Some(b)) => b,
            Ok(None) => {
                cupool_kernels::fa::scratch(&attn, cfg.kv_type, t, n_kv, cfg.sms).total_bytes()
            }
            Err(_) => continue,
        };
        tails.push((bytes, t));
    }
    let tail = tails.into_iter().max().map(|(_, t)| t);
    let short = match tail {
        Some(t) if cfg.n_ctx > t => {
            let whole = (cfg.n_ctx - t) / cfg.n_ubatch * cfg.n_ubatch;
            pool_peaks(cfg, target, whole + t)?.0
        }
        _ => 0,
    };
    Ok(full.max(short))
}

fn total_for_ctx(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_ctx: usize,
) -> Result<usize, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    let (w, kv, compute) = c.startup_bytes(n_ctx);
    Ok(w + kv + compute + worst_case_pool_peak(&c, target)?)
}

/// Plans a prefill of `n_prompt` tokens with `cfg` on `target` (the pool figure is exactly what
/// that run reserves), and searches the largest context whose worst case fits.
pub fn plan(cfg: &RunConfig, target: &PlanTarget, n_prompt: usize) -> Result<Plan, RuntimeError> {
    cfg.validate()?;
    if n_prompt > cfg.n_ctx {
        return Err(RuntimeError::Invalid(format!(
            "a prompt of {n_prompt} tokens does not fit a context of {}: raise the context",
            cfg.n_ctx
        )));
    }
    let (weights_bytes, kv_bytes, compute_bytes) = cfg.startup_bytes(cfg.n_ctx);
    let (peak_reserved, peak_live, mallocs) = pool_peaks(cfg, target, n_prompt)?;
    let total_bytes = weights_bytes + kv_bytes + compute_bytes + peak_reserved;
    let fits = |c: usize| -> Result<bool, RuntimeError> {
        Ok(total_for_ctx(cfg, target, c)? <= target.free_bytes)
    };
    const STEP: usize = 256;
    const LIMIT: usize = crate::config::MAX_CTX;
    // The startup buffers alone bound the answer (no dry run needed to find that bound): when
    // the pool fits beside them there, that is the answer, found with one dry run.
    let static_fits = |c: usize| {
        let (w, kv, compute) = cfg.startup_bytes(c);
        w + kv + compute <= target.free_bytes
    };
    let (mut s_lo, mut s_hi) = (0, LIMIT / STEP + 1);
    while s_hi - s_lo > 1 {
        let mid = (s_lo + s_hi) / 2;
        if static_fits(mid * STEP) {
            s_lo = mid;
        } else {
            s_hi = mid;
        }
    }
    let bound = s_lo * STEP;
    let max_ctx_that_fits = if bound < STEP || !fits(STEP)? {
        None
    } else if fits(bound)? {
        Some(bound)
    } else {
        let mut lo = STEP;
        while lo * 2 <= bound && fits(lo * 2)? {
            lo *= 2;
        }
        let mut hi = (lo * 2).min(bound);
        // lo fits, hi does not (or is past the search limit).
        while hi - lo > STEP {
            let mid = (lo + hi) / 2 / STEP * STEP;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    };
    let static_total = weights_bytes + kv_bytes + compute_bytes;
    let oom_at_token = if total_bytes <= target.free_bytes {
        None
    } else if static_total > target.free_bytes {
        Some(0)
    } else {
        let room = PlanTarget {
            free_bytes: target.free_bytes - static_total,
            ..*target
        };
        project_oom(cfg, &room, n_prompt)?
    };
    Ok(Plan {
        n_prompt,
        oom_at_token,
        pool_peak_reserved_bytes: peak_reserved,
        pool_peak_live_bytes: peak_live,
        pool_driver_mallocs: mallocs,
        kv_bytes,
        compute_bytes,
        weights_bytes,
        total_bytes,
        device_bytes: target.free_bytes,
        fits: total_bytes <= target.free_bytes,
        max_ctx_that_fits,
    })
}

/// The plan a runtime in planned budget mode starts with: the pool's worst case over any
/// prompt up to the full context on `driver`, or an error naming the largest context that fits.
pub fn startup_plan(cfg: &RunConfig, driver: &dyn Driver) -> Result<Plan, RuntimeError> {
    let target = PlanTarget::of(driver)?;
    let mut p = plan(cfg, &target, cfg.n_ctx)?;
    // The budget must hold for any prompt, not just one that fills the context.
    p.pool_peak_reserved_bytes = worst_case_pool_peak(cfg, &target)?;
    p.total_bytes = p.weights_bytes + p.kv_bytes + p.compute_bytes + p.pool_peak_reserved_bytes;
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
    Ok(p)
}

#[cfg(test)]
mod fast_forward_tests {
    use super::*;
    use crate::engine_kind::EngineKind;
    use crate::model::ModelShape;
    use crate::policy::PurgePolicy;
    use cupool_pool::{PoolConfig, PoolKind};
    use cupool_profiles::{Profile, Weights};
    use proptest::prelude::*;

    fn shape(n_layer: usize) -> ModelShape {
        let mut m = ModelShape::preset("phi3-mini").unwrap();
        m.n_layer = n_layer;
        m
    }

    /// A fast-forwarded dry run reports what the full one does, on a card whose pool has
    /// `pool_mib` (unlimited when `None`).
    fn same_fast_and_full(
        cfg: &RunConfig,
        n_prompt: usize,
        pool_mib: Option<usize>,
    ) -> Result<(), TestCaseError> {
        let target = PlanTarget {
            free_bytes: 0,
            vmm: true,
            granularity: 2 << 20,
        };
        let bytes = pool_mib.map_or(MAX_CAPACITY, |m| m << 20);
        let full = dry_run(cfg, &target, n_prompt, bytes, false).unwrap();
        let fast = dry_run(cfg, &target, n_prompt, bytes, true).unwrap();
        prop_assert_eq!(fast.peak_reserved_bytes, full.peak_reserved_bytes);
        prop_assert_eq!(fast.peak_live_bytes, full.peak_live_bytes);
        prop_assert_eq!(fast.driver_mallocs, full.driver_mallocs);
        prop_assert_eq!(fast.driver_frees, full.driver_frees);
        prop_assert_eq!(fast.oom_at_token, full.oom_at_token);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Skipping what repeats changes nothing a plan reports: peaks, driver calls, where it
        /// runs out, for every pool kind and purge policy, card size and batch shape.
        #[test]
        fn fast_forward_reports_what_the_full_dry_run_does(
            kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm, PoolKind::Torch]),
            purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
            n_layer in 1usize..4,
            ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
            batch_mult in 1usize..4,
            n_prompt in 1usize..3000,
            pool_mib in prop::option::of(8usize..200),
        ) {
            let mut cfg = RunConfig::new(shape(n_layer), 4096);
            cfg.n_ubatch = ubatch;
            cfg.n_batch = ubatch * batch_mult;
            cfg.purge = purge;
            cfg.pool = PoolConfig::default().kind(kind);
            same_fast_and_full(&cfg, n_prompt, pool_mib)?;
        }

        /// The same with an engine profile's requests (every op of every layer, the last
        /// layer on its output rows only).
        #[test]
        fn fast_forward_holds_for_an_engine_profile(
            kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
            purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
            profile in prop::sample::select(Profile::ALL.to_vec()),
            model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
            weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
            n_layer in 1usize..6,
            ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
            batch_mult in 1usize..4,
            n_prompt in 1usize..3000,
            pool_mib in prop::option::of(8usize..400),
        ) {
            let mut m = ModelShape::preset(model).unwrap();
            m.n_layer = n_layer;
            let mut cfg = RunConfig::new(m, 4096);
            cfg.engine = EngineKind::Profile { profile, cc: 900 };
            // What a profile refuses (f16 experts, DeepSeek on mainline) is refused by both
            // runs alike: only the modelled cases compare.
            let refused = (model == "qwen3-30b-a3b" || model == "deepseek-v3") && weights == Weights::F16
                || model == "deepseek-v3" && profile != Profile::IkLlama;
            prop_assume!(!refused);
            cfg.weight_type = weights;
            cfg.n_ubatch = ubatch;
            cfg.n_batch = ubatch * batch_mult;
            cfg.purge = purge;
            cfg.pool = PoolConfig::default().kind(kind);
            same_fast_and_full(&cfg, n_prompt, pool_mib)?;
        }
    }
}
