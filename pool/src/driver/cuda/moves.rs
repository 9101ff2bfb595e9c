//! Moving a VMM page to another address while keeping its physical memory ([`crate::driver::Driver::remap`]):
//! what lets a pool recycle free pages instead of creating memory.

use super::{cuda_err, CudaDriver};
use crate::driver::{CallKind, DevicePtr, DriverError, PhysHandle};
use cudarc::driver::sys;

impl CudaDriver {
    /// [`crate::driver::Driver::remap`]: cuMemUnmap, then the same handle mapped at `to`.
    pub(super) fn move_mapping(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Unmap)?;
        // SAFETY: the caller hands over a mapping from `map` that nothing uses any more (it
        // synchronized since its last use); the handle stays alive, so the memory does too.
        unsafe { sys::cuMemUnmap(from, bytes) }
            .result()
            .map_err(|e| cuda_err(CallKind::Unmap, e, format!("{bytes} bytes at {from:#x}")))?;
        let moved = self.map_handle(to, bytes, handle);
        if let Err(e) = moved {
            // Keep the contract that a failed move leaves the memory where it was.
            if let Err(back) = self.map_handle(from, bytes, handle) {
                tracing::error!(error = %back, "could not map a page back where it was after a failed move: its range has no memory behind it");
            }
            return Err(e);
        }
        Ok(())
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
