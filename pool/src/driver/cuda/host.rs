//! Host memory for a sleeping pool's offload: page-locked buffers and the copies to and from
//! the device.

use super::{cuda_err, CudaDriver, Restore};
use crate::driver::{CallKind, DevicePtr, DriverError, HostBuffer, HostMemory};
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

impl CudaDriver {
    /// `bytes` of page-locked host memory (cuMemAllocHost).
    pub(super) fn pinned(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        let _restore = self.bind(CallKind::HostAlloc)?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: writes a host pointer to `p` on success; 0 bytes is asked as 1 (CUDA refuses 0).
        unsafe { sys::cuMemAllocHost_v2(&mut p, bytes.max(1)) }
            .result()
            .map_err(|e| {
                cuda_err(
                    CallKind::HostAlloc,
                    e,
                    format!("{bytes} bytes of page-locked host memory"),
                )
            })?;
        Ok(HostBuffer::new(Box::new(Pinned {
            ptr: p.cast(),
            len: bytes,
            ctx: self.ctx.clone(),
        })))
    }

    /// cuMemcpyDtoH into `dst`, waited for.
    pub(super) fn dtoh(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Copy)?;
        // SAFETY: `dst` is writable for its length; the caller passes a mapped device range of
        // that length. The copy is synchronous: it returns once the bytes are in `dst`.
        unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) }
            .result()
            .map_err(|e| {
                cuda_err(
                    CallKind::Copy,
                    e,
                    format!("{} bytes from {src:#x} to the host", dst.len()),
                )
            })
    }

    /// cuMemcpyHtoD from `src`, waited for.
    pub(super) fn htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Copy)?;
        // SAFETY: `src` is readable for its length; the caller passes a mapped device range of
        // that length. Synchronous for page-locked sources once the call returns.
        unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) }
            .result()
            .map_err(|e| {
                cuda_err(
                    CallKind::Copy,
                    e,
                    format!("{} bytes from the host to {dst:#x}", src.len()),
                )
            })
    }
}

/// Page-locked host memory from cuMemAllocHost, freed with its context current.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: page-locked host memory is plain host memory any thread may read and write; the
// pointer is owned by this value alone.
unsafe impl Send for Pinned {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Pinned {}

impl HostMemory for Pinned {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` bytes, alive until this value drops.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let Ok(_restore) = Restore::save(CallKind::HostAlloc) else {
            return;
        };
        if self.ctx.bind_to_thread().is_err() {
            tracing::error!(
                bytes = self.len,
                "could not bind the context to free page-locked host memory; it leaks"
            );
            return;
        }
        // SAFETY: `ptr` came from cuMemAllocHost in this context and is freed once, here.
        if let Err(e) = unsafe { sys::cuMemFreeHost(self.ptr.cast()) }.result() {
            tracing::error!(error = %e, bytes = self.len, "freeing page-locked host memory failed");
        }
    }
}
