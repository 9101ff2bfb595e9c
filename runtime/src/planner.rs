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
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::policy::BudgetMode;
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
}

/// The pool's peaks over a prefill of `n_prompt` tokens, by dry run.
fn pool_peaks(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<(usize, usize, u64), RuntimeError> {
    let mut c = cfg.clone();
    c.budget = BudgetMode::Ggml;
    // The dry run measures; it has no budget to warn about.
    c.margin_bytes = usize::MAX / 4;
    c.record_trace = false;
    c.pool.kind = Some(cfg.pool.resolve(target.vmm)?);
    let mut sim = SimConfig::gib(0.0)
        .vmm(target.vmm)
        .granularity(target.granularity)
        .backed(false)
        .record_calls(false);
    sim.capacity = MAX_CAPACITY;
    let driver: Arc<dyn Driver> =
        Arc::new(SimDevice::new(sim).map_err(cupool_pool::PoolError::from)?);
    let m = &c.model;
    // The dry run touches no memory: the startup buffers need no addresses.
    let bufs = DeviceBuffers {
        weights: 0,
        kv: 0,
        compute: 0,
        wl: WeightLayout::new(m),
        kvl: KvLayout::new(m, c.kv_type, c.n_ctx),
        cl: ComputeLayout::new(m, c.n_ubatch),
    };
    let tokens = c.prompt_tokens(n_prompt);
    let mut engine = Engine::new(driver, c, Box::new(DryRun), bufs, usize::MAX)?;
    let report = engine.decode(&tokens)?;
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

/// The worst pool peak any prompt up to the full context can reach: the larger of a prompt that
/// fills the context and one whose last, short ubatch takes the most scratch at the full KV
/// length (short ubatches split the KV range and take `dst_tmp`).
pub fn worst_case_pool_peak(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, RuntimeError> {
    let full = pool_peaks(cfg, target, cfg.n_ctx)?.0;
    let attn = cfg.model.attn();
    let n_kv = cupool_kernels::fa::n_kv(cfg.n_ctx, cfg.n_ctx);
    let tail = (1..cfg.n_ubatch.min(cfg.n_ctx)).max_by_key(|&t| {
        (
            cupool_kernels::fa::scratch(&attn, cfg.kv_type, t, n_kv, cfg.sms).total_bytes(),
            t,
        )
    });
    let short = match tail {
        Some(t) if cfg.n_ctx > t => {
            let whole = (cfg.n_ctx - t) / cfg.n_ubatch * cfg.n_ubatch;
            pool_peaks(cfg, target, whole + t)?.0
        }
        _ => 0,
    };
    Ok(full.max(short))
}

fn static_bytes(cfg: &RunConfig, n_ctx: usize) -> (usize, usize, usize) {
    let m = &cfg.model;
    let weights = cfg.weights_bytes.max(WeightLayout::new(m).bytes);
    (
        weights,
        KvLayout::new(m, cfg.kv_type, n_ctx).bytes,
        ComputeLayout::new(m, cfg.n_ubatch).bytes,
    )
}

fn total_for_ctx(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_ctx: usize,
) -> Result<usize, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    let (w, kv, compute) = static_bytes(&c, n_ctx);
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
    let (weights_bytes, kv_bytes, compute_bytes) = static_bytes(cfg, cfg.n_ctx);
    let (peak_reserved, peak_live, mallocs) = pool_peaks(cfg, target, n_prompt)?;
    let total_bytes = weights_bytes + kv_bytes + compute_bytes + peak_reserved;
    let fits = |c: usize| -> Result<bool, RuntimeError> {
        Ok(total_for_ctx(cfg, target, c)? <= target.free_bytes)
    };
    const STEP: usize = 256;
    const LIMIT: usize = crate::config::MAX_CTX;
    let max_ctx_that_fits = if !fits(STEP)? {
        None
    } else {
        let mut lo = STEP;
        while lo * 2 <= LIMIT && fits(lo * 2)? {
            lo *= 2;
        }
        let mut hi = (lo * 2).min(LIMIT + STEP);
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
    Ok(Plan {
        n_prompt,
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
