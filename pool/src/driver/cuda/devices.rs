//! The devices: how many there are, whether CUDA work can run here at all, and which devices
//! can reach a device's memory as peers.

use super::{cuda_err, is_available};
use crate::driver::{CallKind, DriverError, ErrorCode};
use cudarc::driver::{result, sys, CudaContext};

/// Why CUDA work cannot run on this machine (no driver library, a driver that does not start,
/// no device), or `None` when the driver loads and reports at least one device. The GPU tests
/// skip on `Some`, saying why, instead of failing inside the driver bindings.
pub fn unavailable() -> Option<String> {
    match device_count() {
        Ok(0) => Some("the CUDA driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("no CUDA GPU here: {e}")),
    }
}

/// How many CUDA devices there are (an error when the driver library is missing).
pub fn device_count() -> Result<usize, DriverError> {
    if !is_available() {
        return Err(DriverError::new(
            CallKind::Init,
            ErrorCode::LibraryMissing,
            "libcuda could not be loaded",
        ));
    }
    let n =
        CudaContext::device_count().map_err(|e| cuda_err(CallKind::Init, e, "counting devices"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `ordinal` and the devices that can access its memory as peers, by ordinal.
pub(super) fn peers(ordinal: usize) -> Vec<i32> {
    let me = ordinal as i32;
    let mut out = vec![me];
    let (Ok(n), Ok(dev)) = (CudaContext::device_count(), result::device::get(me)) else {
        return out;
    };
    for other in (0..n).filter(|&o| o != me) {
        let Ok(peer) = result::device::get(other) else {
            continue;
        };
        let mut can = 0;
        // SAFETY: two valid device handles and an int to write.
        let ok = unsafe { sys::cuDeviceCanAccessPeer(&mut can, peer, dev) }.result();
        if ok.is_ok() && can != 0 {
            out.push(other);
        }
    }
    out
}
