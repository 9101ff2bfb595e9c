//! What the kernels' launch choices read from a device: its multiprocessors (the split-KV and
//! stream-k counts, as ggml's `ggml_cuda_info` has them) and its compute capability.

use crate::cuda::KernelError;
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice_attribute};

/// What kernels' launch choices read from a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    /// Compute capability as ggml writes it: 900 for 9.0.
    pub compute_capability: u32,
}

impl DeviceFacts {
    /// The facts of CUDA device `ordinal`, through the driver API (no context is made).
    /// `None` when the CUDA driver library is not on this machine; an error when the driver
    /// cannot start, has no such device, or reports a value that is no count.
    pub fn query(ordinal: usize) -> Result<Option<Self>, KernelError> {
        // SAFETY: only tries to open the shared library; no CUDA call is made.
        if !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        let ordinal = i32::try_from(ordinal)
            .map_err(|_| KernelError::Unsupported(format!("device ordinal {ordinal}")))?;
        result::init()?;
        let dev = result::device::get(ordinal)?;
        let get = |a: CUdevice_attribute| -> Result<u32, KernelError> {
            // SAFETY: `dev` came from `cuDeviceGet` above.
            let v = unsafe { result::device::get_attribute(dev, a) }?;
            u32::try_from(v).map_err(|_| {
                KernelError::Unsupported(format!("device {ordinal} reports {v} for {a:?}"))
            })
        };
        let multiprocessors = get(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let major = get(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = get(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(Some(Self {
            multiprocessors: multiprocessors as usize,
            compute_capability: 100 * major + 10 * minor,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver library the query says so, without a panic; with one it either fails
    /// cleanly (no device) or reports sane numbers.
    #[test]
    fn the_query_never_panics() {
        // SAFETY: only tries to open the shared library.
        let present = unsafe { sys::is_culib_present() };
        match DeviceFacts::query(0) {
            Ok(None) => assert!(!present),
            Ok(Some(f)) => {
                assert!(f.multiprocessors > 0, "{f:?}");
                assert!(f.compute_capability >= 500, "{f:?}");
            }
            Err(e) => assert!(present, "{e}"),
        }
    }
}
