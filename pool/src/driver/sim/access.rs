//! Reading and writing the simulated device's memory from the host, for tests and CPU code.

use super::SimDevice;
use crate::driver::{CallKind, DevicePtr, DriverError, ErrorCode};

impl SimDevice {
    /// Whether `[ptr, ptr+len)` lies inside memory the device handed out and still holds:
    /// one live allocation, or a run of adjacent live mappings.
    pub fn contains(&self, ptr: DevicePtr, len: usize) -> bool {
        self.state.lock().memory.contains(ptr, len)
    }

    /// Copies `data` to device memory at `ptr`, after checking the range is live.
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), DriverError> {
        self.check_range(ptr, data.len())?;
        // SAFETY: the range lies inside live, readable and writable host memory of ours.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
        Ok(())
    }

    /// Copies `len` bytes of device memory at `ptr`, after checking the range is live.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, DriverError> {
        self.check_range(ptr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len) };
        Ok(out)
    }

    fn check_range(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        if !self.config.backed {
            return Err(DriverError::new(
                CallKind::MemInfo,
                ErrorCode::NotSupported,
                "this simulated device is not backed by host memory (a dry-run device): nothing can be read or written",
            ));
        }
        if self.contains(ptr, len) {
            Ok(())
        } else {
            Err(DriverError::new(
                CallKind::MemInfo,
                ErrorCode::InvalidValue,
                format!("{len} bytes at {ptr:#x} are not inside live device memory"),
            ))
        }
    }
}
