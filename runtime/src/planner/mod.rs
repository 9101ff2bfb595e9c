//! Predicting the memory of a run before it starts, from the free device memory a user sees
//! before the engine starts.
//!
//! What lies outside the engine's buffers and pool (the CUDA context, cuBLAS's workspace,
//! kernel modules, a start-up hold: [`outside`]) is taken from the free memory first; the
//! start-up buffers (weights, KV cache, compute buffer) are computed from the shape; the pool
//! gets the rest, and a dry run of the whole prefill with the dry-run executor, under the run's
//! pool and purge policy, on a simulated card of exactly that room, says whether the run
//! completes, where it dies if not, and what the pool reserves (to the byte on the simulated
//! device). A purge policy that reads the device's free memory (`auto`) sees what it would see.
//! Planning builds no runtime and allocates no start-up memory.

mod advice;
mod ahead;
mod dry;
#[cfg(test)]
mod dry_runs_tests;
#[cfg(test)]
mod fast_forward_tests;
mod narrow;
pub mod outside;
mod probe;
mod scout;
#[cfg(test)]
mod scout_tests;
mod search;
mod spare;
mod tail;
#[cfg(test)]
mod test_setup;
mod trajectory;
mod walk;
pub mod weights;

pub use advice::{advise, Advice};
pub use ahead::plan_and_advise;
pub use outside::Outside;
pub use probe::worst_case_pool_peak;
/// Contexts are searched in multiples of this many tokens ([`probe::STEP`]).
use probe::STEP;
pub use search::max_ctx_that_fits;

pub(crate) use dry::dry_device;
use dry::dry_run;

use crate::config::RunConfig;
use crate::error::RuntimeError;
use cupool_pool::driver::sim::MAX_CAPACITY;
use cupool_pool::driver::Driver;

/// The device a plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanTarget {
    /// Bytes free before the engine starts (`nvidia-smi`'s free memory).
    pub free_bytes: usize,
    /// Whether it supports VMM.
    pub vmm: bool,
    /// Its VMM granularity (2 MiB when unknown).
    pub granularity: usize,
    /// The pages its device allocations take ([`Driver::malloc_page`]; [`GPU_MALLOC_PAGE`] for
    /// a GPU, 0: exactly their size).
    pub malloc_page: usize,
    /// What the engine takes outside its buffers and pool.
    pub outside: Outside,
}

/// The pages a `cudaMalloc` takes from an H100 or H200: each of the pool's device allocations
/// costs its size rounded up to 2 MiB (measured under mainline llama.cpp's legacy pool,
/// `data/h100-2026-11-25-mainline-oom`: 14–47 MiB per run beyond the bytes asked for, every drop
/// in free memory a whole number of pages; counting them put the plan's out-of-memory token on
/// the engine's in every recorded case).
pub const GPU_MALLOC_PAGE: usize = 2 << 20;

impl PlanTarget {
    /// Reads `driver`'s free memory, VMM support and granularity; nothing outside (the process
    /// already holds its context).
    pub fn of(driver: &dyn Driver) -> Result<Self, RuntimeError> {
        let vmm = driver.vmm_supported();
        let granularity = if vmm { driver.granularity()? } else { 2 << 20 };
        Ok(Self {
            free_bytes: driver.mem_info()?.free,
            vmm,
            granularity,
            malloc_page: driver.malloc_page(),
            outside: Outside::NONE,
        })
    }
}

/// How a run that does not fit stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Its context is not created: the start-up buffers, the CUDA context and the start-up
    /// hold do not fit.
    StartUp,
    /// It dies at its first compute: the buffers fit, what the compute loads does not.
    FirstCompute,
    /// It dies in the prefill, in its pool.
    Prefill,
}

