//! The simulated device's calls that move memory without allocating it: a second mapping of a
//! page's memory and its removal ([`crate::driver::Driver::alias`],
//! [`crate::driver::Driver::unalias`]), and copies between device and host memory.

use super::SimDevice;
use crate::driver::{CallKind, DevicePtr, DriverError, ErrorCode, PhysHandle};

impl SimDevice {
    /// [`crate::driver::Driver::alias`]: cuMemMap and cuMemSetAccess of `from`'s handle at
    /// `to`. The host pages behind `to` are new (a simulated page's contents do not follow it).
    pub(super) fn alias_mapping(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        // Checked as one step, so a refusal changes nothing.
        self.call(CallKind::Map, bytes, |s| {
            s.memory
                .alias_mapping(from, to, bytes, handle.0, self.config.granularity)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: `to` lies inside one of our reservations, aligned to the granularity,
            // over nothing mapped (checked above).
            if !unsafe { s.backing.commit(to, bytes) } {
                let undo = s.memory.unalias(to, bytes);
                debug_assert!(undo.is_ok());
                return Err((
                    ErrorCode::OutOfMemory,
                    "the host refused to commit the range".into(),
                ));
            }
            s.calls.enter(CallKind::SetAccess, bytes);
            Ok(())
        })
    }

    /// [`crate::driver::Driver::unalias`]: cuMemUnmap of a mapping whose memory is mapped
    /// elsewhere too.
    pub(super) fn unalias_mapping(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.call(CallKind::Unmap, bytes, |s| {
            s.memory
                .unalias(at, bytes)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: exactly a live mapping of ours, which the caller no longer uses.
            unsafe { s.backing.decommit(at, bytes) };
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
