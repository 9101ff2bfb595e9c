//! Replaying a trace through a pool on the simulated device: the peak reserve, the driver
//! traffic and the allocations that run out of memory on a card of given size.

use super::timeline::{note, Point, Reserved};
use super::{TraceError, TraceEvent as Op};
use crate::driver::sim::{SimConfig, SimDevice, MAX_CAPACITY};
use crate::driver::Driver;
use crate::{synchronize, AutoHeadroom, Block, Boundary, Pool, PoolConfig, PoolError, PurgePolicy};
use std::collections::HashMap;
use std::sync::Arc;

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplayReport {
    /// Pool kind.
    pub pool: String,
    /// Purge policy.
    pub purge: String,
    /// Events replayed.
    pub events: usize,
    /// Highest live bytes.
    pub peak_live_bytes: usize,
    /// Highest reserve, all streams' pools together.
    pub peak_reserved_bytes: usize,
    /// Reserve at the end.
    pub end_reserved_bytes: usize,
    /// Device and managed mallocs.
    pub driver_mallocs: u64,
    /// Device and managed frees.
    pub driver_frees: u64,
    /// VMM maps.
    pub driver_maps: u64,
    /// VMM unmaps.
    pub driver_unmaps: u64,
    /// VMM pages moved from holes to where a block landed (recycling).
    pub driver_remaps: u64,
    /// Synchronizes the pools asked for themselves.
    pub driver_syncs: u64,
    /// Allocations that ran out of memory.
    pub ooms: u64,
    /// Bytes returned to the driver at each prefill boundary, in order (0 where nothing went
    /// back): the decisions a recorded run's rows can be compared with.
    #[serde(skip)]
    pub boundary_releases: Vec<usize>,
    /// The event (1-based) of the first allocation that ran out of memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_oom_event: Option<usize>,
    /// The most device memory the pools' allocations held at once on the simulated card, each
    /// in its whole pages ([`Card::malloc_page`]): what the device loses to them (`None` on a
    /// driver the replay does not own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_device_bytes: Option<usize>,
    /// Live and reserved bytes after each event that changed either: the timeline to plot.
    #[serde(skip)]
    pub timeline: Vec<Point>,
}

/// For each stream, the allocations of the phase after `from` that are live together at its
/// start (until the first free after the stream's first allocation): the requests a purge
/// should keep buffers for. One pass over that phase for all streams, so replays stay linear.
fn next_requests(ops: &[Op], from: usize) -> HashMap<u64, Vec<usize>> {
    let mut out: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut done: std::collections::HashSet<u64> = Default::default();
    // Streams with requests and no free since: a free closes all of them.
    let mut open: Vec<u64> = Vec::new();
    let mut started = false;
    for op in &ops[from..] {
        match op {
            Op::PhaseBegin { .. } => started = true,
            Op::Alloc { size, stream, .. } if started && !done.contains(stream) => {
                let v = out.entry(*stream).or_default();
                if v.is_empty() {
                    open.push(*stream);
                }
                v.push(*size);
            }
            Op::Free { .. } if started => done.extend(open.drain(..)),
            // The phase ended, or another ended before one began: nothing further belongs to it.
            Op::PhaseEnd { .. } => break,
            _ => {}
        }
    }
    out
}

