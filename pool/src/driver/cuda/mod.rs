//! The CUDA driver, through cudarc with dynamic loading.
//!
//! The same binary builds without CUDA and finds `libcuda` at run time. [`CudaDriver::new`]
//! checks for the library first and returns [`ErrorCode::LibraryMissing`] rather than letting
//! cudarc panic at the first call, so a caller can fall back to the simulated device.

mod create;
mod devices;
mod host;
mod moves;
mod wait;

use devices::peers;
pub use devices::{device_count, unavailable};

use super::{
    CallKind, DevicePtr, DeviceShared, Driver, DriverError, ErrorCode, HostBuffer, MemInfo,
    PhysHandle, WaitWord,
};
use cudarc::driver::{result, sys, CudaContext};
use std::mem::MaybeUninit;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The context current on this thread when it was made; made current again when dropped.
struct Restore(Option<sys::CUcontext>);

impl Restore {
    fn save(call: CallKind) -> Result<Self, DriverError> {
        result::ctx::get_current()
            .map(Restore)
            .map_err(|e| cuda_err(call, e, "reading the current context"))
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.unwrap_or(std::ptr::null_mut());
        if matches!(result::ctx::get_current(), Ok(Some(now)) if now == previous) {
            return;
        }
        // SAFETY: `previous` was current on this thread moments ago (a context stays alive
        // while current: primary contexts are retained by whoever made them current), or it
        // is null, which unbinds.
        if let Err(e) = unsafe { result::ctx::set_current(previous) } {
            tracing::error!(error = %e, "restoring the thread's CUDA context failed");
        }
    }
}

/// A CUDA device.
#[derive(Debug)]
pub struct CudaDriver {
    ctx: Arc<CudaContext>,
    /// This device and every device that can reach its memory over peer access: VMM mappings
    /// are made accessible to all of them, as `cudaMalloc` memory is once peer access is on
    /// (a framework copies between devices).
    access: Vec<sys::CUmemAccessDesc>,
    /// Whether physical memory is created exportable as a POSIX file descriptor, as
    /// `ncclMemAlloc` makes it (NCCL registers such memory for its peers without a copy).
    /// On where the device supports it; off for good after a create that refused it.
    exportable: AtomicBool,
    shared: DeviceShared,
    vmm: bool,
    name: String,
}

fn cuda_err(call: CallKind, e: result::DriverError, detail: impl Into<String>) -> DriverError {
    let code = match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
        sys::CUresult::CUDA_ERROR_NOT_SUPPORTED => ErrorCode::NotSupported,
        sys::CUresult::CUDA_ERROR_INVALID_VALUE => ErrorCode::InvalidValue,
        other => ErrorCode::Cuda(other as u32),
    };
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let detail = detail.into();
    DriverError::new(
        call,
        code,
        if detail.is_empty() {
            name
        } else {
            format!("{name}; {detail}")
        },
    )
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn is_available() -> bool {
    // SAFETY: only tries to open the shared library; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

impl CudaDriver {
    /// Opens device `ordinal` (its primary context).
    pub fn new(ordinal: usize) -> Result<Self, DriverError> {
        if !is_available() {
            return Err(DriverError::new(
                CallKind::Init,
                ErrorCode::LibraryMissing,
                "libcuda could not be loaded; use the simulated device (--device sim) on machines without a GPU",
            ));
        }
        result::init().map_err(|e| cuda_err(CallKind::Init, e, "cuInit"))?;
        let _restore = Restore::save(CallKind::Init)?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| cuda_err(CallKind::Init, e, format!("device {ordinal}")))?;
        let vmm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
            .map(|v| v != 0)
            .unwrap_or(false);
        let name = ctx
            .name()
            .unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let exportable = vmm
            && ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
                .is_ok_and(|v| v != 0);
        let access = peers(ordinal)
            .into_iter()
            .map(|id| {
                // SAFETY: a plain C struct for which all-zero is a valid (empty) value.
                let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
                d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                d.location.id = id;
                d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                d
            })
            .collect();
        Ok(Self {
            ctx,
            access,
            exportable: AtomicBool::new(exportable),
            shared: DeviceShared::new(),
            vmm,
            name,
        })
    }

    /// The cudarc context, for streams, modules and kernel launches.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current for one call; the guard puts back the context the
    /// thread had, so a host (PyTorch's current device, for one) never sees it change.
    fn bind(&self, call: CallKind) -> Result<Restore, DriverError> {
        let restore = Restore::save(call)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err(call, e, "binding the context"))?;
        Ok(restore)
    }
}

impl Driver for CudaDriver {
    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn shared(&self) -> &DeviceShared {
        &self.shared
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        let _restore = self.bind(CallKind::MemInfo)?;
        let (free, total) =
            result::mem_get_info().map_err(|e| cuda_err(CallKind::MemInfo, e, ""))?;
        Ok(MemInfo { free, total })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let _restore = self.bind(CallKind::Malloc)?;
        // SAFETY: a plain allocation; the context is bound to this thread.
        unsafe { result::malloc_sync(bytes) }
            .map_err(|e| cuda_err(CallKind::Malloc, e, format!("{bytes} bytes")))
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Free)?;
        // SAFETY: the caller (a pool) owns `ptr` from `malloc` and no longer hands it out.
        unsafe { result::free_sync(ptr) }
            .map_err(|e| cuda_err(CallKind::Free, e, format!("{ptr:#x}")))
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let _restore = self.bind(CallKind::MallocManaged)?;
        // SAFETY: a plain managed allocation, attached globally like cudaMallocManaged.
        unsafe { result::malloc_managed(bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
            .map_err(|e| cuda_err(CallKind::MallocManaged, e, format!("{bytes} bytes")))
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::FreeManaged)?;
        // SAFETY: as in `free`.
        unsafe { result::free_sync(ptr) }
            .map_err(|e| cuda_err(CallKind::FreeManaged, e, format!("{ptr:#x}")))
    }

