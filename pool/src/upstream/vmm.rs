//! One reserved address range, physical memory mapped at its end as the pool grows.
//!
//! Like ggml's VMM pool the range is reserved once (lazily, at the first growth); unlike ggml
//! its default size is the device's memory rather than a fixed 32 GiB, and running out of it
//! is an error, never an abort. Growth adapts like TCP's slow start: each growth maps at least
//! `min_grow`, doubling while the pool keeps growing with no free in between, up to
//! `max_grow`; a free starts it small again. A burst of growth amortises the ~45 µs cost of a
//! map over large chunks, while a pool that grows once per ubatch stays within a granule or
//! two of its need. If the amortised size does not fit, the exact need is tried.

use super::Upstream;
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, PhysHandle};
use crate::invalid::InvalidConfig;
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::sync::Arc;

/// The largest reservation or growth step accepted (256 TiB).
const MAX_BYTES: usize = 1 << 48;

/// The VMM pool's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmConfig {
    /// Address space to reserve, 1 byte to 256 TiB (rounded up to the granularity); `None`:
    /// the device's total memory (ggml: a fixed 32 GiB, which caps the pool below the card on
    /// large GPUs).
    pub reserve_bytes: Option<usize>,
    /// Smallest growth (rounded up to the granularity), 0 to 256 TiB: what a growth maps after
    /// a free.
    pub min_grow: usize,
    /// Largest amortised growth, 0 to 256 TiB: consecutive growths double from `min_grow` up
    /// to this. A single larger request still maps what it needs.
    pub max_grow: usize,
    /// The placement rounds requests above 1 MiB up to a multiple of this: a power of two,
    /// 128 bytes (ggml's rounding, the default) to 1 GiB. libcupool uses the 2 MiB granule,
    /// which suits PyTorch's traffic (`CUPOOL_VMM_ROUND_LARGE`).
    pub large_rounding: usize,
}

impl Default for VmmConfig {
    fn default() -> Self {
        Self {
            reserve_bytes: None,
            min_grow: 2 << 20,
            max_grow: 64 << 20,
            large_rounding: 128,
        }
    }
}

impl VmmConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if let Some(b) = self.reserve_bytes {
            InvalidConfig::range("VmmConfig::reserve_bytes", b, 1, MAX_BYTES)?;
        }
        InvalidConfig::range("VmmConfig::min_grow", self.min_grow, 0, MAX_BYTES)?;
        InvalidConfig::range("VmmConfig::max_grow", self.max_grow, 0, MAX_BYTES)?;
        if !self.large_rounding.is_power_of_two() || !(128..=1 << 30).contains(&self.large_rounding)
        {
            return Err(InvalidConfig::new(
                "VmmConfig::large_rounding",
                self.large_rounding,
                "a power of two from 128 to 1073741824",
            ));
        }
        Ok(())
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct VmmReserve {
    driver: Arc<dyn Driver>,
    config: VmmConfig,
    /// Base of the reservation; 0 until the first growth reserves it.
    base: DevicePtr,
    len: usize,
    granularity: usize,
    /// Bytes mapped from `base`.
    mapped: usize,
    /// Growths since the last free: the amortised step is `min_grow << streak`.
    streak: u32,
}

impl VmmReserve {
    /// A range on `driver`; the configuration must have passed [`VmmConfig::validate`].
    pub fn new(driver: Arc<dyn Driver>, config: VmmConfig) -> Self {
        Self {
            driver,
            config,
            base: 0,
            len: 0,
            granularity: 0,
            mapped: 0,
            streak: 0,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &VmmConfig {
        &self.config
    }

    /// Bytes currently mapped.
    pub fn mapped(&self) -> usize {
        self.mapped
    }

    #[cold]
    fn reserve(&mut self, calls: &mut DriverCalls) -> Result<(), DriverError> {
        let gran = self.driver.granularity()?;
        let want = match self.config.reserve_bytes {
            Some(b) => b,
            None => self.driver.mem_info()?.total,
        };
        let len = want
            .max(gran)
            .checked_next_multiple_of(gran)
            .ok_or_else(|| {
                DriverError::new(
                    CallKind::Reserve,
                    ErrorCode::InvalidValue,
                    format!("{want} bytes rounded to the granularity {gran} overflows"),
                )
            })?;
        let base = self.driver.reserve(len)?;
        calls.record(CallKind::Reserve);
        (self.base, self.len, self.granularity) = (base, len, gran);
        tracing::debug!(
            base = format_args!("{base:#x}"),
            bytes = len,
            granularity = gran,
            "vmm reserved address space"
        );
        Ok(())
    }

    fn map(&self, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.driver.map(self.base + self.mapped as u64, bytes)
    }
}

impl Upstream for VmmReserve {
    // Unmapping does not wait for queued kernels: only a purge after a synchronize may.
    const RELEASE_WAITS: bool = false;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn acquire(&mut self, bytes: usize, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        if self.base == 0 {
            self.reserve(calls)?;
        }
        let gran = self.granularity;
        let room = self.len - self.mapped;
        let exact = bytes.checked_next_multiple_of(gran).unwrap_or(usize::MAX);
        if exact > room {
            return Err(DriverError::new(
                CallKind::Reserve,
                ErrorCode::OutOfMemory,
                format!(
                    "the pool's {}-byte address reservation is exhausted: {} bytes mapped, {exact} more needed",
                    self.len, self.mapped
                ),
            ));
        }
        let cap = self.config.max_grow.max(self.config.min_grow);
        let amortised = self
            .config
            .min_grow
            .checked_shl(self.streak.min(20))
            .map_or(cap, |c| c.min(cap));
        let preferred = bytes
            .max(amortised)
            .checked_next_multiple_of(gran)
            .map_or(room, |p| p.min(room));
        let mut result = self.map(preferred).map(|h| (h, preferred));
        if matches!(&result, Err(e) if e.is_oom()) && preferred > exact {
            result = self.map(exact).map(|h| (h, exact));
        }
        let (handle, len) = result?;
        calls.record(CallKind::Map);
        let seg = Segment {
            ptr: self.base + self.mapped as u64,
            len,
            handle: handle.0,
        };
        self.mapped += len;
        self.streak += 1;
        Ok(seg)
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        if seg.ptr + seg.len as u64 != self.base + self.mapped as u64 {
            return Err(DriverError::new(
                CallKind::Unmap,
                ErrorCode::InvalidValue,
                format!(
                    "{} bytes at {:#x} are not the end of the mapped range",
                    seg.len, seg.ptr
                ),
            ));
        }
        self.driver
            .unmap(seg.ptr, seg.len, PhysHandle(seg.handle))?;
        calls.record(CallKind::Unmap);
        self.mapped -= seg.len;
        Ok(())
    }

    #[inline]
    fn note_free(&mut self) {
        self.streak = 0;
    }

    fn close(&mut self, _calls: &mut DriverCalls) -> Result<(), DriverError> {
        if self.base != 0 && self.mapped == 0 {
            self.driver.release_reservation(self.base, self.len)?;
            self.base = 0;
        }
        Ok(())
    }
}
