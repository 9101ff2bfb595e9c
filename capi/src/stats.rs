//! Statistics as JSON, with the keys of `torch.cuda.memory_stats()` where they mean the same.
//!
//! Per device, over its stream pools. Peaks are each stream's own, added up: exact with one
//! stream, an upper bound with several; a stream's live peak is its threads' own peaks added
//! up (`usage.rs`), exact with one thread, an upper bound with several. As in PyTorch, they restart
//! only when the user asks (`cupool_reset_peaks`), not at an ubatch boundary. With
//! `CUPOOL_TIME_DRIVER`, the driver calls of the devices asked about and the time they took.

use crate::state::StreamPool;
use cupool_pool::driver::timed::{CallTime, TimedDriver};
use cupool_pool::{Pool, PoolStats};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

pub(crate) fn json(pools: &[Arc<StreamPool>], timers: &[&Arc<TimedDriver>]) -> String {
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
        put(
            "cupool.driver_ns",
            calls.values().map(|c| c.nanos).fold(0, u64::saturating_add),
        );
        for (name, c) in &calls {
            put(&format!("cupool.driver_calls.{name}"), c.calls);
            put(&format!("cupool.driver_ns.{name}"), c.nanos);
        }
    }
    out.push('}');
    out
}