/// A prediction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Prompt tokens planned for.
    pub n_prompt: usize,
    /// Peak pool reserve over the prefill on the device's room (until it dies, if it does).
    pub pool_peak_reserved_bytes: usize,
    /// Peak pool live bytes over the same run.
    pub pool_peak_live_bytes: usize,
    /// Driver allocations the pool makes.
    pub pool_driver_mallocs: u64,
    /// KV cache.
    pub kv_bytes: usize,
    /// Compute buffer.
    pub compute_bytes: usize,
    /// Resident weights.
    pub weights_bytes: usize,
    /// What lies outside the buffers and pool.
    pub outside: Outside,
    /// Everything from the first compute on: buffers, outside terms, pool peak, each device
    /// allocation in the driver's whole pages (what the device loses to it).
    pub total_bytes: usize,
    /// The peak device memory the engine takes (at start-up, with the hold, or in the prefill),
    /// in whole pages as [`Plan::total_bytes`].
    pub peak_device_bytes: usize,
    /// What [`Plan::total_bytes`] holds beyond the buffers' and the pool's bytes: the buffers'
    /// whole driver pages, and the pool's pages at their peak less its peak reserve (the two
    /// peaks may fall at different moments: at least the pool's rounding at its peak).
    pub page_rounding_bytes: usize,
    /// Free before the engine starts.
    pub device_bytes: usize,
    /// Whether the run completes.
    pub fits: bool,
    /// How it stops when it does not.
    pub stop: Option<Stop>,
    /// The largest context (prompt filling it) that fits, in multiples of 256; `None` if none.
    pub max_ctx_that_fits: Option<usize>,
    /// When it does not fit: the tokens a run processes before it runs out of memory (0 when it
    /// stops at start-up or at its first compute), simulated under the pool and purge policy.
    pub oom_at_token: Option<usize>,
}

/// The pool's peaks over a prefill of `n_prompt` tokens on a card it never fills, by dry run.
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

