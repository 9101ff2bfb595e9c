//! Pool statistics, in the spirit of PyTorch's `memory_stats()`, plus phases.
//!
//! A *phase* is a named stretch of work (the runtime opens one per ubatch); ending it returns
//! that stretch's high-water of live and reserved bytes and the driver calls made in it.

/// Driver calls a pool made, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCalls {
    /// Device allocations (cuMemAlloc).
    pub mallocs: u64,
    /// Device frees (cuMemFree).
    pub frees: u64,
    /// Managed allocations.
    pub managed_mallocs: u64,
    /// Managed frees.
    pub managed_frees: u64,
    /// Address-space reservations.
    pub reserves: u64,
    /// Physical create+map+set-access.
    pub maps: u64,
    /// Physical unmap+release.
    pub unmaps: u64,
    /// Device synchronizations the pool asked for itself (flush-and-retry, purge on grow).
    pub syncs: u64,
}

impl DriverCalls {
    /// Calls made since `earlier`.
    pub fn since(&self, earlier: &DriverCalls) -> DriverCalls {
        DriverCalls {
            mallocs: self.mallocs - earlier.mallocs,
            frees: self.frees - earlier.frees,
            managed_mallocs: self.managed_mallocs - earlier.managed_mallocs,
            managed_frees: self.managed_frees - earlier.managed_frees,
            reserves: self.reserves - earlier.reserves,
            maps: self.maps - earlier.maps,
            unmaps: self.unmaps - earlier.unmaps,
            syncs: self.syncs - earlier.syncs,
        }
    }

    /// Calls that obtained memory from the driver (device, managed or mapped).
    pub fn acquisitions(&self) -> u64 {
        self.mallocs + self.managed_mallocs + self.maps
    }

    /// Calls that returned memory to the driver.
    pub fn releases(&self) -> u64 {
        self.frees + self.managed_frees + self.unmaps
    }
}

/// A pool's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes users asked for and still hold.
    pub live_bytes: usize,
    /// Highest `live_bytes` since creation or the last peak reset.
    pub live_peak_bytes: usize,
    /// Blocks users hold.
    pub live_blocks: usize,
    /// Device bytes the pool holds: live blocks' capacity plus cache.
    pub reserved_bytes: usize,
    /// Highest `reserved_bytes` since creation or the last peak reset.
    pub reserved_peak_bytes: usize,
    /// Reserved bytes no user holds.
    pub cached_bytes: usize,
    /// Successful allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Driver calls, by kind.
    pub calls: DriverCalls,
    /// Allocations that failed for lack of memory.
    pub ooms: u64,
    /// Allocations retried after flushing the cache.
    pub retries: u64,
    /// Allocations served from managed memory because the device was full.
    pub fallbacks: u64,
    /// Managed-fallback bytes still live.
    pub fallback_live_bytes: usize,
    /// Purges that released something.
    pub purges: u64,
    /// Bytes returned to the driver by purges.
    pub purged_bytes: usize,
}

/// One phase's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseStats {
    /// The name given to `begin_phase`.
    pub name: String,
    /// Highest live bytes during the phase.
    pub live_peak_bytes: usize,
    /// Highest reserved bytes during the phase.
    pub reserved_peak_bytes: usize,
    /// Live bytes at the end.
    pub live_end_bytes: usize,
    /// Reserved bytes at the end.
    pub reserved_end_bytes: usize,
    /// Cached bytes at the end.
    pub cached_end_bytes: usize,
    /// Driver calls made during the phase.
    pub calls: DriverCalls,
    /// OOMs during the phase.
    pub ooms: u64,
}

#[derive(Debug)]
struct Phase {
    name: String,
    live_peak: usize,
    reserved_peak: usize,
    calls_at_start: DriverCalls,
    ooms_at_start: u64,
}

/// The bookkeeping every pool embeds (under its own lock).
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    pub(crate) s: PoolStats,
    /// Capacity of live blocks: what users hold including rounding.
    live_capacity: usize,
    phase: Option<Phase>,
}

impl Tracker {
    #[inline]
    pub(crate) fn on_alloc(&mut self, size: usize, capacity: usize) {
        let s = &mut self.s;
        s.live_bytes += size;
        s.live_blocks += 1;
        s.allocs += 1;
        self.live_capacity += capacity;
        if s.live_bytes > s.live_peak_bytes {
            s.live_peak_bytes = s.live_bytes;
        }
        if let Some(p) = &mut self.phase {
            p.live_peak = p.live_peak.max(s.live_bytes);
        }
    }

    #[inline]
    pub(crate) fn on_free(&mut self, size: usize, capacity: usize) {
        self.s.live_bytes -= size;
        self.s.live_blocks -= 1;
        self.s.frees += 1;
        self.live_capacity -= capacity;
    }

    pub(crate) fn on_reserve(&mut self, bytes: usize) {
        let s = &mut self.s;
        s.reserved_bytes += bytes;
        if s.reserved_bytes > s.reserved_peak_bytes {
            s.reserved_peak_bytes = s.reserved_bytes;
        }
        if let Some(p) = &mut self.phase {
            p.reserved_peak = p.reserved_peak.max(s.reserved_bytes);
        }
    }

    pub(crate) fn on_release(&mut self, bytes: usize) {
        self.s.reserved_bytes -= bytes;
    }

    pub(crate) fn snapshot(&self) -> PoolStats {
        let mut s = self.s.clone();
        s.cached_bytes = s.reserved_bytes.saturating_sub(self.live_capacity);
        s
    }

    pub(crate) fn reset_peaks(&mut self) {
        self.s.live_peak_bytes = self.s.live_bytes;
        self.s.reserved_peak_bytes = self.s.reserved_bytes;
    }

    pub(crate) fn begin_phase(&mut self, name: &str) {
        if let Some(old) = &self.phase {
            tracing::debug!(phase = %old.name, "phase replaced before it was ended");
        }
        self.phase = Some(Phase {
            name: name.to_owned(),
            live_peak: self.s.live_bytes,
            reserved_peak: self.s.reserved_bytes,
            calls_at_start: self.s.calls,
            ooms_at_start: self.s.ooms,
        });
    }

    pub(crate) fn end_phase(&mut self) -> Option<PhaseStats> {
        let p = self.phase.take()?;
        let snap = self.snapshot();
        Some(PhaseStats {
            name: p.name,
            live_peak_bytes: p.live_peak,
            reserved_peak_bytes: p.reserved_peak,
            live_end_bytes: snap.live_bytes,
            reserved_end_bytes: snap.reserved_bytes,
            cached_end_bytes: snap.cached_bytes,
            calls: snap.calls.since(&p.calls_at_start),
            ooms: snap.ooms - p.ooms_at_start,
        })
    }
}