    fn malloc_page(&self) -> usize {
        // Measured on the H100 and H200 (driver 580): every drop in free memory under a pool of
        // cudaMalloc buffers was a whole number of 2 MiB pages (data/h100-2026-11-25-mainline-oom).
        2 << 20
    }

    fn vmm_supported(&self) -> bool {
        self.vmm
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        if !self.vmm {
            return Err(DriverError::new(
                CallKind::Granularity,
                ErrorCode::NotSupported,
                "device has no VMM",
            ));
        }
        let _restore = self.bind(CallKind::Granularity)?;
        let prop = self.prop();
        let mut g = MaybeUninit::<usize>::uninit();
        // SAFETY: `g` is written by the call on success; `prop` outlives it.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                g.as_mut_ptr(),
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
            .result()
            .map_err(|e| cuda_err(CallKind::Granularity, e, ""))?;
            Ok(g.assume_init())
        }
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        let _restore = self.bind(CallKind::Reserve)?;
        let mut base = MaybeUninit::<sys::CUdeviceptr>::uninit();
        // SAFETY: reserves address space only (the hint is a wish the driver may ignore);
        // `base` is written on success.
        unsafe {
            sys::cuMemAddressReserve(base.as_mut_ptr(), bytes, 0, hint, 0)
                .result()
                .map_err(|e| cuda_err(CallKind::Reserve, e, format!("{bytes} bytes")))?;
            Ok(base.assume_init())
        }
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::ReleaseReservation)?;
        // SAFETY: the caller hands back a reservation of exactly this size, with nothing mapped.
        unsafe { sys::cuMemAddressFree(base, bytes) }
            .result()
            .map_err(|e| {
                cuda_err(
                    CallKind::ReleaseReservation,
                    e,
                    format!("{bytes} bytes at {base:#x}"),
                )
            })
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        let _restore = self.bind(CallKind::Create)?;
        let handle = self.create(bytes)?;
        // SAFETY: maps the new handle into a reserved range the caller owns; on failure the
        // handle is released so nothing leaks.
        if let Err(e) = unsafe { sys::cuMemMap(at, bytes, 0, handle, 0) }.result() {
            // SAFETY: the handle is ours and unmapped.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(cuda_err(
                CallKind::Map,
                e,
                format!("{bytes} bytes at {at:#x}"),
            ));
        }
        let (descs, n) = (self.access.as_ptr(), self.access.len());
        // SAFETY: the range was just mapped; `descs` holds `n` descriptors; on failure the
        // range is unmapped and released.
        let granted = unsafe { sys::cuMemSetAccess(at, bytes, descs, n) };
        if let Err(e) = granted.result() {
            // SAFETY: undoing our own map and create.
            unsafe {
                let _ = sys::cuMemUnmap(at, bytes);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(cuda_err(
                CallKind::SetAccess,
                e,
                format!("{bytes} bytes at {at:#x}"),
            ));
        }
        Ok(PhysHandle(handle))
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::Unmap)?;
        // SAFETY: the caller hands back a mapping from `map`, idle on the device.
        unsafe { sys::cuMemUnmap(at, bytes) }
            .result()
            .map_err(|e| cuda_err(CallKind::Unmap, e, format!("{bytes} bytes at {at:#x}")))?;
        // SAFETY: the handle's only mapping is gone.
        if let Err(e) = unsafe { sys::cuMemRelease(handle.0) }.result() {
            // Keep the contract that a failed unmap leaves the range mapped: map the handle back.
            let access = sys::CUmemAccessDesc {
                location: self.prop().location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the range is ours, reserved and now unmapped; the handle is still alive.
            let restored = unsafe {
                sys::cuMemMap(at, bytes, 0, handle.0, 0).result().is_ok()
                    && sys::cuMemSetAccess(at, bytes, &access, 1).result().is_ok()
            };
            let detail = if restored {
                "mapping restored"
            } else {
                "could not restore the mapping: the handle leaks"
            };
            return Err(cuda_err(
                CallKind::Release,
                e,
                format!("handle of {bytes} bytes; {detail}"),
            ));
        }
        Ok(())
    }

    fn alias(
        &self,
        _from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.alias_mapping(to, bytes, handle)
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.unalias_mapping(at, bytes)
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::MemInfo)?;
        // SAFETY: the range is pool memory no user holds; the memset is queued on the legacy
        // default stream, after the kernels that used the block.
        unsafe { result::memset_d8_async(ptr, 0xFF, bytes, std::ptr::null_mut()) }.map_err(|e| {
            cuda_err(
                CallKind::MemInfo,
                e,
                format!("poisoning {bytes} bytes at {ptr:#x}"),
            )
        })
    }

    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        self.pinned(bytes)
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.dtoh(src, dst)
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.htod(dst, src)
    }

    fn wait_word(&self) -> Result<Option<WaitWord>, DriverError> {
        self.host_word()
    }

    fn stream_capturing(&self, stream: u64) -> Result<bool, DriverError> {
        self.capturing(stream)
    }

    fn stream_wait(&self, stream: u64, word: &WaitWord, value: u32) -> Result<(), DriverError> {
        self.wait_on_stream(stream, word, value)
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        let _restore = Restore::save(CallKind::Synchronize)?;
        self.ctx
            .synchronize()
            .map_err(|e| cuda_err(CallKind::Synchronize, e, ""))
    }
}
