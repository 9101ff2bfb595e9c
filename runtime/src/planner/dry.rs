//! A dry run: the engine with the dry-run executor on a simulated card of a given room, which
//! computes nothing and touches no memory, so the pool's requests, peaks and failure are the
//! run's own.

use super::PlanTarget;
use crate::config::{RunConfig, MAX_CTX};
use crate::counting_driver::{Counter, CountingDriver};
use crate::engine::{Engine, Watch};
use crate::error::RuntimeError;
use crate::executor::dry_run::DryRun;
use crate::executor::DeviceBuffers;
use crate::fast_forward::FastForward;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use crate::policy::BudgetMode;
use crate::report::RunReport;
use cupool_pool::driver::sim::{SimConfig, SimDevice, MAX_CAPACITY};
use cupool_pool::driver::Driver;
use cupool_pool::upstream::vmm::Ahead;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// A dry run of a prefill of `n_prompt` tokens with `cfg`'s pool and purge policy on a
/// simulated card whose pool has `pool_bytes` to itself (the startup buffers take none of it).
/// `fast` skips the layers and ubatches that repeat one before them exactly (the engine's
/// fast-forward, told by a [`CountingDriver`] whether a step called the driver) and keeps no
/// rows: the same peaks, driver calls and failure, in a fraction of the time.
pub(super) fn dry_run(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    pool_bytes: usize,
    fast: bool,
) -> Result<RunReport, RuntimeError> {
    Ok(watched(cfg, target, n_prompt, pool_bytes, fast, None)?.0)
}

/// [`dry_run`], and the most memory the pool's device allocations held at once in the driver's
/// whole pages (a `cudaMalloc` takes whole 2 MiB pages: what the device loses to the pool is
/// that, not the bytes it reserved). Skipped steps made no driver call, so a fast run's figure is
/// the full run's.
pub(super) fn dry_run_held(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    pool_bytes: usize,
    fast: bool,
) -> Result<(RunReport, usize), RuntimeError> {
    let (sim, counted) = dry_sim(target, pool_bytes)?;
    let report = watched_on(cfg, target, n_prompt, counted, fast, None)?.0;
    Ok((report, sim.device_peak()))
}

/// [`dry_run`], with `watch` called after each ubatch's layers ([`Watch`]): the report, and
/// whether the watch ended the run.
pub(super) fn watched(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    pool_bytes: usize,
    fast: bool,
    watch: Option<Watch>,
) -> Result<(RunReport, bool), RuntimeError> {
    watched_on(
        cfg,
        target,
        n_prompt,
        dry_device(target, pool_bytes)?,
        fast,
        watch,
    )
}

/// [`watched`] on the dry run's driver `counted`.
fn watched_on(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    counted: Arc<CountingDriver>,
    fast: bool,
    watch: Option<Watch>,
) -> Result<(RunReport, bool), RuntimeError> {
    let c = dry_config(cfg, target)?;
    let driver: Arc<dyn Driver> = counted.clone();
    let bufs = dry_buffers(&c);
    let tokens = dry_prompt(n_prompt);
    // A simulation's out-of-memory is its result, not news: its pool and engine log nothing.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        let ff = FastForward::new(fast.then_some(counted));
        let mut engine = Engine::new(driver, c, Box::new(DryRun), bufs, usize::MAX, ff)?;
        engine.watch = watch;
        let report = engine.decode(&tokens)?;
        Ok((report, engine.watched))
    })
}

/// Dry runs of prompts of each of `lens` tokens with `cfg`'s pool and purge policy, as
/// [`dry_run`] (fast) each, on one engine: the ubatches they share run once
/// (`Engine::decode_prompts`). The pool must keep snapshots ([`keeps_snapshots`]).
pub(super) fn dry_runs(
    cfg: &RunConfig,
    target: &PlanTarget,
    lens: &[usize],
    pool_bytes: usize,
) -> Result<Vec<RunReport>, RuntimeError> {
    let longest = lens.iter().copied().max().unwrap_or(0);
    let tokens = dry_prompt(longest);
    quiet(|| {
        let (mut engine, sim) = dry_engine(cfg, target, pool_bytes)?;
        engine.decode_prompts(&tokens, lens, &sim)
    })
}

/// A fresh fast dry run's engine of `cfg` on a simulated card of `pool_bytes` for its pool,
/// and the card (for its snapshots). To be used in [`quiet`].
pub(super) fn dry_engine(
    cfg: &RunConfig,
    target: &PlanTarget,
    pool_bytes: usize,
) -> Result<(Engine, Arc<SimDevice>), RuntimeError> {
    let c = dry_config(cfg, target)?;
    let (sim, counted) = dry_sim(target, pool_bytes)?;
    let driver: Arc<dyn Driver> = counted.clone();
    let ff = FastForward::new(Some(counted));
    let bufs = dry_buffers(&c);
    let engine = Engine::new(driver, c, Box::new(DryRun), bufs, usize::MAX, ff)?;
    Ok((engine, sim))
}

/// Runs `f` with no subscriber: a simulation's out-of-memory is its result, not news, so its
/// pool and engine log nothing.
pub(super) fn quiet<T>(f: impl FnOnce() -> T) -> T {
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), f)
}