/// The room `cfg`'s pool has from `target`'s free memory: what the start-up buffers (for the
/// whole context) and what lies outside them leave; or how the run stops before its pool asks
/// for anything.
pub fn pool_room(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, Stop> {
    room_beside(target, cfg.startup_bytes(cfg.n_ctx))
}

/// [`pool_room`] beside start-up buffers of `(weights, kv, compute)` bytes: the search for the
/// largest context also asks it of a bound of the compute buffer.
pub(crate) fn room_beside(
    target: &PlanTarget,
    (w, kv, compute): (usize, usize, usize),
) -> Result<usize, Stop> {
    let buffers = startup_pages(target, (w, kv, compute));
    let o = &target.outside;
    let free = usable(target);
    if buffers + o.at_startup() > free {
        return Err(Stop::StartUp);
    }
    o.room(free, buffers).ok_or(Stop::FirstCompute)
}

/// The start-up buffers' device memory: each is a device allocation of its own, whole pages.
fn startup_pages(target: &PlanTarget, (w, kv, compute): (usize, usize, usize)) -> usize {
    let page = |b: usize| cupool_pool::driver::in_pages(b, target.malloc_page);
    page(w) + page(kv) + page(compute)
}

/// What of `target`'s free memory allocations can take: all but its last page. The driver
/// refuses an allocation that would leave less than a page free: on an H100 a `cudaMalloc` of
/// 300.75 MiB takes 302 MiB and failed with 302.19 MiB free, succeeded with 304.19; one of
/// 1 MiB takes 2 and needed 4.19 (`data/h100-2026-11-27-malloc-pages`, `scripts/llama/malloc_pages.cu`).
/// That page is why mainline failed at start-up at the largest context a plan without it named
/// (4 GiB free: its compute buffer refused with 302.6 MiB free).
fn usable(target: &PlanTarget) -> usize {
    target.free_bytes.saturating_sub(target.malloc_page)
}

/// One run simulated from the free memory: how it stops, if it does, and its pool's figures.
pub(crate) struct Simulated {
    pub stop: Option<Stop>,
    pub oom_at_token: Option<usize>,
    pub peak_reserved: usize,
    pub peak_live: usize,
    pub mallocs: u64,
    /// The most the pool's device allocations held at once, in the driver's whole pages.
    pub peak_held: usize,
    /// The pool's room (`None` where the run stopped before its pool asked for anything).
    pub room: Option<usize>,
}

/// A prefill of `n_prompt` tokens with `cfg` (its context included) from `target`'s free memory:
/// the context and hold beside the start-up buffers, then what the first compute loads, then
/// the pool in the room left.
pub(crate) fn simulate(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<Simulated, RuntimeError> {
    simulate_beside(cfg, target, n_prompt, cfg.startup_bytes(cfg.n_ctx))
}

/// [`simulate`] beside start-up buffers of `(weights, kv, compute)` bytes (those of `cfg`'s
/// context, or with a bound of its compute buffer).
pub(crate) fn simulate_beside(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
    buffers: (usize, usize, usize),
) -> Result<Simulated, RuntimeError> {
    let room = match room_beside(target, buffers) {
        Ok(r) => r,
        Err(stop) => {
            return Ok(Simulated {
                stop: Some(stop),
                oom_at_token: Some(0),
                peak_reserved: 0,
                peak_live: 0,
                mallocs: 0,
                peak_held: 0,
                room: None,
            })
        }
    };
    let (r, peak_held) = dry::dry_run_held(cfg, target, n_prompt, room, true)?;
    Ok(Simulated {
        stop: r.oom_at_token.map(|_| Stop::Prefill),
        oom_at_token: r.oom_at_token,
        peak_reserved: r.peak_reserved_bytes,
        peak_live: r.peak_live_bytes,
        mallocs: r.driver_mallocs,
        peak_held,
        room: Some(room),
    })
}

/// Plans a prefill of `n_prompt` tokens with `cfg` on `target` (the pool figure is exactly what
/// that run reserves), and searches the largest context that fits.
pub fn plan(cfg: &RunConfig, target: &PlanTarget, n_prompt: usize) -> Result<Plan, RuntimeError> {
    let mut p = plan_only(cfg, target, n_prompt)?;
    p.max_ctx_that_fits = search::max_ctx_that_fits(cfg, target)?;
    Ok(p)
}

/// [`plan`] without the search for the largest context (`max_ctx_that_fits` is `None`).
pub fn plan_only(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<Plan, RuntimeError> {
    cfg.validate()?;
    if n_prompt > cfg.n_ctx {
        return Err(RuntimeError::Invalid(format!(
            "a prompt of {n_prompt} tokens does not fit a context of {}: raise the context",
            cfg.n_ctx
        )));
    }
    let (weights_bytes, kv_bytes, compute_bytes) = cfg.startup_bytes(cfg.n_ctx);
    // What the device loses to them: each buffer and each of the pool's allocations takes
    // whole pages, as the dry run counts them.
    let buffers = startup_pages(target, (weights_bytes, kv_bytes, compute_bytes));
    let rounding = buffers - (weights_bytes + kv_bytes + compute_bytes);
    let s = simulate(cfg, target, n_prompt)?;
    let o = target.outside;
    let total_bytes = buffers + o.held_beside(s.peak_held, s.room) + s.peak_held;
    Ok(Plan {
        n_prompt,
        oom_at_token: s.oom_at_token,
        pool_peak_reserved_bytes: s.peak_reserved,
        pool_peak_live_bytes: s.peak_live,
        pool_driver_mallocs: s.mallocs,
        kv_bytes,
        compute_bytes,
        weights_bytes,
        outside: o,
        total_bytes,
        peak_device_bytes: total_bytes.max(buffers + o.at_startup()),
        page_rounding_bytes: rounding + s.peak_held.saturating_sub(s.peak_reserved),
        device_bytes: target.free_bytes,
        fits: s.stop.is_none(),
        stop: s.stop,
        max_ctx_that_fits: None,
    })
}

/// The plan a runtime in planned budget mode starts with: the pool's worst case over any
/// prompt up to the full context on `driver`, or an error naming the largest context that fits.
pub fn startup_plan(cfg: &RunConfig, driver: &dyn Driver) -> Result<Plan, RuntimeError> {
    let target = PlanTarget::of(driver)?;
    let mut p = plan(cfg, &target, cfg.n_ctx)?;
    // The budget must hold for any prompt, not just one that fills the context: the worst
    // case on a card the pool never fills.
    p.pool_peak_reserved_bytes = worst_case_pool_peak(cfg, &target)?;
    // (bytes, not pages: the budget a runtime checks its own buffers and pool against)
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
