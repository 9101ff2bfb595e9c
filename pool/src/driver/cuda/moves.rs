//! A VMM page's physical memory mapped at a second address, and that mapping dropped later
//! ([`crate::driver::Driver::alias`], [`crate::driver::Driver::unalias`]): what lets a pool
//! recycle free pages instead of creating memory, without waiting for the device.

use super::{cuda_err, CudaDriver};
use crate::driver::{CallKind, DevicePtr, DriverError, PhysHandle};
use cudarc::driver::sys;

impl CudaDriver {
    /// [`crate::driver::Driver::alias`]: the handle mapped at `to` too.
    pub(super) fn alias_mapping(
        &self,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Map)?;
        self.map_handle(to, bytes, handle)
    }

    /// [`crate::driver::Driver::unalias`]: cuMemUnmap alone; the handle stays alive, and with
    /// it the memory behind its other mapping.
    pub(super) fn unalias_mapping(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Unmap)?;
        // SAFETY: the caller hands over a second mapping from `alias` that nothing uses any
        // more (it synchronized since its last use); the handle is not released.
        unsafe { sys::cuMemUnmap(at, bytes) }
            .result()
            .map_err(|e| cuda_err(CallKind::Unmap, e, format!("{bytes} bytes at {at:#x}")))
    }

    /// Maps the existing `handle` at `at` and grants this device and its peers access; on a
    /// refused access the range is unmapped again.
    fn map_handle(
        &self,
        at: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        // SAFETY: maps a live handle of ours into a reserved range the caller owns, with
        // nothing mapped there.
        unsafe { sys::cuMemMap(at, bytes, 0, handle.0, 0) }
            .result()
            .map_err(|e| cuda_err(CallKind::Map, e, format!("{bytes} bytes at {at:#x}")))?;
        let (descs, n) = (self.access.as_ptr(), self.access.len());
        // SAFETY: the range was just mapped; `descs` holds `n` descriptors.
        let granted = unsafe { sys::cuMemSetAccess(at, bytes, descs, n) };
        if let Err(e) = granted.result() {
            // SAFETY: undoing our own map; the handle stays alive.
            let _ = unsafe { sys::cuMemUnmap(at, bytes) };
            return Err(cuda_err(
                CallKind::SetAccess,
                e,
                format!("{bytes} bytes at {at:#x}"),
            ));
        }
        Ok(())
    }
}
