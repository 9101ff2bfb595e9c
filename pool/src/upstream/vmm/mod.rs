//! Reserved address ranges, handed out as segments at the end of the last as the pool grows,
//! with physical memory put behind them where blocks land.
//!
//! Like ggml's VMM pool the address space is reserved lazily, at the first growth; unlike ggml
//! it has no fixed size and no cap. Each reservation covers [`VmmConfig::reserve_bytes`] (the
//! device's memory by default, not ggml's fixed 32 GiB). When the last one is full, the pool
//! reserves another, asking the driver for the range right after it (cuMemAddressReserve's
//! address hint): where it gets it, growth goes on contiguously across the boundary (one
//! segment may cover the end of one reservation and the start of the next) and the placement
//! sees one range; where it does not, the new reservation is a range of its own, and a block
//! never spans two of them (see [`crate::placement::bump`]). A reservation the driver refuses
//! as out of memory is retried at half the size, down to what the growth needs, so a device
//! with little address space (Jetson) works, and the smaller size is kept for the next ones.
//! Reservations after the first are released as soon as a trim gives back everything in them;
//! the first when the pool closes (`space.rs`).
//!
//! A growth hands out address space only; the pool core then asks for memory behind the block
//! it placed ([`Upstream::back`]), which recycles free pages from holes first (`recycle.rs`).
//! Growth adapts like TCP's slow start: at least `min_grow`, doubling while the pool grows with
//! no free in between, up to `max_grow`; memory made for a growth covers its whole segment (the
//! block alone where that does not fit), and a free starts it small again: a burst amortises a
//! map's ~45 µs over large chunks, and a pool that grows once per ubatch stays near its need.
//! Segments apart (a reservation each, released in any order) serve a placement's lanes
//! (`apart.rs`).

mod ahead;
mod apart;
mod config;
mod copy;
mod grow;
mod recycle;
mod runs;
mod sleep;
mod space;
mod stale;
mod unmap;
mod view;

pub use ahead::Ahead;
pub use config::VmmConfig;

use super::{Grow, Upstream};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode};
use crate::placement::Segment;
use crate::pool::Moved;
use crate::stats::DriverCalls;
use space::AddressSpace;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct VmmReserve {
    driver: Arc<dyn Driver>,
    config: VmmConfig,
    /// The driver's granularity; 0 until the first growth asks for it.
    granularity: usize,
    /// Size of the next reservation: the configured size, halved where the driver refused it.
    reserve_len: usize,
    space: AddressSpace,
    /// Growths since the last free: the amortised step is `min_grow << streak`.
    streak: u32,
    /// Pages are created in pieces of [`VmmReserve::page`] bytes, so they can move: with
    /// [`VmmConfig::recycle`].
    granular: bool,
    /// [`VmmConfig::recycle_page`] rounded to the granularity; set with it.
    page: usize,
    /// The segment the last growth handed out (start, end), until the block placed in it is
    /// backed: only that block's backing covers the rest of its segment (the amortised step).
    fresh: Option<(DevicePtr, DevicePtr)>,
    /// Pages asked for ahead of need, not taken in yet (`ahead.rs`).
    in_flight: ahead::InFlight,
}

