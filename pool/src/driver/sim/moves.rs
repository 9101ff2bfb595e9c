//! The simulated device's calls that move memory without allocating it: a mapping moved to
//! another address ([`crate::driver::Driver::remap`]), and copies between device and host memory.

use super::SimDevice;
use crate::driver::{CallKind, DevicePtr, DriverError, ErrorCode, PhysHandle};

impl SimDevice {
    /// [`crate::driver::Driver::remap`]: cuMemUnmap at `from`, cuMemMap and cuMemSetAccess at `to`.
    pub(super) fn move_mapping(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        // Checked as one step, so a refusal leaves the mapping where it was.
        self.call(CallKind::Unmap, bytes, |s| {
            s.memory
                .move_mapping(from, to, bytes, handle.0, self.config.granularity)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: `to` lies inside one of our reservations, aligned to the granularity
            // (checked above); `from` was a live mapping of ours that the caller gave up.
            let committed = unsafe { s.backing.commit(to, bytes) };
            if !committed {
                let back = s.memory.move_mapping(to, from, bytes, handle.0, 1);
                debug_assert!(back.is_ok());
                return Err((
                    ErrorCode::OutOfMemory,
                    "the host refused to commit the range".into(),
                ));
            }
            // SAFETY: as above; nothing uses `from` any more.
            unsafe { s.backing.decommit(from, bytes) };
            s.calls.enter(CallKind::Map, bytes);
            s.calls.enter(CallKind::SetAccess, bytes);
            Ok(())
        })
    }

    /// [`crate::driver::Driver::copy_to_host`].
    pub(super) fn copy_out(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        let backed = self.config.backed;
        self.call(CallKind::Copy, dst.len(), |s| {
            if !s.memory.contains(src, dst.len()) {
                return Err(not_live("copy", src, dst.len()));
            }
            if backed {
                // SAFETY: the range lies inside live, readable host memory of ours (checked
                // above); the lock keeps it mapped while we read.
                let from = unsafe { std::slice::from_raw_parts(src as *const u8, dst.len()) };
                dst.copy_from_slice(from);
            }
            Ok(())
        })
    }

    /// [`crate::driver::Driver::copy_from_host`].
    pub(super) fn copy_in(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        let backed = self.config.backed;
        self.call(CallKind::Copy, src.len(), |s| {
            if !s.memory.contains(dst, src.len()) {
                return Err(not_live("copy", dst, src.len()));
            }
            if backed {
                // SAFETY: the range lies inside live, writable host memory of ours (checked
                // above); the lock keeps it mapped while we write.
                let to = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, src.len()) };
                to.copy_from_slice(src);
            }
            Ok(())
        })
    }
}

fn not_live(what: &str, ptr: DevicePtr, bytes: usize) -> (ErrorCode, String) {
    (
        ErrorCode::InvalidValue,
        format!("{what} of {bytes} bytes at {ptr:#x}: not live device memory"),
    )
}