/// A prefill boundary at event `at`: each stream's pool does what [`Boundary::decide`] says.
/// The run's recorded keep lists (`recorded`, by stream), if it recorded any, stand for its
/// decisions: a list means the device was short and names what stayed, `None` or no entry
/// that everything stayed. A trace without them is purged as a short device would be, keeping
/// what the next phase asks for first. Returns the bytes each purged stream released.
fn boundary(
    ops: &[Op],
    at: usize,
    purge: PurgePolicy,
    recorded: HashMap<u64, Option<Vec<usize>>>,
    pools: &HashMap<u64, Arc<dyn Pool>>,
    driver: &dyn Driver,
) -> Result<Vec<(u64, usize)>, TraceError> {
    let mut expected =
        (purge == PurgePolicy::Auto && recorded.is_empty()).then(|| next_requests(ops, at + 1));
    let mut plan = Vec::new();
    for (&stream, p) in pools {
        let (headroom, reuse) = match (&mut expected, recorded.get(&stream)) {
            (Some(next), _) => (
                AutoHeadroom::Infinite,
                next.remove(&stream).unwrap_or_default(),
            ),
            (None, Some(Some(sizes))) => (AutoHeadroom::Infinite, sizes.clone()),
            (None, _) => (AutoHeadroom::Bytes(0), Vec::new()),
        };
        // The replay's device has no say: the headroom above carries the run's decision.
        let decision = Boundary::new(purge, headroom).decide(
            p.as_ref(),
            0,
            || Ok::<_, TraceError>(0),
            || Ok(reuse),
        )?;
        if let Some(what) = decision.purge() {
            plan.push((stream, p, what));
        }
    }
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let token = synchronize(driver).map_err(PoolError::from)?;
    plan.into_iter()
        .map(|(stream, p, what)| Ok((stream, p.purge(&token, what)?.bytes)))
        .collect()
}

/// The simulated card a replay runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Card {
    /// Bytes the pools may take together (`None`: they never run out).
    pub bytes: Option<usize>,
    /// What each device allocation takes of them: its size rounded up to this (a GPU's
    /// `cudaMalloc` takes whole 2 MiB pages), or exactly its size (0).
    pub malloc_page: usize,
    /// Whether the replay ends at the first allocation that fails, as an engine that aborts
    /// there (ggml) ends: every figure is then the run's until it died. Else the replay counts
    /// the failures and goes on.
    pub stop_at_first_oom: bool,
}

impl Card {
    /// A card of `bytes` (unlimited when `None`) whose allocations take exactly their size,
    /// and a replay that goes on past failures.
    pub fn of(bytes: Option<usize>) -> Self {
        Self {
            bytes,
            malloc_page: 0,
            stop_at_first_oom: false,
        }
    }
}

/// Replays `ops` through pools that `config` builds (one per stream) on a simulated card of `vram` bytes
/// (unlimited when `None`), purging at prefill phase ends by `purge`. Allocations that run out
/// of memory are counted, not fatal.
pub fn replay(
    ops: &[Op],
    config: &PoolConfig,
    purge: PurgePolicy,
    vram: Option<usize>,
) -> Result<ReplayReport, TraceError> {
    replay_on_card(ops, config, purge, Card::of(vram))
}

/// [`replay`] on `card`: where it is a GPU's room (the pages its allocations take counted), an
/// allocation fails where it would on that GPU.
pub fn replay_on_card(
    ops: &[Op],
    config: &PoolConfig,
    purge: PurgePolicy,
    card: Card,
) -> Result<ReplayReport, TraceError> {
    let mut sim = SimConfig::gib(0.0)
        .backed(false)
        .record_calls(false)
        .malloc_page(card.malloc_page);
    sim.capacity = card.bytes.map_or(MAX_CAPACITY, |v| v.min(MAX_CAPACITY));
    let sim = Arc::new(SimDevice::new(sim).map_err(PoolError::from)?);
    let driver: Arc<dyn Driver> = sim.clone();
    let mut r = replay_until(driver, ops, config, purge, card.stop_at_first_oom)?;
    r.peak_device_bytes = Some(sim.device_peak());
    Ok(r)
}

/// Replays `ops` as [`replay`] does, on `driver`: a GPU's, to measure what the pool's driver
/// calls cost there (wrap it in [`crate::driver::timed::TimedDriver`]). The blocks are never
/// touched, so no kernel runs.
pub fn replay_on(
    driver: Arc<dyn Driver>,
    ops: &[Op],
    config: &PoolConfig,
    purge: PurgePolicy,
) -> Result<ReplayReport, TraceError> {
    replay_until(driver, ops, config, purge, false)
}

