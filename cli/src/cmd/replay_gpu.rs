//! `repro-prefill replay --device cuda`: the trace's allocations and frees through a pool on
//! GPU 0, every driver call timed. No kernel runs and no block is touched, so what it measures
//! is the pool's own cost: the host time a run with the same allocation stream spends in the
//! allocator (creating, moving and releasing memory, synchronizing).

use cupool::pool::driver::cuda::CudaDriver;
use cupool::pool::driver::limit::LimitedDriver;
use cupool::pool::driver::timed::{CallTime, TimedDriver};
use cupool::pool::driver::Driver;
use cupool::pool::{PoolConfig, PurgePolicy};
use cupool::trace::{self, ReplayReport, TraceEvent};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a replay on a GPU measured besides the pool's report.
#[derive(Debug, serde::Serialize)]
pub struct GpuTiming {
    /// The GPU.
    pub device: String,
    /// Wall time of the whole replay, in seconds.
    pub wall_s: f64,
    /// Time inside driver calls, in seconds.
    pub driver_s: f64,
    /// Calls and nanoseconds per driver primitive.
    pub calls: BTreeMap<&'static str, CallTime>,
}

/// Replays `ops` on GPU 0 (limited to `vram` bytes if given); the report and the timing, or
/// why it could not.
pub fn replay(
    ops: &[TraceEvent],
    config: &PoolConfig,
    purge: PurgePolicy,
    vram: Option<usize>,
) -> Result<(ReplayReport, GpuTiming), String> {
    let gpu = CudaDriver::new(0).map_err(|e| format!("--device cuda: {e}"))?;
    let device = gpu.name();
    let mut base: Arc<dyn Driver> = Arc::new(gpu);
    if let Some(v) = vram {
        base = Arc::new(LimitedDriver::new(base, v));
    }
    let timed = Arc::new(TimedDriver::timed(base));
    let start = Instant::now();
    let report = trace::replay_on(timed.clone(), ops, config, purge).map_err(|e| e.to_string())?;
    let wall = start.elapsed();
    Ok((
        report,
        GpuTiming {
            device,
            wall_s: wall.as_secs_f64(),
            driver_s: timed.total().as_secs_f64(),
            calls: timed.times(),
        },
    ))
}

/// The timing as table lines: the wall time, then each primitive's calls and mean cost.
pub fn lines(t: &GpuTiming) -> Vec<String> {
    let mut out = vec![format!(
        "  on {}: {:.3} s, {:.3} s of it in driver calls",
        t.device, t.wall_s, t.driver_s
    )];
    for (name, c) in &t.calls {
        let total = Duration::from_nanos(c.nanos);
        out.push(format!(
            "    {name:<20} {:>8} calls {:>10.3} s {:>9.1} µs each",
            c.calls,
            total.as_secs_f64(),
            total.as_secs_f64() * 1e6 / c.calls.max(1) as f64
        ));
    }
    out
}
