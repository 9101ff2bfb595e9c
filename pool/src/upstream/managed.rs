//! Managed (unified) memory, one `cuMemAllocManaged` per segment, never beyond what the device
//! has free (counting every managed allocation on the device, by any pool) unless
//! oversubscription is allowed: asking a real GPU for more can hang it for everyone.

use super::{Grow, Upstream};
use crate::driver::{CallKind, Driver, DriverError};
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct ManagedMalloc {
    driver: Arc<dyn Driver>,
    allow_oversubscription: bool,
}

impl ManagedMalloc {
    /// Managed memory of `driver`.
    pub fn new(driver: Arc<dyn Driver>, allow_oversubscription: bool) -> Self {
        Self {
            driver,
            allow_oversubscription,
        }
    }
}

impl Upstream for ManagedMalloc {
    // cuMemFree waits for the device.
    const RELEASE_WAITS: bool = true;

    fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError> {
        let bytes = want.alone;
        let ledger = &self.driver.shared().managed;
        ledger.admit(bytes, self.allow_oversubscription, || {
            self.driver.managed_headroom()
        })?;
        match self.driver.malloc_managed(bytes) {
            Ok(ptr) => {
                calls.record(CallKind::MallocManaged);
                Ok(Segment {
                    ptr,
                    len: bytes,
                    handle: 0,
                })
            }
            Err(e) => {
                ledger.release(bytes);
                Err(e)
            }
        }
    }

    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError> {
        self.driver.free_managed(seg.ptr)?;
        self.driver.shared().managed.release(seg.len);
        calls.record(CallKind::FreeManaged);
        Ok(())
    }
}
