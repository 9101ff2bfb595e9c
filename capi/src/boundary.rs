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
use cupool_pool::{synchronize, AutoHeadroom as Headroom, Purge, PurgePolicy};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Distinct request sizes a pool tracks between two boundaries. Past it, new sizes are not
/// tracked: their cached buffers are returned at the boundary (safe, at worst a re-malloc).
const MAX_SIZES: usize = 4096;

/// Boundaries so far, process-wide: they number the phases of a recording.
static UBATCHES: AtomicU64 = AtomicU64::new(0);

/// For each request size: (blocks live now, most live at once since the last boundary).
#[derive(Debug, Default)]
pub(crate) struct Usage {
    sizes: HashMap<usize, (u32, u32)>,
}

impl Usage {
    pub fn alloc(&mut self, size: usize) {
        if self.sizes.len() >= MAX_SIZES && !self.sizes.contains_key(&size) {
            return;
        }
        let e = self.sizes.entry(size).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
    }

    pub fn free(&mut self, size: usize) {
        if let Some(e) = self.sizes.get_mut(&size) {
            e.0 = e.0.saturating_sub(1);
        }
    }

    /// The requests to keep buffers for, largest first (so large requests take their best
    /// fits before small ones can), and a fresh interval: sizes with live blocks carry them
    /// over.
    pub fn take_keep(&mut self) -> Vec<usize> {
        let mut keep: Vec<usize> = self
            .sizes
            .iter()
            .flat_map(|(&size, &(_, most))| std::iter::repeat_n(size, most as usize))
            .collect();
        keep.sort_unstable_by(|a, b| b.cmp(a));
        self.sizes.retain(|_, e| e.0 > 0);
        self.sizes.values_mut().for_each(|e| e.1 = e.0);
        keep
    }
}

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
        let r = device_end(&lib, d, pools, lib.purge)?;
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
    policy: PurgePolicy,
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
    // Reading free memory costs no synchronize; with `inf` there is nothing to decide.
    r.short = policy == PurgePolicy::Auto
        && (lib.headroom == Headroom::Infinite
            || lib.headroom.short(driver.mem_info()?.free, r.peak_live));
    let plan: Vec<(&Arc<StreamPool>, Purge)> = pools
        .iter()
        .filter_map(|s| {
            let what = match policy {
                PurgePolicy::Never => return None,
                PurgePolicy::Always => Purge::All,
                PurgePolicy::Auto => {
                    let keep = s.usage.lock().take_keep();
                    if !r.short {
                        crate::record::keep(s.device, s.stream, None);
                        return None;
                    }
                    crate::record::keep(s.device, s.stream, Some(&keep));
                    Purge::KeepFor(keep)
                }
            };
            let wanted = policy == PurgePolicy::Always || s.pool.releasable(&what) > 0;
            wanted.then_some((s, what))
        })
        .collect();
    if policy == PurgePolicy::Never {
        pools.iter().for_each(|s| drop(s.usage.lock().take_keep()));
    }
    if !plan.is_empty() {
        let token = synchronize(driver.as_ref())?;
        crate::record::sync();
        r.synchronized = true;
        for (s, what) in plan {
            r.released += s.pool.purge(&token, what)?.bytes;
        }
    }
    pools.iter().for_each(|s| s.pool.reset_peaks());
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_held_at_once_per_size_largest_first() {
        let mut u = Usage::default();
        // K and V together, twice; a small buffer alone, three times.
        for _ in 0..2 {
            u.alloc(100);
            u.alloc(100);
            u.free(100);
            u.free(100);
        }
        for _ in 0..3 {
            u.alloc(7);
            u.free(7);
        }
        u.alloc(50); // live across the boundary
        assert_eq!(u.take_keep(), vec![100, 100, 50, 7]);
        // The next interval starts from what is live.
        assert_eq!(u.take_keep(), vec![50]);
        u.free(50);
        assert_eq!(u.take_keep(), vec![50]);
        assert!(u.take_keep().is_empty());
    }

    #[test]
    fn stops_tracking_new_sizes_past_the_bound() {
        let mut u = Usage::default();
        for s in 0..MAX_SIZES + 10 {
            u.alloc(s + 1);
        }
        assert_eq!(u.sizes.len(), MAX_SIZES);
        u.free(MAX_SIZES + 5); // untracked: ignored
        assert_eq!(u.take_keep().len(), MAX_SIZES);
    }
}
