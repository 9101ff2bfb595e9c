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
        // SAFETY: a plain C struct for which all-zero is a valid (empty) value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ctx.ordinal() as i32;
        if self.exportable.load(Ordering::Relaxed) {
            prop.requestedHandleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        prop
    }

    /// Creates `bytes` of physical memory; when an exportable create is refused for any reason
    /// but a lack of memory, creates it plain, and every later create too (a driver that
    /// advertises file-descriptor handles may still refuse them, as in some containers).
    pub(super) fn create(
        &self,
        bytes: usize,
    ) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
        loop {
            let prop = self.prop();
            let mut handle = MaybeUninit::<sys::CUmemGenericAllocationHandle>::uninit();
            // SAFETY: creates physical memory; `handle` is written on success.
            let made = unsafe { sys::cuMemCreate(handle.as_mut_ptr(), bytes, &prop, 0) }.result();
            match made {
                // SAFETY: written by the successful call.
                Ok(()) => return Ok(unsafe { handle.assume_init() }),
                Err(e)
                    if self.exportable.load(Ordering::Relaxed)
                        && e.0 != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY =>
                {
                    tracing::warn!(device = self.ctx.ordinal(), error = %e, "exportable physical memory refused: creating plain memory from now on (NCCL cannot register it without a copy)");
                    self.exportable.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(cuda_err(CallKind::Create, e, format!("{bytes} bytes"))),
            }
        }
    }
}
