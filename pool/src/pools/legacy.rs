//! ggml's legacy pool (`ggml_cuda_pool_leg`), faithfully, with cupool's fixes as options.
//!
//! The default configuration is ggml's policy exactly, so a user switching from ggml sees the
//! same footprint:
//! - a fixed array of 256 slots holds only *idle cached* buffers;
//! - `alloc(size)` scans every occupied slot for the smallest buffer of at least `size` bytes
//!   whose excess is below 64 GiB, returning at once on an exact fit; the caller gets the whole
//!   buffer;
//! - with no fit, the device allocates `round_up((size_t)(1.05 * size), 256)` bytes;
//! - `free` puts the buffer in the first empty slot, and only when all slots are full does it
//!   go back to the driver. Nothing else ever shrinks the pool.
//!
//! Options: [`Pool::purge`] (by sync token), flush-and-retry on OOM (newer llama.cpp,
//! PR #22155), managed backing and dropping idle smaller buffers on grow (PR #22158; see
//! [`super::managed`]).

use super::{checked_request, oom_report, Pool, PoolKind, Purge, Released};
use crate::block::{Block, PoolId};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode};
use crate::error::{FreeError, PoolError};
use crate::stats::{PhaseStats, PoolStats, Tracker};
use crate::sync::{synchronize, SyncToken};
use parking_lot::Mutex;
use std::sync::Arc;

/// Where the legacy pool gets new buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Device memory (cuMemAlloc).
    Device,
    /// Managed memory, never more than the device has free unless oversubscription is allowed.
    Managed {
        /// Allow asking for more managed memory than the device has free.
        allow_oversubscription: bool,
    },
}

/// The legacy pool's policy. [`Default`] is ggml's.
#[derive(Clone, Debug, PartialEq)]
pub struct LegacyConfig {
    /// Cached-buffer slots (ggml: 256).
    pub slots: usize,
    /// Factor a new buffer is grown by (ggml: 1.05).
    pub look_ahead: f64,
    /// New buffer sizes are rounded up to this (ggml: 256).
    pub rounding: usize,
    /// A cached buffer this much larger than the request is never chosen (ggml: 64 GiB).
    pub max_excess: usize,
    /// On device OOM: synchronize, free the whole cache, retry once (ggml after PR #22155).
    pub flush_and_retry: bool,
    /// Where buffers come from.
    pub backing: Backing,
    /// When growing, first free idle cached buffers smaller than the request (PR #22158).
    pub drop_smaller_on_grow: bool,
}

impl Default for LegacyConfig {
    fn default() -> Self {
        Self {
            slots: 256,
            look_ahead: 1.05,
            rounding: 256,
            max_excess: 1 << 36,
            flush_and_retry: false,
            backing: Backing::Device,
            drop_smaller_on_grow: false,
        }
    }
}

/// The cached-buffer table. Parallel arrays plus an occupancy bitmap so the scans touch only
/// occupied slots, in index order, exactly as ggml's loop would visit them.
#[derive(Debug)]
struct Slots {
    ptr: Vec<DevicePtr>,
    size: Vec<usize>,
    freed_at: Vec<u64>,
    occupied: Vec<u64>,
    count: usize,
}

impl Slots {
    fn new(n: usize) -> Self {
        Self {
            ptr: vec![0; n],
            size: vec![0; n],
            freed_at: vec![0; n],
            occupied: vec![0; n.div_ceil(64)],
            count: 0,
        }
    }

    fn capacity(&self) -> usize {
        self.ptr.len()
    }

    /// Occupied slot indices, ascending.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.occupied.iter().enumerate().flat_map(|(w, &bits)| {
            let mut b = bits;
            std::iter::from_fn(move || {
                if b == 0 {
                    return None;
                }
                let i = b.trailing_zeros() as usize;
                b &= b - 1;
                Some(w * 64 + i)
            })
        })
    }

    fn first_empty(&self) -> Option<usize> {
        for (w, &bits) in self.occupied.iter().enumerate() {
            if bits != u64::MAX {
                let i = w * 64 + (!bits).trailing_zeros() as usize;
                return (i < self.capacity()).then_some(i);
            }
        }
        None
    }

    fn put(&mut self, i: usize, ptr: DevicePtr, size: usize, freed_at: u64) {
        self.ptr[i] = ptr;
        self.size[i] = size;
        self.freed_at[i] = freed_at;
        self.occupied[i / 64] |= 1 << (i % 64);
        self.count += 1;
    }

    fn take(&mut self, i: usize) -> (DevicePtr, usize) {
        self.occupied[i / 64] &= !(1 << (i % 64));
        self.count -= 1;
        (
            std::mem::take(&mut self.ptr[i]),
            std::mem::take(&mut self.size[i]),
        )
    }
}

