//! The VMM reserve-and-map pool.
//!
//! Like ggml's `ggml_cuda_pool_vmm`: one address range is reserved up front, physical memory
//! is mapped at its end as the pool grows, allocation bumps a pointer, sizes are rounded to
//! 128 bytes. Unlike ggml:
//! - frees may come in any order. LIFO is the fast path (the top just moves down);
//!   out-of-order frees leave holes that are coalesced and reused best-fit;
//! - growth adapts, like TCP's slow start: each grow maps at least `min_grow`, doubling while
//!   the pool keeps growing with no free in between, up to `max_grow`; any free resets it. A
//!   burst of growth amortises the ~45 µs cost of a map over large chunks, while a pool that
//!   grows once per ubatch (flash-attention scratch) stays within a granule or two of its need;
//! - [`Pool::purge`] is the trim: after a synchronize, chunks above the live top are unmapped;
//! - running out of reservation or device memory is an error, never an abort.

use super::{checked_request, oom_report, Pool, PoolKind, Purge, Released};
use crate::block::{Block, PoolId};
use crate::driver::{DevicePtr, Driver, PhysHandle};
use crate::error::{FreeError, PoolError};
use crate::stats::{PhaseStats, PoolStats, Tracker};
use crate::sync::{synchronize, SyncToken};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Block alignment and size rounding, as ggml's VMM pool.
pub const VMM_ALIGN: usize = 128;

/// The VMM pool's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmConfig {
    /// Address space to reserve; `None`: the device's total memory (ggml: a fixed 32 GiB,
    /// which caps the pool below the card on large GPUs).
    pub reserve_bytes: Option<usize>,
    /// Smallest growth (rounded up to the device granularity): what a grow maps after a free.
    pub min_grow: usize,
    /// Largest amortised growth: consecutive grows double from `min_grow` up to this. Equal to
    /// `min_grow` for a fixed chunk size. A single larger request still maps what it needs.
    pub max_grow: usize,
}

