//! Ranges a caller registered with NCCL (or any peer that maps cupool's memory by its physical
//! handle): while registered, their memory must stay where it is.
//!
//! NCCL's `ncclCommRegister` (PyTorch's `register_mem_pool`) hands the range's physical memory
//! to its peers and caches the registration by address. If cupool released that memory, or
//! mapped new memory at the address, peers would read and write what is no longer the caller's
//! buffer. So a registered range is pinned: a free of it is taken (the caller may drop its
//! tensor) but deferred until the range is deregistered; since it stays a live block, no purge,
//! trim or shutdown touches it; and a sleep of its device is refused (a sleep unmaps even live
//! blocks).
//!
//! The free path asks [`deferred`] first; with nothing registered that is one atomic load.

use crate::status::{CupoolStatus, Failure};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One registered range.
#[derive(Clone, Copy, Debug)]
struct Entry {
    bytes: usize,
    /// The free that arrived while registered: its stream and size, done at deregistration.
    freed: Option<(u64, usize)>,
}

/// (device, address) → entry, in address order per device.
static RANGES: Mutex<BTreeMap<(usize, u64), Entry>> = Mutex::new(BTreeMap::new());
/// How many ranges are registered: the free path's fast check.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Registers `[ptr, ptr + bytes)` on `device`. Refused for an empty or null range and for one
/// overlapping a range already registered.
pub(crate) fn register(device: usize, ptr: u64, bytes: usize) -> Result<(), Failure> {
    if ptr == 0 || bytes == 0 {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("cannot register {bytes} bytes at {ptr:#x}: pass the address and size (> 0) of memory cupool handed out"),
        ));
    }
    let end = ptr.checked_add(bytes as u64).ok_or_else(|| {
        Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{bytes} bytes at {ptr:#x} run past the end of the address space"),
        )
    })?;
    let mut ranges = RANGES.lock();
    let before = ranges.range(..(device, end)).next_back();
    if let Some((&(d, at), e)) = before {
        if d == device && at + e.bytes as u64 > ptr {
            return Err(Failure::new(
                CupoolStatus::InvalidArgument,
                format!(
                    "{bytes} bytes at {ptr:#x} on device {device} overlap the {} bytes at {at:#x} registered already: deregister that range first",
                    e.bytes
                ),
            ));
        }
    }
    ranges.insert((device, ptr), Entry { bytes, freed: None });
    COUNT.fetch_add(1, Ordering::Release);
    Ok(())
}

/// Deregisters the range registered at `ptr` on `device`; the free it deferred, if any
/// (stream, size), for the caller to do now.
pub(crate) fn deregister(device: usize, ptr: u64) -> Result<Option<(u64, usize)>, Failure> {
    let mut ranges = RANGES.lock();
    let e = ranges.remove(&(device, ptr)).ok_or_else(|| {
        Failure::new(
            CupoolStatus::UnknownPointer,
            format!("nothing is registered at {ptr:#x} on device {device}: pass the address given to cupool_register"),
        )
    })?;
    COUNT.fetch_sub(1, Ordering::Release);
    Ok(e.freed)
}

/// Whether a free of `ptr` on `device` must wait for its range's deregistration: `Ok(true)`
/// when it was registered (the free is now recorded), `Ok(false)` when it was not, an error
/// when it was freed already.
#[inline]
pub(crate) fn deferred(device: usize, stream: u64, ptr: u64, size: usize) -> Result<bool, Failure> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return Ok(false);
    }
    let mut ranges = RANGES.lock();
    let Some(e) = ranges.get_mut(&(device, ptr)) else {
        return Ok(false);
    };
    if e.freed.is_some() {
        return Err(Failure::new(
            CupoolStatus::UnknownPointer,
            format!("{ptr:#x} on device {device} was freed already; its memory stays until cupool_deregister, because it is registered"),
        ));
    }
    e.freed = Some((stream, size));
    tracing::debug!(
        device,
        ptr,
        size,
        "free of a registered range deferred until it is deregistered"
    );
    Ok(true)
}

/// Bytes registered on `device`.
pub(crate) fn bytes(device: usize) -> usize {
    if COUNT.load(Ordering::Acquire) == 0 {
        return 0;
    }
    RANGES
        .lock()
        .range((device, 0)..(device + 1, 0))
        .map(|(_, e)| e.bytes)
        .sum()
}

/// Refuses what would unmap memory under a registered range on `device` (`what`: the
/// operation, for the message).
pub(crate) fn refuse_if_any(device: usize, what: &str) -> Result<(), Failure> {
    match bytes(device) {
        0 => Ok(()),
        n => Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{what} refused on device {device}: {n} bytes there are registered with NCCL (cupool_register) and must stay mapped; deregister them first (PyTorch: deregister_mem_pool)"),
        )),
    }
}
