//! Statistics as JSON, with the keys of `torch.cuda.memory_stats()` where they mean the same.
//!
//! Per device, over its stream pools. Peaks are each stream's own, added up: exact with one
//! stream, an upper bound with several; a stream's live peak is its threads' own peaks added
//! up (`usage.rs`), exact with one thread, an upper bound with several. As in PyTorch, they restart
//! only when the user asks (`cupool_reset_peaks`), not at an ubatch boundary. With
//! `CUPOOL_TIME_DRIVER`, the driver calls of the devices asked about and the time they took;
//! with `CUPOOL_VMM_DEFER`, how allocations waited for queued page moves.

use crate::state::StreamPool;
use cupool_pool::driver::deferred::DeferredDriver;
use cupool_pool::driver::timed::{CallTime, TimedDriver};
use cupool_pool::{Pool, PoolStats};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// The drivers of the devices asked about that report on themselves.
pub(crate) struct Drivers<'a> {
    /// `CUPOOL_TIME_DRIVER`'s timers.
    pub timers: Vec<&'a Arc<TimedDriver>>,
    /// `CUPOOL_VMM_DEFER`'s page-move workers.
    pub deferred: Vec<&'a Arc<DeferredDriver>>,
}

pub(crate) fn json(pools: &[Arc<StreamPool>], drivers: &Drivers) -> String {
    let timers = &drivers.timers;
    let mut t = PoolStats::default();
    let (mut live_peak, mut reserved_peak) = (0, 0);
    for p in pools {
        let s = p.pool.stats();
        live_peak += p.pool.live_peak().max(s.live_bytes);
        reserved_peak += p.peaks.reserved_peak(s.reserved_bytes);
        t.merge(&s);
    }
    let mut out = String::from("{");
    let mut put = |k: &str, v: u64| {
        let _ = write!(out, "{}\"{k}\":{v}", if out.len() > 1 { "," } else { "" });
    };
    put("allocated_bytes.all.current", t.live_bytes as u64);
    put("allocated_bytes.all.peak", live_peak as u64);
    put("reserved_bytes.all.current", t.reserved_bytes as u64);
    put("reserved_bytes.all.peak", reserved_peak as u64);
    put("active_bytes.all.current", t.live_bytes as u64);
    put("active_bytes.all.peak", live_peak as u64);
    put("active.all.current", t.live_blocks as u64);
    put("allocation.all.allocated", t.allocs);
    put("allocation.all.freed", t.frees);
    put("num_alloc_retries", t.retries);
    put("num_ooms", t.ooms);
    put("num_device_alloc", t.calls.acquisitions());
    put("num_device_free", t.calls.releases());
    put("cupool.pools", pools.len() as u64);
    put("cupool.cached_bytes.current", t.cached_bytes as u64);
    // Part of the cached bytes: what threads keep for their own reuse (bounded per thread).
    put(
        "cupool.thread_cached_bytes.current",
        t.thread_cached_bytes as u64,
    );
    put("cupool.fallbacks", t.fallbacks);
    put(
        "cupool.fallback_bytes.current",
        t.fallback_live_bytes as u64,
    );
    put("cupool.purges", t.purges);
    put("cupool.purged_bytes", t.purged_bytes as u64);
    put("cupool.asleep_bytes.current", t.asleep_bytes as u64);
    put("cupool.driver_allocations", t.calls.acquisitions());
    put("cupool.driver_releases", t.calls.releases());
    if !timers.is_empty() {
        let mut calls: BTreeMap<&str, CallTime> = BTreeMap::new();
        for t in timers {
            for (name, c) in t.times() {
                let e = calls.entry(name).or_default();
                e.calls += c.calls;
                e.nanos = e.nanos.saturating_add(c.nanos);
            }
        }
        // The time allocating threads spent in the driver: a worker's maps run beside them.
        put(
            "cupool.driver_ns",
            calls
                .iter()
                .filter(|(name, _)| **name != cupool_pool::driver::timed::AHEAD_MAP)
                .map(|(_, c)| c.nanos)
                .fold(0, u64::saturating_add),
        );
        for (name, c) in &calls {
            put(&format!("cupool.driver_calls.{name}"), c.calls);
            put(&format!("cupool.driver_ns.{name}"), c.nanos);
        }
    }
    if !drivers.deferred.is_empty() {
        // How the allocations that followed queued page moves waited for them.
        let sum = |f: &dyn Fn(&DeferredDriver) -> u64| -> u64 {
            drivers
                .deferred
                .iter()
                .map(|d| f(d))
                .fold(0, u64::saturating_add)
        };
        put("cupool.defer.stream_waits", sum(&|d| d.waits().0));
        put("cupool.defer.host_waits", sum(&|d| d.waits().1));
        put("cupool.defer.host_wait_ns", sum(&|d| d.host_wait_nanos()));
    }
    out.push('}');
    out
}
