//! Device memory, one `cuMemAlloc` per segment.

use super::{Grow, Upstream};
use crate::driver::{CallKind, Driver, DriverError};
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::sync::Arc;

/// See the module docs.
#[derive(Clone, Debug)]
pub struct DeviceMalloc {
    driver: Arc<dyn Driver>,
}

impl DeviceMalloc {
    /// Device memory of `driver`.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self { driver }
    }
}

impl Upstream for DeviceMalloc {
    // cuMemFree waits for the device.
    const RELEASE_WAITS: bool = true;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    // Each segment is the driver's: the upstream keeps nothing but the driver.
    fn copy_state(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn keeps_state(&self) -> bool {
        true
    }

    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        let bytes = want.alone;
        let ptr = self.driver.malloc(bytes)?;
        calls.record(CallKind::Malloc);
        Ok(Segment {
            ptr,
            len: bytes,
            handle: 0,
        })
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        self.driver.free(seg.ptr)?;
        calls.record(CallKind::Free);
        Ok(())
    }
}