impl VmmReserve {
    /// A pool's address space on `driver`; the configuration must have passed
    /// [`VmmConfig::validate`].
    pub fn new(driver: Arc<dyn Driver>, config: VmmConfig) -> Self {
        Self {
            driver,
            granular: config.recycle,
            config,
            granularity: 0,
            reserve_len: 0,
            space: AddressSpace::default(),
            streak: 0,
            page: 0,
            fresh: None,
            in_flight: Default::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    fn round(&self, bytes: usize) -> Result<usize, DriverError> {
        let gran = self.granularity;
        bytes
            .max(1)
            .checked_next_multiple_of(gran)
            .filter(|&b| b <= config::MAX_BYTES)
            .ok_or_else(|| {
                DriverError::new(
                    CallKind::Reserve,
                    ErrorCode::OutOfMemory,
                    format!("{bytes} bytes rounded to the granularity {gran} is beyond any device's address space"),
                )
            })
    }

    /// The granularity and the first reservation's size, asked of the driver once (again at
    /// the next growth if either call fails).
    #[cold]
    fn init(&mut self) -> Result<(), DriverError> {
        let gran = self.driver.granularity()?;
        let want = match self.config.reserve_bytes {
            Some(b) => b,
            None => self.driver.mem_info()?.total,
        };
        self.granularity = gran;
        match self
            .round(want)
            .and_then(|len| Ok((len, self.round(self.config.recycle_page)?)))
        {
            Ok((len, page)) => {
                self.reserve_len = len;
                self.page = page;
                Ok(())
            }
            Err(e) => {
                self.granularity = 0;
                Err(e)
            }
        }
    }

    /// What this growth would like to hand out, at least `need` and at most `room`.
    fn preferred(&self, need: usize, room: usize) -> usize {
        let cap = self.config.max_grow.max(self.config.min_grow);
        let amortised = self
            .config
            .min_grow
            .checked_shl(self.streak.min(20))
            .map_or(cap, |c| c.min(cap));
        need.max(amortised)
            .checked_next_multiple_of(self.granularity)
            .map_or(room, |p| p.min(room))
    }

    /// Backs `[from, to)` from `donors`, then with new pages.
    fn back_range(
        &mut self,
        range: (DevicePtr, DevicePtr),
        donors: &mut recycle::Donors,
        calls: &mut DriverCalls,
    ) -> Result<recycle::Backed, DriverError> {
        let page = if self.granular { self.page } else { 0 };
        let driver = self.driver.clone();
        self.space.back(driver.as_ref(), range, donors, page, calls)
    }
}

impl Upstream for VmmReserve {
    // Unmapping does not wait for queued kernels: only a purge after a synchronize may.
    const RELEASE_WAITS: bool = false;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn copy_state(&self) -> Option<Self> {
        self.copied()
    }

    fn keeps_state(&self) -> bool {
        self.copyable()
    }

    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        if self.granularity == 0 {
            self.init()?;
        }
        let extend = self.round(want.extend)?;
        let alone = self.round(want.alone.max(want.extend))?;
        let seg = match self.space.tail() {
            None => {
                // The first reservation stays until the pool closes.
                let (base, len) = self.reserve(alone, 0, calls)?;
                let want = self.preferred(alone, len);
                self.space.claim(base, want)?
            }
            Some(tail) => {
                let need = if tail.extends { extend } else { alone };
                if need <= tail.room {
                    let want = self.preferred(need, tail.room);
                    self.space.claim(tail.at, want)?
                } else {
                    self.grow_further(tail, extend, alone, calls)?
                }
            }
        };
        self.streak += 1;
        self.fresh = Some((seg.ptr, seg.ptr + seg.len as u64));
        Ok(seg)
    }

    fn acquire_apart(&mut self, len: usize, c: &mut DriverCalls) -> Result<Segment, DriverError> {
        self.reserve_apart(len, c)
    }

    #[inline]
    fn backed(&self, addr: u64, len: usize) -> bool {
        self.space.backed(addr, len)
    }

    fn wholly_vacant(&self, seg: &Segment) -> bool {
        let end = seg.ptr + seg.len as u64;
        self.space.pages.range(seg.ptr..end).next().is_none()
            && !self.space.has_stale_in(seg.ptr, end)
    }

    fn recycles(&self) -> bool {
        self.config.recycle
    }

    fn worth_recycling(&self, cached: usize, reserved: usize) -> bool {
        let free = self.config.recycle_free as u128;
        self.config.recycle && cached as u128 * 100 > reserved as u128 * free
    }

    fn unbacked(&self, addr: u64, len: usize) -> usize {
        // Pages in flight will be there: the placement weighs the memory as made.
        let n = self.space.unbacked_now(self.driver.epoch(), addr, len);
        if self.in_flight.is_empty() || n == usize::MAX {
            return n;
        }
        n.saturating_sub(self.in_flight.overlap(addr, len))
    }

    fn must_wait(&mut self, addr: u64, len: usize) -> bool {
        let floor = self.config.min_grow;
        self.space.must_wait(self.driver.epoch(), addr, len, floor)
    }

    fn movable(&mut self, donors: &[(u64, usize)]) -> bool {
        if !self.config.recycle || self.granularity == 0 {
            return false;
        }
        !self.space.donor_pages(donors).is_empty()
    }

    fn back(
        &mut self,
        addr: u64,
        len: usize,
        donors: &[(u64, usize)],
        idle: bool,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let gran = self.granularity.max(1) as u64;
        let range = (
            addr / gran * gran,
            (addr + len as u64).next_multiple_of(gran),
        );
        // Donors' pages move and vacant ranges fill: nothing may be in flight.
        self.settle_ahead(calls);
        let pages = (!donors.is_empty()).then(|| self.space.donor_pages(donors));
        let mut pages = recycle::Donors {
            pages: pages.unwrap_or_default(),
            idle,
        };
        // A growth's new segment: memory created for it covers all of it (the amortised
        // step), as one growth used to map it all. Without recycling that is one page, tried
        // first; with it, pages go behind the block first and the rest is best effort.
        // Only a block in the segment a growth just handed out; a block that lands on vacant
        // address space of an older segment gets memory for itself alone.
        let rest = self
            .fresh
            .take()
            .filter(|&(p, e)| range.1 > p && range.1 < e)
            .map(|(_, e)| e);
        if let (false, Some(end)) = (self.granular, rest) {
            match self.back_range((range.0, end), &mut Default::default(), calls) {
                Err(e) if e.is_oom() => {
                    tracing::debug!(error = %e, "the amortised vmm growth does not fit; backing the block alone");
                }
                other => return other.map(|_| ()),
            }
        }
        let done = self.back_range(range, &mut pages, calls)?;
        if done.moved > 0 {
            tracing::trace!(
                moved = done.moved,
                created = done.created,
                "vmm recycled free pages"
            );
        }
        if let Some(end) = rest.filter(|_| done.created > 0 && self.granular) {
            if let Err(e) = self.back_range((range.1, end), &mut Default::default(), calls) {
                tracing::debug!(error = %e, "could not map the amortised rest of a vmm growth; the block alone is backed");
            }
        }
        Ok(())
    }

    fn shed(&mut self, unused: &[(u64, usize)], calls: &mut DriverCalls) -> usize {
        // Only pages in flight inside what is shed must be there first.
        if unused
            .iter()
            .any(|&(a, l)| self.in_flight.overlap(a, l) > 0)
        {
            self.settle_ahead(calls);
        }
        let driver = self.driver.clone();
        self.space.shed(driver.as_ref(), unused, calls)
    }

    fn held(&self) -> Option<usize> {
        Some(self.space.held())
    }

    fn back_ahead(&mut self, addr: u64, len: usize, calls: &mut DriverCalls) {
        self.map_ahead(addr, len, calls)
    }

    #[inline]
    fn collect_ahead(&mut self, wait: bool, calls: &mut DriverCalls) -> bool {
        !self.in_flight.is_empty() && self.take_ahead(wait, calls)
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        self.settle_ahead(calls);
        self.release_segment(seg, calls)
    }

    fn apart_held(&self, seg: &Segment) -> Option<usize> {
        self.space
            .is_apart(seg)
            .then(|| seg.len - self.space.unbacked(seg.ptr, seg.len))
    }

    #[inline]
    fn note_free(&mut self) {
        self.streak = 0;
    }

    fn close(&mut self, calls: &mut DriverCalls) -> Result<(), DriverError> {
        self.settle_ahead(calls);
        self.space.close(self.driver.as_ref())
    }

    const CAN_SLEEP: bool = true;

    fn sleep(&mut self, offload: bool, calls: &mut DriverCalls) -> Result<Moved, DriverError> {
        self.settle_ahead(calls);
        self.space.sleep(self.driver.as_ref(), offload, calls)
    }

    fn wake(&mut self, calls: &mut DriverCalls) -> Result<Moved, DriverError> {
        self.settle_ahead(calls);
        let driver = self.driver.clone();
        let r = self.space.wake(driver.as_ref(), calls);
        // Growth after a wake starts small, as after a free.
        self.streak = 0;
        r
    }

    fn asleep_bytes(&self) -> usize {
        self.space.asleep()
    }

    fn drop_host_buffers(&mut self) -> usize {
        self.space.drop_spares()
    }
}
