//! Each device's driver stack, built once when the library opens, from the device up: the
//! device (opened on first use), the worker that moves pages (`CUPOOL_VMM_DEFER`), the timer
//! (`CUPOOL_TIME_DRIVER`), the memory limit (`CUPOOL_LIMIT_MIB`) and, outermost, the tracking
//! of what the pools hold (`segments.rs`).

use crate::config::{Config, Devices};
use crate::segments::Tracked;
use crate::status::Failure;
use cupool_pool::driver::cuda::device_count;
use cupool_pool::driver::deferred::DeferredDriver;
use cupool_pool::driver::lazy::LazyDriver;
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::timed::TimedDriver;
use cupool_pool::driver::Driver;
use std::sync::Arc;

/// Each device's stack, as the library keeps it.
pub(crate) struct Stack {
    /// The outermost driver of each device.
    pub segments: Vec<Arc<Tracked>>,
    /// Each device's timer (empty without `CUPOOL_TIME_DRIVER`).
    pub timers: Vec<Arc<TimedDriver>>,
    /// Each device's page-move worker (empty without `CUPOOL_VMM_DEFER`).
    pub deferred: Vec<Arc<DeferredDriver>>,
}

/// The driver stack of every device `config` names.
pub(crate) fn stack(config: &Config) -> Result<Stack, Failure> {
    let sims = |gib: f64, count: usize| -> Result<Vec<Arc<dyn Driver>>, Failure> {
        (0..count)
            .map(|i| {
                let mut c = SimConfig::gib(gib).record_calls(false);
                c.ordinal = i;
                let d: Arc<dyn Driver> =
                    Arc::new(SimDevice::new(c).map_err(cupool_pool::PoolError::from)?);
                Ok(d)
            })
            .collect()
    };
    // Each device is opened (its CUDA context made) when a pool first needs it: a process
    // that sees several GPUs and uses one pays no context on the others.
    let cuda = || -> Result<Vec<Arc<dyn Driver>>, Failure> {
        Ok((0..device_count()?)
            .map(|i| Arc::new(LazyDriver::cuda(i)) as Arc<dyn Driver>)
            .collect())
    };
    let mut drivers = match config.devices {
        Devices::Cuda => cuda()?,
        Devices::Sim { gib, count } => sims(gib, count)?,
        Devices::Auto { gib, count } => match cuda() {
            Ok(d) if !d.is_empty() => d,
            _ => {
                tracing::info!("no CUDA device: cupool runs on simulated cards");
                sims(gib, count)?
            }
        },
    };
    // CUPOOL_VMM_DEFER: right above the device, so that every layer above sees its calls
    // return at once (the timer then measures what they cost the allocating thread).
    let deferred = if config.vmm_defer {
        layer(&mut drivers, DeferredDriver::new)
    } else {
        Vec::new()
    };
    // CUPOOL_TIME_DRIVER: right above the device (the lazy driver, whose opening, the CUDA
    // context's creation, the timer leaves out, or the page-move worker), so that it times the
    // device's calls alone, not the bookkeeping of the layers above, and every call any pool on
    // the device makes.
    let timers = if config.time_driver {
        layer(&mut drivers, TimedDriver::timed)
    } else {
        Vec::new()
    };
    // CUPOOL_LIMIT_MIB: each device's driver counts what its pools take and refuses beyond the
    // limit, so every stream's pool on that device shares one budget.
    if let Some(limit) = config.limit {
        layer(&mut drivers, |d| LimitedDriver::new(d, limit));
    }
    // Outermost: only what the device (and the limit) granted is a segment.
    let segments = drivers
        .into_iter()
        .enumerate()
        .map(|(i, d)| Arc::new(Tracked::new(d, i)))
        .collect();
    Ok(Stack {
        segments,
        timers,
        deferred,
    })
}

/// Puts a layer made by `make` on each of `drivers`, which are the layers from then on; the
/// layers, for the library to read them.
fn layer<T: Driver + 'static>(
    drivers: &mut Vec<Arc<dyn Driver>>,
    make: impl Fn(Arc<dyn Driver>) -> T,
) -> Vec<Arc<T>> {
    let layers: Vec<Arc<T>> = drivers.iter().map(|d| Arc::new(make(d.clone()))).collect();
    *drivers = layers
        .iter()
        .map(|l| l.clone() as Arc<dyn Driver>)
        .collect();
    layers
}
