//! PyTorch's `CUDAPluggableAllocator` entry points, with its exact signatures:
//! `void* alloc(size_t size, int device, cudaStream_t stream)` and
//! `void free(void* ptr, size_t size, int device, cudaStream_t stream)`.
//!
//! One pool per (device, stream) as PyTorch passes them. The library opens itself from the
//! environment on the first call if `cupool_init` was not called. PyTorch does not check a
//! null return in every mode, so a failure is also logged with the error text.

use crate::api::{alloc_on, free_on};
use crate::state::init_from_env_once;
use crate::status::guard;
use cupool_pool::rate_limit::Doubling;
use std::ffi::c_void;

/// PyTorch's allocation entry point.
#[no_mangle]
pub extern "C" fn cupool_torch_alloc(size: usize, device: i32, stream: *mut c_void) -> *mut c_void {
    guard(
        |_| std::ptr::null_mut(),
        || {
            init_from_env_once()?;
            let (ptr, _) = alloc_on(device, stream as u64, size, None).inspect_err(|f| {
                // PyTorch retries after emptying its cache: rate-limited.
                static FAILED: Doubling = Doubling::new();
                if let Some(n) = FAILED.due() {
                    tracing::error!(
                        device,
                        size,
                        failures_so_far = n,
                        "cupool could not serve PyTorch: {}",
                        f.text
                    );
                }
            })?;
            Ok(ptr as *mut c_void)
        },
    )
}

/// PyTorch's free entry point. Errors cannot be returned to PyTorch: they are logged and
/// readable through `cupool_last_error`.
#[no_mangle]
pub extern "C" fn cupool_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: i32,
    stream: *mut c_void,
) {
    guard(
        |_| (),
        || {
            free_on(device, stream as u64, ptr as u64, size).inspect_err(|f| {
                tracing::error!(
                    device,
                    size,
                    "cupool refused a free from PyTorch: {}",
                    f.text
                );
            })
        },
    )
}
