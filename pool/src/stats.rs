//! Pool statistics, in the spirit of PyTorch's `memory_stats()`, and the numbers of a phase
//! (see [`crate::adaptors::Phases`]).

/// Driver calls a pool made, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Device synchronizations the pool asked for itself (flush-and-retry, purge on grow,
    /// page recycling).
    pub syncs: u64,
    /// Free pages moved to where a block landed (unmap and map of the same memory), instead
    /// of new memory created.
    pub remaps: u64,
}

impl DriverCalls {
    /// Counts one successful call of `kind` (kinds with no counter of their own are not
    /// counted).
    #[inline]
    pub fn record(&mut self, kind: crate::driver::CallKind) {
        use crate::driver::CallKind as K;
        let counter = match kind {
            K::Malloc => &mut self.mallocs,
            K::Free => &mut self.frees,
            K::MallocManaged => &mut self.managed_mallocs,
            K::FreeManaged => &mut self.managed_frees,
            K::Reserve => &mut self.reserves,
            K::Create | K::Map | K::SetAccess => &mut self.maps,
            K::Unmap | K::Release => &mut self.unmaps,
            K::Synchronize => &mut self.syncs,
            K::MemInfo
            | K::Granularity
            | K::ReleaseReservation
            | K::Init
            | K::HostAlloc
            | K::Copy
            | K::StreamWait => return,
        };
        *counter += 1;
    }

    /// The sum of two sets of counts.
    pub fn plus(&self, o: &DriverCalls) -> DriverCalls {
        DriverCalls {
            mallocs: self.mallocs + o.mallocs,
            frees: self.frees + o.frees,
            managed_mallocs: self.managed_mallocs + o.managed_mallocs,
            managed_frees: self.managed_frees + o.managed_frees,
            reserves: self.reserves + o.reserves,
            maps: self.maps + o.maps,
            unmaps: self.unmaps + o.unmaps,
            syncs: self.syncs + o.syncs,
            remaps: self.remaps + o.remaps,
        }
    }

    /// Calls made since `earlier`.
    pub fn since(&self, earlier: &DriverCalls) -> DriverCalls {
        DriverCalls {
            mallocs: self.mallocs.saturating_sub(earlier.mallocs),
            frees: self.frees.saturating_sub(earlier.frees),
            managed_mallocs: self.managed_mallocs.saturating_sub(earlier.managed_mallocs),
            managed_frees: self.managed_frees.saturating_sub(earlier.managed_frees),
            reserves: self.reserves.saturating_sub(earlier.reserves),
            maps: self.maps.saturating_sub(earlier.maps),
            unmaps: self.unmaps.saturating_sub(earlier.unmaps),
            syncs: self.syncs.saturating_sub(earlier.syncs),
            remaps: self.remaps.saturating_sub(earlier.remaps),
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
#[non_exhaustive]
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
    /// Highest `fallback_live_bytes` since creation or the last peak reset.
    pub fallback_live_peak_bytes: usize,
    /// Purges that released something.
    pub purges: u64,
    /// Bytes returned to the driver by purges.
    pub purged_bytes: usize,
    /// Reserved bytes whose physical memory a sleep released (see [`crate::Pool::sleep`]):
    /// counted in `reserved_bytes`, not held on the device until the pool wakes.
    pub asleep_bytes: usize,
    /// Cached bytes that threads keep for their next allocations
    /// ([`crate::adaptors::ThreadCache`]): part of `cached_bytes`.
    pub thread_cached_bytes: usize,
}

impl PoolStats {
    /// Adds `o`'s counts to these: the statistics of several pools as one. Peaks are added
    /// too, so the sum's peak is an upper bound (exact when the pools peak together).
    pub fn merge(&mut self, o: &PoolStats) {
        self.live_bytes += o.live_bytes;
        self.live_peak_bytes += o.live_peak_bytes;
        self.live_blocks += o.live_blocks;
        self.reserved_bytes += o.reserved_bytes;
        self.reserved_peak_bytes += o.reserved_peak_bytes;
        self.cached_bytes += o.cached_bytes;
        self.allocs += o.allocs;
        self.frees += o.frees;
        self.calls = self.calls.plus(&o.calls);
        self.ooms += o.ooms;
        self.retries += o.retries;
        self.fallbacks += o.fallbacks;
        self.fallback_live_bytes += o.fallback_live_bytes;
        self.fallback_live_peak_bytes += o.fallback_live_peak_bytes;
        self.purges += o.purges;
        self.purged_bytes += o.purged_bytes;
        self.asleep_bytes += o.asleep_bytes;
        self.thread_cached_bytes += o.thread_cached_bytes;
    }
}

/// One phase's numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PhaseStats {
    /// The name given when the phase began.
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

/// The bookkeeping of the pool core, under its lock: the only code that changes the counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tracker {
    pub(crate) s: PoolStats,
    /// Capacity of live blocks: what users hold including rounding.
    live_capacity: usize,
}

impl Tracker {
    #[inline]
    pub(crate) fn on_alloc(&mut self, size: usize, capacity: usize) {
        let s = &mut self.s;
        s.live_bytes += size;
        s.live_blocks += 1;
        s.allocs += 1;
        self.live_capacity += capacity;
        s.live_peak_bytes = s.live_peak_bytes.max(s.live_bytes);
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
        s.reserved_peak_bytes = s.reserved_peak_bytes.max(s.reserved_bytes);
    }

    /// Bytes went back to the driver; `purged` when a purge (not a free) released them.
    pub(crate) fn on_release(&mut self, bytes: usize, purged: bool) {
        self.s.reserved_bytes -= bytes;
        if purged {
            self.s.purged_bytes += bytes;
        }
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
}
