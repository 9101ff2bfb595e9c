//! Physical memory for VMM mappings: its properties (this device, exportable as a POSIX file
//! descriptor where the device allows, as `ncclMemAlloc` makes it) and its creation, which
//! falls back to plain memory once a driver refuses the exportable kind.

use super::{cuda_err, CudaDriver};
use crate::driver::{CallKind, DriverError};
use cudarc::driver::sys;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

impl CudaDriver {
    /// The properties of the physical memory this driver creates (and whose granularity it reads).
    pub(super) fn prop(&self) -> sys::CUmemAllocationProp {
        self.prop_with(self.exportable.load(Ordering::Relaxed))
    }

    /// The properties of this device's physical memory, exportable as a POSIX file descriptor
    /// or not.
    fn prop_with(&self, exportable: bool) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is a valid (empty) value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ctx.ordinal() as i32;
        if exportable {
            prop.requestedHandleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        prop
    }

    /// Creates `bytes` of physical memory. When an exportable create is refused as unsupported,
    /// not permitted or an invalid value (a driver that advertises file-descriptor handles may
    /// still refuse them, as in some containers) and the same memory created plain succeeds,
    /// every later create is plain, with a warning; any other error is the caller's.
    pub(super) fn create(
        &self,
        bytes: usize,
    ) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
        let exportable = self.exportable.load(Ordering::Relaxed);
        match self.create_with(bytes, exportable) {
            Err(e)
                if exportable
                    && matches!(
                        e.0,
                        sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
                            | sys::CUresult::CUDA_ERROR_NOT_PERMITTED
                            | sys::CUresult::CUDA_ERROR_INVALID_VALUE
                    ) =>
            {
                let handle = self.create_with(bytes, false).map_err(|plain| {
                    cuda_err(
                        CallKind::Create,
                        plain,
                        format!("{bytes} bytes (exportable: {e})"),
                    )
                })?;
                if self.exportable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(device = self.ctx.ordinal(), error = %e, "exportable physical memory refused: creating plain memory from now on (NCCL cannot register it without a copy)");
                }
                Ok(handle)
            }
            made => made.map_err(|e| cuda_err(CallKind::Create, e, format!("{bytes} bytes"))),
        }
    }

    fn create_with(
        &self,
        bytes: usize,
        exportable: bool,
    ) -> Result<sys::CUmemGenericAllocationHandle, cudarc::driver::result::DriverError> {
        let prop = self.prop_with(exportable);
        let mut handle = MaybeUninit::<sys::CUmemGenericAllocationHandle>::uninit();
        // SAFETY: creates physical memory; `handle` is written on success.
        unsafe { sys::cuMemCreate(handle.as_mut_ptr(), bytes, &prop, 0) }.result()?;
        // SAFETY: written by the successful call.
        Ok(unsafe { handle.assume_init() })
    }
}
