//! Device memory as one VMM allocation per segment, made as `ncclMemAlloc` makes it: an address
//! range of its own with one physical handle behind it, rounded to the recommended
//! granularity, mapped read-write for this device and every peer that can reach it, with an
//! exportable handle where the driver allows (the driver decides both, for every mapping).
//!
//! Why a separate upstream: NCCL registers a buffer by the physical allocation behind its
//! address, and a range over several handles is not registered zero-copy. The VMM pool puts
//! many blocks, and pages of several handles, in one reservation; here a segment is exactly
//! one handle, so a caching layer above (a `torch.cuda.MemPool` registered with NCCL through
//! `register_mem_pool`) hands NCCL whole allocations.
//!
//! A release synchronizes the device first (`cuMemUnmap` does not wait for queued kernels, as
//! `cuMemFree` does), so the placement may release a segment the moment it is freed.

use super::{Grow, Upstream};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, PhysHandle};
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::collections::HashMap;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct VmmEach {
    driver: Arc<dyn Driver>,
    /// The recommended granularity, read at the first acquire (0 before).
    granularity: usize,
    /// Every segment held: its address, length and physical handle.
    held: HashMap<DevicePtr, (usize, PhysHandle)>,
}

impl VmmEach {
    /// VMM allocations of `driver`.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self {
            driver,
            granularity: 0,
            held: HashMap::new(),
        }
    }

    /// Segments held now.
    pub fn segments_held(&self) -> usize {
        self.held.len()
    }
}

impl Upstream for VmmEach {
    // `release` synchronizes the device before it unmaps.
    const RELEASE_WAITS: bool = true;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        if self.granularity == 0 {
            self.granularity = self.driver.granularity()?.max(1);
        }
        let len = want
            .alone
            .max(1)
            .checked_next_multiple_of(self.granularity)
            .ok_or_else(|| {
                DriverError::new(
                    CallKind::Reserve,
                    crate::driver::ErrorCode::InvalidValue,
                    format!(
                        "{} bytes rounded to the granularity of {} overflow",
                        want.alone, self.granularity
                    ),
                )
            })?;
        let base = self.driver.reserve(len, 0)?;
        calls.record(CallKind::Reserve);
        let handle = match self.driver.map(base, len) {
            Ok(h) => h,
            Err(e) => {
                // Nothing is mapped there: give the address range back; if even that fails the
                // range only costs address space, and the error that matters is the map's.
                if let Err(r) = self.driver.release_reservation(base, len) {
                    tracing::warn!(error = %r, base, len, "releasing the address range of a failed map");
                }
                return Err(e);
            }
        };
        // One map: create, map and access together, as the VMM pool counts them.
        calls.record(CallKind::Map);
        self.held.insert(base, (len, handle));
        Ok(Segment {
            ptr: base,
            len,
            handle: handle.0,
        })
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        let Some(&(len, handle)) = self.held.get(&seg.ptr) else {
            return Err(DriverError::new(
                CallKind::Unmap,
                crate::driver::ErrorCode::InvalidValue,
                format!(
                    "no allocation of this pool starts at {:#x} ({} bytes)",
                    seg.ptr, seg.len
                ),
            ));
        };
        crate::sync::synchronize(self.driver.as_ref())?;
        calls.record(CallKind::Synchronize);
        self.driver.unmap(seg.ptr, len, handle)?;
        calls.record(CallKind::Unmap);
        self.held.remove(&seg.ptr);
        // The memory is gone; a reservation that cannot be freed only holds address space.
        match self.driver.release_reservation(seg.ptr, len) {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(error = %e, ptr = seg.ptr, len, "freeing the address range of a released allocation")
            }
        }
        Ok(())
    }
}
