//! The ubatch boundary of an inference engine: after each prefill ubatch the engine (llama.cpp
//! through its ggml shim) calls `cupool_ubatch_end`, and the pools apply `CUPOOL_PURGE`.
//!
//! `auto` cannot see the next ubatch, so it expects it to ask for what the one just ended held
//! at once: for each request size, the most blocks of that size live together since the last
//! boundary ([`Usage`]). Cached buffers that best fit would hand to those requests stay; the
//! rest (what a growing request outgrew) go back to the driver, after a synchronize taken only
//! when there is something to return.
//!
//! Returning costs the engine its pipelining (the synchronize drains the device while the next
//! ubatch's graph is built) and a driver malloc where a later request would have reused the
//! buffer (a whole prompt after another: llama-bench measured 5.8% on an H200 when every
//! boundary returned what it could). So `auto` returns only while the device is short: free
//! memory below [`Headroom`], by default twice what the ubatch just ended held at once — room
//! for the next ubatch to allocate all it needs anew, and as much again for what the engine
//! allocates outside the pool. Above it everything stays cached; a request that still finds the
//! device full is served by the trim-and-retry of `alloc_on`.
//!
//! The per-ubatch peaks are logged and reset, and a recording gets the phase boundary and the
//! keep lists (or that everything stayed), so its replay purges as the run did.

use crate::state::{self, StreamPool};
use crate::status::Failure;
use cupool_pool::{synchronize, Boundary, Pool, Purge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Boundaries so far, process-wide: they number the phases of a recording.
static UBATCHES: AtomicU64 = AtomicU64::new(0);

/// What the pools of one device did at a boundary, for the log.
#[derive(Debug, Default)]
struct DeviceBoundary {
    peak_reserved: usize,
    peak_live: usize,
    released: usize,
    synchronized: bool,
    /// `auto` only: the device was short of memory, so outgrown buffers went back.
    short: bool,
}

/// Ends a prefill ubatch on `device` (every device with pools when `None`); returns the bytes
/// returned to the driver.
pub(crate) fn ubatch_end(device: Option<usize>) -> Result<usize, Failure> {
    let lib = state::lib()?;
    let ubatch = UBATCHES.fetch_add(1, Ordering::Relaxed) + 1;
    let mut by_device: HashMap<usize, Vec<Arc<StreamPool>>> = HashMap::new();
    for s in lib.pools_of(device) {
        by_device.entry(s.device).or_default().push(s);
    }
    let mut total = 0;
    let mut devices: Vec<usize> = by_device.keys().copied().collect();
    devices.sort_unstable();
    for d in devices {
        let pools = &by_device[&d];
        let r = device_end(&lib, d, pools, Boundary::new(lib.purge, lib.headroom))?;
        tracing::info!(
            ubatch,
            device = d,
            peak_reserved = r.peak_reserved,
            peak_live = r.peak_live,
            released = r.released,
            synchronized = r.synchronized,
            short = r.short,
            "ubatch end"
        );
        total += r.released;
    }
    crate::record::ubatch_boundary(ubatch);
    Ok(total)
}

fn device_end(
    lib: &state::Lib,
    d: usize,
    pools: &[Arc<StreamPool>],
    boundary: Boundary,
) -> Result<DeviceBoundary, Failure> {
    let mut r = DeviceBoundary::default();
    for s in pools {
        let st = s.pool.stats();
        r.peak_reserved += st.reserved_peak_bytes;
        r.peak_live += st.live_peak_bytes;
    }
    let driver = lib.registry.driver(d).ok_or_else(|| {
        Failure::new(
            crate::status::CupoolStatus::InvalidArgument,
            format!("device {d} has no driver"),
        )
    })?;
    // Free memory is read once for the device (it costs no synchronize), and only if asked.
    let free = std::cell::OnceCell::new();
    let read_free = || -> Result<usize, Failure> {
        if let Some(&f) = free.get() {
            return Ok(f);
        }
        let f = driver.mem_info()?.free;
        Ok(*free.get_or_init(|| f))
    };
    let mut plan: Vec<(&Arc<StreamPool>, Purge)> = Vec::new();
    for s in pools {
        // Every boundary opens a fresh interval, whatever the policy does with it.
        let held = s.pool.take_keep();
        let decision = boundary.decide(&s.pool, r.peak_live, read_free, || Ok(held))?;
        if let Some(keep) = decision.recorded_keep() {
            r.short |= keep.is_some();
            crate::record::keep(s.device, s.stream, keep);
        }
        if let Some(what) = decision.purge() {
            plan.push((s, what));
        }
    }
    if !plan.is_empty() {
        let token = synchronize(driver.as_ref())?;
        crate::record::sync();
        r.synchronized = true;
        for (s, what) in plan {
            r.released += s.pool.purge(&token, what)?.bytes;
        }
    }
    // The pools' own high-water marks restart for the next ubatch; the peaks the user sees are
    // libcupool's (`crate::peaks`) and go on.
    pools.iter().for_each(|s| s.pool.reset_peaks());
    Ok(r)
}