#[derive(Debug)]
struct Inner {
    slots: Slots,
    tracker: Tracker,
    /// Buffers the driver refused to free; retried at every purge and at drop.
    pending: Vec<(DevicePtr, usize)>,
}

/// See the module docs.
#[derive(Debug)]
pub struct LegacyPool {
    id: PoolId,
    kind: PoolKind,
    driver: Arc<dyn Driver>,
    config: LegacyConfig,
    inner: Mutex<Inner>,
}

impl LegacyPool {
    /// A pool with ggml's policy.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::with_config(driver, LegacyConfig::default())
    }

    /// A pool with the given policy. Out-of-range settings are clamped: at least one slot,
    /// look-ahead at least 1, rounding at least 1.
    pub fn with_config(driver: Arc<dyn Driver>, mut config: LegacyConfig) -> Self {
        config.slots = config.slots.max(1);
        if !(config.look_ahead >= 1.0 && config.look_ahead.is_finite()) {
            config.look_ahead = 1.0;
        }
        config.rounding = config.rounding.max(1);
        let kind = match config.backing {
            Backing::Device => PoolKind::Legacy,
            Backing::Managed { .. } => PoolKind::Managed,
        };
        let inner = Inner {
            slots: Slots::new(config.slots),
            tracker: Tracker::default(),
            pending: Vec::new(),
        };
        Self {
            id: PoolId::fresh(),
            kind,
            driver,
            config,
            inner: Mutex::new(inner),
        }
    }

    /// The policy in force.
    pub fn config(&self) -> &LegacyConfig {
        &self.config
    }

    /// Sizes of the idle cached buffers, by slot order.
    pub fn cached_sizes(&self) -> Vec<usize> {
        let g = self.inner.lock();
        g.slots.iter().map(|i| g.slots.size[i]).collect()
    }

    /// The size a new buffer for `size` bytes gets: `round_up((size_t)(1.05 * size), 256)`.
    pub fn grow_size(&self, size: usize) -> usize {
        // ggml multiplies in double precision and truncates; do the same, bit for bit.
        let ahead = ((self.config.look_ahead * size as f64) as usize).max(size);
        ahead.next_multiple_of(self.config.rounding)
    }

    /// Best fit, as ggml scans: smallest excess below `max_excess`, ties to the lowest slot,
    /// an exact fit ends the scan.
    #[inline]
    fn best_fit(&self, slots: &Slots, size: usize) -> Option<usize> {
        let mut best = None;
        let mut best_diff = self.config.max_excess;
        for i in slots.iter() {
            let s = slots.size[i];
            if s >= size {
                let diff = s - size;
                if diff < best_diff {
                    best_diff = diff;
                    best = Some(i);
                    if diff == 0 {
                        break;
                    }
                }
            }
        }
        best
    }

    fn driver_alloc(&self, g: &mut Inner, bytes: usize) -> Result<DevicePtr, DriverError> {
        match self.config.backing {
            Backing::Device => {
                let r = self.driver.malloc(bytes);
                if r.is_ok() {
                    g.tracker.s.calls.mallocs += 1;
                }
                r
            }
            Backing::Managed {
                allow_oversubscription,
            } => {
                if !allow_oversubscription {
                    let headroom = self.driver.managed_headroom()?;
                    if bytes > headroom {
                        return Err(DriverError::new(
                            CallKind::MallocManaged,
                            ErrorCode::OutOfMemory,
                            format!("refused: {bytes} managed bytes exceed the device's {headroom} free bytes and oversubscription is not allowed"),
                        ));
                    }
                }
                let r = self.driver.malloc_managed(bytes);
                if r.is_ok() {
                    g.tracker.s.calls.managed_mallocs += 1;
                }
                r
            }
        }
    }

    fn driver_free(&self, g: &mut Inner, ptr: DevicePtr) -> Result<(), DriverError> {
        match self.config.backing {
            Backing::Device => {
                self.driver.free(ptr)?;
                g.tracker.s.calls.frees += 1;
            }
            Backing::Managed { .. } => {
                self.driver.free_managed(ptr)?;
                g.tracker.s.calls.managed_frees += 1;
            }
        }
        Ok(())
    }

    /// The occupied slots a purge of `what` would release, ignoring the token.
    fn candidates(&self, slots: &Slots, what: &Purge) -> Vec<usize> {
        match what {
            Purge::All => slots.iter().collect(),
            Purge::SmallerThan(n) => slots.iter().filter(|&i| slots.size[i] < *n).collect(),
            Purge::KeepFor(requests) => {
                let mut free: Vec<usize> = slots.iter().collect();
                for &r in requests {
                    let r = r.max(1);
                    // The choice `best_fit` makes, over the buffers not yet claimed.
                    let mut best: Option<(usize, usize)> = None;
                    for (pos, &i) in free.iter().enumerate() {
                        let s = slots.size[i];
                        if s >= r
                            && s - r < self.config.max_excess
                            && best.is_none_or(|(_, d)| s - r < d)
                        {
                            best = Some((pos, s - r));
                            if s == r {
                                break;
                            }
                        }
                    }
                    if let Some((pos, _)) = best {
                        free.remove(pos);
                    }
                }
                free
            }
        }
    }

    /// Releases the cached buffers of `what` that `token` covers, and retries refused frees.
    fn release(
        &self,
        g: &mut Inner,
        token: &SyncToken,
        what: &Purge,
    ) -> Result<Released, PoolError> {
        let mut out = Released::default();
        let mut first_err = None;
        // Retry buffers the driver refused earlier.
        for (ptr, size) in std::mem::take(&mut g.pending) {
            match self.driver_free(g, ptr) {
                Ok(()) => {
                    g.tracker.on_release(size);
                    out.bytes += size;
                    out.buffers += 1;
                }
                Err(e) => {
                    g.pending.push((ptr, size));
                    first_err.get_or_insert(e);
                }
            }
        }
        let candidates = self.candidates(&g.slots, what);
        for i in candidates {
            if !token.covers(g.slots.freed_at[i]) {
                out.deferred_bytes += g.slots.size[i];
                continue;
            }
            match self.driver_free(g, g.slots.ptr[i]) {
                Ok(()) => {
                    let (_, size) = g.slots.take(i);
                    g.tracker.on_release(size);
                    out.bytes += size;
                    out.buffers += 1;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if out.bytes > 0 {
            g.tracker.s.purges += 1;
            g.tracker.s.purged_bytes += out.bytes;
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    fn stranded(slots: &Slots, size: usize) -> usize {
        slots
            .iter()
            .map(|i| slots.size[i])
            .filter(|&s| s < size)
            .sum()
    }

    #[cold]
    fn grow(&self, g: &mut Inner, size: usize) -> Result<Block, PoolError> {
        let look_ahead = self.grow_size(size);
        if self.config.drop_smaller_on_grow && g.slots.count > 0 {
            let token = synchronize(self.driver.as_ref())?;
            g.tracker.s.calls.syncs += 1;
            let r = self.release(g, &token, &Purge::SmallerThan(size))?;
            if r.bytes > 0 {
                tracing::debug!(pool = %self.kind, bytes = r.bytes, buffers = r.buffers, "dropped idle smaller buffers before growing");
            }
        }
        let mut result = self.driver_alloc(g, look_ahead);
        if let Err(e) = &result {
            if e.is_oom() && self.config.flush_and_retry && g.slots.count > 0 {
                let token = synchronize(self.driver.as_ref())?;
                g.tracker.s.calls.syncs += 1;
                let r = self.release(g, &token, &Purge::All)?;
                g.tracker.s.retries += 1;
                tracing::warn!(pool = %self.kind, requested = size, flushed = r.bytes, "allocation failed; flushed the cache and retrying once");
                result = self.driver_alloc(g, look_ahead);
            }
        }
        match result {
            Ok(ptr) => {
                g.tracker.on_reserve(look_ahead);
                g.tracker.on_alloc(size, look_ahead);
                tracing::trace!(pool = %self.kind, requested = size, bytes = look_ahead, reserved = g.tracker.s.reserved_bytes, "grew");
                Ok(Block {
                    ptr,
                    size,
                    capacity: look_ahead,
                    pool: self.id,
                    managed_fallback: false,
                })
            }
            Err(e) if e.is_oom() => {
                g.tracker.s.ooms += 1;
                let stranded = Self::stranded(&g.slots, size);
                let report = oom_report(
                    self.driver.as_ref(),
                    self.kind,
                    size,
                    &g.tracker.snapshot(),
                    stranded,
                    e.to_string(),
                );
                tracing::warn!(pool = %self.kind, "{report}");
                Err(PoolError::OutOfMemory(Box::new(report)))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl Pool for LegacyPool {
    fn id(&self) -> PoolId {
        self.id
    }

    fn kind(&self) -> PoolKind {
        self.kind
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let size = checked_request(bytes)?;
        let mut g = self.inner.lock();
        if let Some(i) = self.best_fit(&g.slots, size) {
            let (ptr, capacity) = g.slots.take(i);
            g.tracker.on_alloc(size, capacity);
            return Ok(Block {
                ptr,
                size,
                capacity,
                pool: self.id,
                managed_fallback: false,
            });
        }
        self.grow(&mut g, size)
    }

    fn free(&self, block: Block) -> Result<(), FreeError> {
        if block.pool != self.id {
            let error = PoolError::WrongPool {
                owner: block.pool,
                given_to: self.id,
            };
            return Err(FreeError { error, block });
        }
        #[cfg(feature = "poison")]
        if let Err(e) = self.driver.poison(block.ptr, block.capacity) {
            tracing::error!(error = %e, "poisoning a freed block failed");
        }
        let freed_at = self.driver.epoch().current();
        let mut g = self.inner.lock();
        g.tracker.on_free(block.size, block.capacity);
        match g.slots.first_empty() {
            Some(i) => g.slots.put(i, block.ptr, block.capacity, freed_at),
            None => {
                // ggml frees to the driver when every slot is taken; cuMemFree waits for the
                // device, so the buffer's queued work is finished first.
                if let Err(e) = self.driver_free(&mut g, block.ptr) {
                    tracing::error!(pool = %self.kind, error = %e, "driver refused a free; kept for the next purge");
                    g.pending.push((block.ptr, block.capacity));
                } else {
                    g.tracker.on_release(block.capacity);
                }
            }
        }
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        if !token.is_for(self.driver.epoch()) {
            return Err(PoolError::WrongDevice {
                device: self.driver.ordinal(),
            });
        }
        let mut g = self.inner.lock();
        let r = self.release(&mut g, token, &what)?;
        if r.bytes > 0 || r.deferred_bytes > 0 {
            tracing::debug!(pool = %self.kind, released = r.bytes, buffers = r.buffers, deferred = r.deferred_bytes, reserved = g.tracker.s.reserved_bytes, "purged");
        }
        Ok(r)
    }

    fn releasable(&self, what: &Purge) -> usize {
        let g = self.inner.lock();
        let pending: usize = g.pending.iter().map(|p| p.1).sum();
        pending
            + self
                .candidates(&g.slots, what)
                .iter()
                .map(|&i| g.slots.size[i])
                .sum::<usize>()
    }

    fn stats(&self) -> PoolStats {
        self.inner.lock().tracker.snapshot()
    }

    fn reset_peaks(&self) {
        self.inner.lock().tracker.reset_peaks()
    }

    fn begin_phase(&self, name: &str) {
        self.inner.lock().tracker.begin_phase(name)
    }

    fn end_phase(&self) -> Option<PhaseStats> {
        self.inner.lock().tracker.end_phase()
    }

    fn alignment(&self) -> usize {
        256
    }
}

impl Drop for LegacyPool {
    fn drop(&mut self) {
        let token = match synchronize(self.driver.as_ref()) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(pool = %self.kind, error = %e, "synchronize failed while dropping the pool; cached buffers leak");
                return;
            }
        };
        let mut g = self.inner.lock();
        if g.tracker.s.live_blocks > 0 {
            tracing::warn!(pool = %self.kind, blocks = g.tracker.s.live_blocks, bytes = g.tracker.s.live_bytes, "pool dropped with live blocks; they are not freed");
        }
        if let Err(e) = self.release(&mut g, &token, &Purge::All) {
            tracing::error!(pool = %self.kind, error = %e, "could not free every cached buffer while dropping the pool");
        }
    }
}