impl Default for VmmConfig {
    fn default() -> Self {
        Self {
            reserve_bytes: None,
            min_grow: 2 << 20,
            max_grow: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    offset: usize,
    len: usize,
    handle: PhysHandle,
}

#[derive(Debug, Default)]
struct Inner {
    /// Base of the reservation; 0 until the first allocation reserves it.
    base: DevicePtr,
    reserve_len: usize,
    granularity: usize,
    /// Bytes mapped from `base`.
    mapped: usize,
    chunks: Vec<Chunk>,
    /// End of the highest live block (offset from base).
    top: usize,
    /// Free ranges below `top`: offset → length, coalesced.
    holes: BTreeMap<usize, usize>,
    /// Epoch of the latest free, for purge safety.
    last_free: u64,
    /// Grows since the last free: the amortised chunk is `min_grow << streak`.
    streak: u32,
    tracker: Tracker,
}

/// See the module docs.
#[derive(Debug)]
pub struct VmmPool {
    id: PoolId,
    driver: Arc<dyn Driver>,
    config: VmmConfig,
    inner: Mutex<Inner>,
}

impl VmmPool {
    /// A pool with default settings.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::with_config(driver, VmmConfig::default())
    }

    /// A pool with the given settings. Nothing is reserved until the first allocation.
    pub fn with_config(driver: Arc<dyn Driver>, config: VmmConfig) -> Self {
        Self {
            id: PoolId::fresh(),
            driver,
            config,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    /// Bytes currently mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.inner.lock().mapped
    }

    #[cold]
    fn reserve(&self, g: &mut Inner) -> Result<(), PoolError> {
        let gran = self.driver.granularity()?;
        let want = match self.config.reserve_bytes {
            Some(b) => b,
            None => self.driver.mem_info()?.total,
        };
        let len = want.max(gran).next_multiple_of(gran);
        let base = self.driver.reserve(len)?;
        g.tracker.s.calls.reserves += 1;
        g.base = base;
        g.reserve_len = len;
        g.granularity = gran;
        tracing::debug!(
            base = format_args!("{base:#x}"),
            bytes = len,
            granularity = gran,
            "vmm reserved address space"
        );
        Ok(())
    }

    /// Maps enough to extend the mapped range by at least `need` bytes.
    #[cold]
    fn grow(&self, g: &mut Inner, need: usize, request: usize) -> Result<(), PoolError> {
        let gran = g.granularity;
        let exact = need.next_multiple_of(gran);
        let room = g.reserve_len - g.mapped;
        // Slow start: the chunk doubles with each grow since the last free.
        let cap = self.config.max_grow.max(self.config.min_grow);
        let amortised = self
            .config
            .min_grow
            .checked_shl(g.streak.min(20))
            .map_or(cap, |c| c.min(cap));
        let preferred = need.max(amortised).next_multiple_of(gran).min(room);
        if exact > room {
            g.tracker.s.ooms += 1;
            let cause = format!(
                "the pool's {}-byte address reservation is exhausted: {} bytes mapped, {exact} more needed",
                g.reserve_len, g.mapped
            );
            return Err(self.oom(g, request, cause));
        }
        let at = g.base + g.mapped as u64;
        let mut result = self.driver.map(at, preferred).map(|h| (h, preferred));
        if let Err(e) = &result {
            // The amortised size may not fit where the exact need still does.
            if e.is_oom() && preferred > exact {
                result = self.driver.map(at, exact).map(|h| (h, exact));
            }
        }
        match result {
            Ok((handle, len)) => {
                g.chunks.push(Chunk {
                    offset: g.mapped,
                    len,
                    handle,
                });
                g.mapped += len;
                g.streak += 1;
                g.tracker.s.calls.maps += 1;
                g.tracker.on_reserve(len);
                tracing::trace!(bytes = len, mapped = g.mapped, "vmm grew");
                Ok(())
            }
            Err(e) if e.is_oom() => {
                g.tracker.s.ooms += 1;
                Err(self.oom(g, request, e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn oom(&self, g: &Inner, request: usize, cause: String) -> PoolError {
        let stranded = g.holes.values().filter(|&&l| l < request).sum();
        let report = oom_report(
            self.driver.as_ref(),
            PoolKind::Vmm,
            request,
            &g.tracker.snapshot(),
            stranded,
            cause,
        );
        tracing::warn!(pool = "vmm", "{report}");
        PoolError::OutOfMemory(Box::new(report))
    }

    /// Best-fit hole for `n` bytes: smallest, then lowest offset.
    fn take_hole(holes: &mut BTreeMap<usize, usize>, n: usize) -> Option<usize> {
        let (&off, &len) = holes
            .iter()
            .filter(|(_, &l)| l >= n)
            .min_by_key(|(&o, &l)| (l, o))?;
        holes.remove(&off);
        if len > n {
            holes.insert(off + n, len - n);
        }
        Some(off)
    }

    /// Adds a free range below `top`, merging with its neighbours.
    fn add_hole(holes: &mut BTreeMap<usize, usize>, mut off: usize, mut len: usize) {
        if let Some((&p, &pl)) = holes.range(..off).next_back() {
            if p + pl == off {
                holes.remove(&p);
                off = p;
                len += pl;
            }
        }
        if let Some(nl) = holes.remove(&(off + len)) {
            len += nl;
        }
        holes.insert(off, len);
    }

    fn release_chunks(&self, g: &mut Inner, token: &SyncToken) -> Result<Released, PoolError> {
        let mut out = Released::default();
        let above_top: usize = g
            .chunks
            .iter()
            .filter(|c| c.offset >= g.top)
            .map(|c| c.len)
            .sum();
        if !token.covers(g.last_free) {
            out.deferred_bytes = above_top;
            return Ok(out);
        }
        while let Some(&c) = g.chunks.last() {
            if c.offset < g.top {
                break;
            }
            self.driver
                .unmap(g.base + c.offset as u64, c.len, c.handle)?;
            g.chunks.pop();
            g.mapped -= c.len;
            g.tracker.s.calls.unmaps += 1;
            g.tracker.on_release(c.len);
            out.bytes += c.len;
            out.buffers += 1;
        }
        if out.bytes > 0 {
            g.tracker.s.purges += 1;
            g.tracker.s.purged_bytes += out.bytes;
        }
        Ok(out)
    }
}

impl Pool for VmmPool {
    fn id(&self) -> PoolId {
        self.id
    }

    fn kind(&self) -> PoolKind {
        PoolKind::Vmm
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let size = checked_request(bytes)?;
        let n = size.next_multiple_of(VMM_ALIGN);
        let mut g = self.inner.lock();
        if !g.holes.is_empty() {
            if let Some(off) = Self::take_hole(&mut g.holes, n) {
                g.tracker.on_alloc(size, n);
                let ptr = g.base + off as u64;
                return Ok(Block {
                    ptr,
                    size,
                    capacity: n,
                    pool: self.id,
                    managed_fallback: false,
                });
            }
        }
        if g.base == 0 {
            self.reserve(&mut g)?;
        }
        let end = g.top + n;
        if end > g.mapped {
            let need = end - g.mapped;
            self.grow(&mut g, need, size)?;
        }
        let off = g.top;
        g.top = end;
        g.tracker.on_alloc(size, n);
        Ok(Block {
            ptr: g.base + off as u64,
            size,
            capacity: n,
            pool: self.id,
            managed_fallback: false,
        })
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
        let off = (block.ptr - g.base) as usize;
        let n = block.capacity;
        g.tracker.on_free(block.size, n);
        g.last_free = g.last_free.max(freed_at);
        g.streak = 0;
        if off + n == g.top {
            // LIFO: the top moves down, swallowing a hole that now touches it.
            g.top = off;
            if let Some((&h, &hl)) = g.holes.iter().next_back() {
                if h + hl == g.top {
                    g.holes.remove(&h);
                    g.top = h;
                }
            }
        } else {
            Self::add_hole(&mut g.holes, off, n);
        }
        Ok(())
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        if !token.is_for(self.driver.epoch()) {
            return Err(PoolError::WrongDevice {
                device: self.driver.ordinal(),
            });
        }
        match what {
            // Contiguous space never strands: a growing request reuses all of it.
            Purge::SmallerThan(_) | Purge::KeepFor(_) => Ok(Released::default()),
            Purge::All => {
                let mut g = self.inner.lock();
                let r = self.release_chunks(&mut g, token)?;
                if r.bytes > 0 || r.deferred_bytes > 0 {
                    tracing::debug!(
                        pool = "vmm",
                        released = r.bytes,
                        chunks = r.buffers,
                        deferred = r.deferred_bytes,
                        mapped = g.mapped,
                        "trimmed"
                    );
                }
                Ok(r)
            }
        }
    }

    fn releasable(&self, what: &Purge) -> usize {
        match what {
            Purge::All => {
                let g = self.inner.lock();
                g.chunks
                    .iter()
                    .filter(|c| c.offset >= g.top)
                    .map(|c| c.len)
                    .sum()
            }
            Purge::SmallerThan(_) | Purge::KeepFor(_) => 0,
        }
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
        VMM_ALIGN
    }
}

impl Drop for VmmPool {
    fn drop(&mut self) {
        let g = self.inner.get_mut();
        if g.base == 0 {
            return;
        }
        if g.tracker.s.live_blocks > 0 {
            tracing::warn!(
                pool = "vmm",
                blocks = g.tracker.s.live_blocks,
                "pool dropped with live blocks; their memory is unmapped"
            );
        }
        if let Err(e) = synchronize(self.driver.as_ref()) {
            tracing::error!(pool = "vmm", error = %e, "synchronize failed while dropping the pool");
        }
        for c in g.chunks.drain(..).rev() {
            if let Err(e) = self.driver.unmap(g.base + c.offset as u64, c.len, c.handle) {
                tracing::error!(pool = "vmm", error = %e, "unmap failed while dropping the pool");
            }
        }
        if let Err(e) = self.driver.release_reservation(g.base, g.reserve_len) {
            tracing::error!(pool = "vmm", error = %e, "address free failed while dropping the pool");
        }
    }
}