/// Whether `cfg`'s pool keeps the snapshots [`dry_runs`] needs: the legacy and vmm pools
/// (whose growth a dry run makes inline: [`reproducible`]).
/// A managed-memory fallback around the pool (`GGML_CUDA_ALLOC_FALLBACK_MANAGED`) keeps none.
pub(super) fn keeps_snapshots(cfg: &RunConfig, target: &PlanTarget) -> bool {
    !cfg.pool.fallback_managed
        && matches!(
            cfg.pool.resolve(target.vmm),
            Ok(cupool_pool::PoolKind::Legacy | cupool_pool::PoolKind::Vmm)
        )
}

/// `cfg` as a dry run runs it: measuring, with no budget to warn about (and so projecting
/// nothing itself), no trace, its pool's kind resolved, [`reproducible`].
fn dry_config(cfg: &RunConfig, target: &PlanTarget) -> Result<RunConfig, RuntimeError> {
    // The batches the engine runs its context in, as the run does (`RunConfig::clamped_to`).
    let mut c = cfg.clamped_to(cfg.n_ctx).unwrap_or_else(|| cfg.clone());
    c.budget = BudgetMode::Ggml;
    c.margin_bytes = usize::MAX / 4;
    c.record_trace = false;
    c.pool.kind = Some(cfg.pool.resolve(target.vmm)?);
    // A VMM pool reserves the device's memory (`cuMemGetInfo`'s total) as address space: on
    // the GPU the card's, in any room. The simulated card's total is the pool's room; where
    // the search scouts, the free memory before the engine starts (at most the card's) sizes
    // it instead, so that a run in one room goes on from another's checkpoint as it would.
    if c.pool.vmm.reserve_bytes.is_none() && scouts(&c) {
        c.pool.vmm.reserve_bytes = Some(target.free_bytes.clamp(1, MAX_CAPACITY));
    }
    reproducible(&mut c);
    Ok(c)
}

/// Whether a search of `cfg` scouts (`scout.rs`): not where the fast-forward's skips decide
/// a run's figures (a VMM pool recycling pages, size classes chosen for the run), since the
/// checkpoints split the run where a dry run from the start does not. Checked against dry
/// runs from the start by `scout_tests.rs` wherever it scouts.
pub(super) fn scouts(cfg: &RunConfig) -> bool {
    !cfg.pool.vmm.recycle && cfg.pool.size_classes.is_empty()
}

/// A dry run's start-up buffers: it touches no memory, so they need no addresses.
fn dry_buffers(c: &RunConfig) -> DeviceBuffers {
    let m = &c.model;
    DeviceBuffers {
        weights: 0,
        kv: 0,
        compute: 0,
        wl: WeightLayout::new(m, c.weight_type),
        kvl: KvLayout::new(m, c.kv_type, c.n_ctx),
        cl: ComputeLayout::new(m, c.n_ubatch),
    }
}

/// The simulated card of a dry run: `target`'s kind, `pool_bytes` of it for the pool. Its
/// allocations take whole pages, as on the target; counted, since the fast-forward reads from
/// it whether a step called the driver.
pub(crate) fn dry_device(
    target: &PlanTarget,
    pool_bytes: usize,
) -> Result<Arc<CountingDriver>, RuntimeError> {
    Ok(dry_sim(target, pool_bytes)?.1)
}

/// [`dry_device`], with the simulated device under it (for its snapshots).
fn dry_sim(
    target: &PlanTarget,
    pool_bytes: usize,
) -> Result<(Arc<SimDevice>, Arc<CountingDriver>), RuntimeError> {
    let mut sim = SimConfig::gib(0.0)
        .vmm(target.vmm)
        .granularity(target.granularity)
        .malloc_page(target.malloc_page)
        .backed(false)
        .record_calls(false);
    sim.capacity = pool_bytes.min(MAX_CAPACITY);
    let sim = Arc::new(SimDevice::new(sim).map_err(cupool_pool::PoolError::from)?);
    let counted = Arc::new(CountingDriver::new(sim.clone(), Counter::default()));
    Ok((sim, counted))
}

/// A dry run's prompt of `n` tokens. The dry-run executor reads no token: only the prompt's
/// length shapes the run, so every dry run slices one buffer of zeros as long as the longest
/// context, allocated once and never written (computing the ids, or zeroing a buffer per run,
/// took a tenth of a long dry run).
pub(super) fn dry_prompt(n: usize) -> Cow<'static, [i32]> {
    static ZEROS: OnceLock<Box<[i32]>> = OnceLock::new();
    match ZEROS
        .get_or_init(|| vec![0; MAX_CTX].into_boxed_slice())
        .get(..n)
    {
        Some(t) => Cow::Borrowed(t),
        None => Cow::Owned(vec![0; n]),
    }
}

/// Makes `cfg`'s pool decide as it would with every page made at once: a worker thread making
/// memory ahead of need (`CUPOOL_VMM_AHEAD=worker`) finishes its pages when the thread runs, so
/// a dry run's placements, and the planner's answers, would depend on timing (the same plan
/// answered 28,672 and 29,184 positions in turn). `inline` makes the same memory at once.
pub(crate) fn reproducible(cfg: &mut RunConfig) {
    if cfg.pool.vmm.ahead == Ahead::Worker {
        cfg.pool.vmm.ahead = Ahead::Inline;
    }
}

/// `cfg` as [`reproducible`] makes it, cloned into `owned` only where it changes.
pub(crate) fn reproducible_ref<'a>(
    cfg: &'a RunConfig,
    owned: &'a mut Option<RunConfig>,
) -> &'a RunConfig {
    if cfg.pool.vmm.ahead != Ahead::Worker {
        return cfg;
    }
    let mut c = cfg.clone();
    reproducible(&mut c);
    owned.insert(c)
}
