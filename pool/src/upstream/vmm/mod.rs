//! Reserved address ranges, physical memory mapped at the end of the last as the pool grows.
//!
//! Like ggml's VMM pool the address space is reserved lazily, at the first growth; unlike ggml
//! it has no fixed size and no cap. Each reservation covers [`VmmConfig::reserve_bytes`] (the
//! device's memory by default, not ggml's fixed 32 GiB). When the last one is full, the pool
//! reserves another, asking the driver for the range right after it (cuMemAddressReserve's
//! address hint): where it gets it, growth goes on contiguously across the boundary (one
//! growth may map the end of one reservation and the start of the next) and the placement
//! sees one range; where it does not, the new reservation is a range of its own, and a block
//! never spans two of them (see [`crate::placement::bump`]). A reservation the driver refuses
//! as out of memory is retried at half the size, down to what the growth needs, so a device
//! with little address space (Jetson) works, and the smaller size is kept for the next ones.
//! Reservations after the first are released as soon as a trim unmaps everything in them; the
//! first when the pool closes (`space.rs`).
//!
//! Growth adapts like TCP's slow start: each growth maps at least `min_grow`, doubling while
//! the pool keeps growing with no free in between, up to `max_grow`; a free starts it small
//! again. A burst of growth amortises the ~45 µs cost of a map over large chunks, while a
//! pool that grows once per ubatch stays within a granule or two of its need. If the
//! amortised size does not fit, the exact need is tried.

mod config;
mod sleep;
mod space;
mod unmap;

pub use config::VmmConfig;

use super::{Grow, Upstream};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode};
use crate::placement::Segment;
use crate::pool::Moved;
use crate::stats::DriverCalls;
use space::{AddressSpace, Tail};
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
}

impl VmmReserve {
    /// A pool's address space on `driver`; the configuration must have passed
    /// [`VmmConfig::validate`].
    pub fn new(driver: Arc<dyn Driver>, config: VmmConfig) -> Self {
        Self {
            driver,
            config,
            granularity: 0,
            reserve_len: 0,
            space: AddressSpace::default(),
            streak: 0,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    /// Bytes currently mapped.
    pub fn mapped(&self) -> usize {
        self.space.mapped()
    }

    /// Address reservations currently held.
    pub fn reservations(&self) -> usize {
        self.space.reservations()
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
        match self.round(want) {
            Ok(len) => {
                self.reserve_len = len;
                Ok(())
            }
            Err(e) => {
                self.granularity = 0;
                Err(e)
            }
        }
    }

    /// What this growth would like to map, at least `need` and at most `room`.
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

    /// Maps the preferred size at `at`, else the exact need if that was out of memory.
    fn map(
        &mut self,
        at: DevicePtr,
        need: usize,
        room: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let preferred = self.preferred(need, room);
        let driver = self.driver.clone();
        let result = self.space.map(driver.as_ref(), at, preferred, calls);
        match result {
            Err(e) if e.is_oom() && preferred > need => {
                self.space.map(driver.as_ref(), at, need, calls)
            }
            other => other,
        }
    }

    /// A further reservation of at least `need` bytes, at `hint` if the driver places it
    /// there. A size the driver refused is not asked for again.
    #[cold]
    fn reserve(
        &mut self,
        need: usize,
        hint: DevicePtr,
        calls: &mut DriverCalls,
    ) -> Result<(DevicePtr, usize), DriverError> {
        let driver = self.driver.clone();
        let (base, len) = self.space.reserve(
            driver.as_ref(),
            self.reserve_len,
            need,
            hint,
            self.granularity,
            calls,
        )?;
        if len < self.reserve_len {
            tracing::info!(
                refused = self.reserve_len,
                reserved = len,
                "the driver refused a vmm reservation of the configured size; later ones are smaller too"
            );
            self.reserve_len = len;
        }
        Ok((base, len))
    }

    /// Grows into a further reservation: right after `tail`'s if the driver places it there,
    /// continuing the mapped end (so it needs only what the last one lacks, which matters
    /// where address space is scarce); else anywhere, holding `alone` bytes by itself.
    #[cold]
    fn grow_further(
        &mut self,
        tail: Tail,
        extend: usize,
        alone: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let driver = self.driver.clone();
        let least = if tail.extends {
            extend - tail.room
        } else {
            alone
        };
        let (mut base, mut len) = self.reserve(least, tail.end, calls)?;
        let contiguous = base == tail.end && tail.extends;
        if !contiguous && len < alone {
            // Placed elsewhere, and too small to hold the request by itself.
            self.space.drop_empty_tail(driver.as_ref());
            (base, len) = self.reserve(alone, 0, calls)?;
        }
        let result = if contiguous {
            self.map(tail.at, extend, tail.room + len, calls)
        } else {
            self.map(base, alone, len, calls)
        };
        if result.is_err() {
            // Leave the address space as it was.
            self.space.drop_empty_tail(driver.as_ref());
        }
        result
    }
}

impl Upstream for VmmReserve {
    // Unmapping does not wait for queued kernels: only a purge after a synchronize may.
    const RELEASE_WAITS: bool = false;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        if self.granularity == 0 {
            self.init()?;
        }
        let extend = self.round(want.extend)?;
        let alone = self.round(want.alone.max(want.extend))?;
        let seg = match self.space.tail() {
            None => {
                // The first reservation stays until the pool closes, also if this map fails.
                let (base, len) = self.reserve(alone, 0, calls)?;
                self.map(base, alone, len, calls)?
            }
            Some(tail) => {
                let need = if tail.extends { extend } else { alone };
                if need <= tail.room {
                    self.map(tail.at, need, tail.room, calls)?
                } else {
                    self.grow_further(tail, extend, alone, calls)?
                }
            }
        };
        self.streak += 1;
        Ok(seg)
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        let driver = self.driver.clone();
        self.space.unmap(driver.as_ref(), &seg, calls)
    }

    fn take_leftovers(&mut self) -> Vec<Segment> {
        self.space.take_leftovers()
    }

    #[inline]
    fn note_free(&mut self) {
        self.streak = 0;
    }

    fn close(&mut self, _calls: &mut DriverCalls) -> Result<(), DriverError> {
        let driver = self.driver.clone();
        self.space.close(driver.as_ref())
    }

    const CAN_SLEEP: bool = true;

    fn sleep(&mut self, offload: bool, calls: &mut DriverCalls) -> Result<Moved, DriverError> {
        let driver = self.driver.clone();
        self.space.sleep(driver.as_ref(), offload, calls)
    }

    fn wake(&mut self, calls: &mut DriverCalls) -> Result<Moved, DriverError> {
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
