//! Registration with NCCL: ranges whose memory must stay mapped where it is (`registered.rs`
//! says why and what it changes).

use crate::registered;
use crate::state;
use crate::status::{status, CupoolStatus, Failure};
use std::ffi::c_void;

/// Tells cupool that the block cupool handed out at `ptr` on `device` (its start; `bytes` at
/// most its usable size) is registered with NCCL (`ncclCommRegister`, PyTorch's
/// `register_mem_pool`) or otherwise shared by its physical memory: until `cupool_deregister`,
/// that memory stays mapped at that address. A free of it is checked as `cupool_free` checks
/// one and, if right, taken but done only at deregistration; a sleep of the device is refused.
/// A range that is empty, not the start of a live block, longer than it, or registered already
/// is refused.
#[no_mangle]
pub extern "C" fn cupool_register(device: i32, ptr: *mut c_void, bytes: usize) -> CupoolStatus {
    status(|| {
        let d = state::lib()?.check_device(device)?;
        registered::register(d, ptr as u64, bytes)
    })
}

/// Ends the registration made at `ptr` on `device`. A free that arrived while it was
/// registered is done now (its failure, if any, is this call's).
#[no_mangle]
pub extern "C" fn cupool_deregister(device: i32, ptr: *mut c_void) -> CupoolStatus {
    status(|| {
        let d = state::lib()?.check_device(device)?;
        match registered::deregister(d, ptr as u64)? {
            Some((stream, size)) => super::free_on(device, stream, ptr as u64, size),
            None => Ok(()),
        }
    })
}

/// Writes the bytes registered on `device` to `bytes`.
///
/// # Safety
/// `bytes` points to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_registered_bytes(device: i32, bytes: *mut usize) -> CupoolStatus {
    status(|| {
        let d = state::lib()?.check_device(device)?;
        if bytes.is_null() {
            return Err(Failure::new(
                CupoolStatus::InvalidArgument,
                "bytes is null: pass where to write the count",
            ));
        }
        // SAFETY: checked non-null; the caller passes a writable size_t.
        unsafe { bytes.write(registered::bytes(d)) };
        Ok(())
    })
}