/// [`replay_on`], ending at the first allocation that fails where `stop_at_first_oom`.
fn replay_until(
    driver: Arc<dyn Driver>,
    ops: &[Op],
    config: &PoolConfig,
    purge: PurgePolicy,
    stop_at_first_oom: bool,
) -> Result<ReplayReport, TraceError> {
    let kind = config.resolve(true)?;
    let mut pools: HashMap<u64, Arc<dyn Pool>> = HashMap::new();
    let mut live: HashMap<u64, (u64, Block)> = HashMap::new();
    let mut failed: std::collections::HashSet<u64> = Default::default();
    let mut r = ReplayReport {
        pool: kind.name().into(),
        purge: purge.name().into(),
        events: ops.len(),
        ..Default::default()
    };
    let mut live_bytes = 0usize;
    let mut reserved = Reserved::default();
    let mut ooms = 0u64;
    // The keep lists recorded for the open phase, by stream (`None`: the run kept everything).
    let mut kept: HashMap<u64, Option<Vec<usize>>> = HashMap::new();
    let inconsistent = |i: usize, message: String| TraceError::Inconsistent {
        event: i + 1,
        message,
    };
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc {
                id, size, stream, ..
            } => {
                if live.contains_key(id) {
                    return Err(inconsistent(
                        i,
                        format!("alloc of id {id}, which is already live"),
                    ));
                }
                let pool = match pools.get(stream) {
                    Some(p) => p.clone(),
                    None => {
                        let mut p = config.build(driver.clone())?;
                        // libcupool purges and retries a failed allocation under a purge policy.
                        if purge != PurgePolicy::Never {
                            p = Arc::new(crate::adaptors::PurgeRetry::new(p));
                        }
                        pools.insert(*stream, p.clone());
                        p
                    }
                };
                match pool.alloc(*size) {
                    Ok(b) => {
                        live_bytes += b.size();
                        live.insert(*id, (*stream, b));
                        reserved.update(*stream, pool.reserved_bytes());
                    }
                    Err(PoolError::OutOfMemory(_)) => {
                        ooms += 1;
                        r.first_oom_event.get_or_insert(i + 1);
                        failed.insert(*id);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Op::Free { id } => match live.remove(id) {
                Some((stream, b)) => {
                    live_bytes -= b.size();
                    let p = &pools[&stream];
                    p.free(b).map_err(|e| e.error)?;
                    reserved.update(stream, p.reserved_bytes());
                }
                None if failed.remove(id) => {}
                None => {
                    return Err(inconsistent(
                        i,
                        format!("free of id {id}, which is not live"),
                    ))
                }
            },
            Op::Keep { stream, sizes } => {
                kept.insert(*stream, sizes.clone());
            }
            Op::PhaseEnd { prefill: true, .. } => {
                let released = boundary(
                    ops,
                    i,
                    purge,
                    std::mem::take(&mut kept),
                    &pools,
                    driver.as_ref(),
                )?;
                for &(stream, _) in &released {
                    reserved.update(stream, pools[&stream].reserved_bytes());
                }
                r.boundary_releases
                    .push(released.iter().map(|&(_, b)| b).sum());
            }
            Op::PhaseBegin { .. } | Op::PhaseEnd { .. } | Op::Sync => {}
        }
        r.peak_reserved_bytes = r.peak_reserved_bytes.max(reserved.total);
        r.peak_live_bytes = r.peak_live_bytes.max(live_bytes);
        let (live, reserved) = (live_bytes, reserved.total);
        note(
            &mut r.timeline,
            Point {
                event: i + 1,
                live,
                reserved,
            },
        );
        if stop_at_first_oom && ooms > 0 {
            break;
        }
    }
    r.end_reserved_bytes = pools.values().map(|p| p.reserved_bytes()).sum();
    for p in pools.values() {
        let c = p.stats().calls;
        r.driver_mallocs += c.mallocs + c.managed_mallocs;
        r.driver_frees += c.frees + c.managed_frees;
        r.driver_maps += c.maps;
        r.driver_unmaps += c.unmaps;
        (r.driver_remaps, r.driver_syncs) = (r.driver_remaps + c.remaps, r.driver_syncs + c.syncs);
    }
    r.ooms = ooms;
    for (_, (stream, b)) in live.drain() {
        if let Err(e) = pools[&stream].free(b) {
            tracing::error!(error = %e, "freeing a block at the end of a replay failed");
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests;
