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

/// One registered range: the start of a live block.
#[derive(Clone, Copy, Debug)]
struct Entry {
    bytes: usize,
    /// The block's stream, the size it was asked with and its usable size: what a free of it
    /// must give (as `cupool_free` checks).
    stream: u64,
    asked: usize,
    usable: usize,
    /// The free that arrived while registered (its size), done at deregistration.
    freed: Option<usize>,
}

/// A live block of the open library: (stream, asked, usable), if `ptr` starts one on `device`.
fn live_block(device: usize, ptr: u64) -> Result<Option<(u64, usize, usize)>, Failure> {
    let lib = crate::state::lib()?;
    Ok(lib
        .pools_of(Some(device))
        .iter()
        .find_map(|s| s.pool.live_sizes(ptr).map(|(a, u)| (s.stream, a, u))))
}

/// (device, address) → entry, in address order per device.
static RANGES: Mutex<BTreeMap<(usize, u64), Entry>> = Mutex::new(BTreeMap::new());
/// How many ranges are registered: the free path's fast check.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Registers `[ptr, ptr + bytes)` on `device`. Refused for an empty or null range, for one that
/// is not the start of a live block of cupool's or runs past its usable end, and for one
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
    let (stream, asked, usable) = live_block(device, ptr)?.ok_or_else(|| {
        Failure::new(
            CupoolStatus::UnknownPointer,
            format!("cannot register {ptr:#x} on device {device}: no live block of cupool's starts there (freed already, or not cupool's); register a block cupool handed out, from its start"),
        )
    })?;
    if bytes > usable {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("cannot register {bytes} bytes at {ptr:#x} on device {device}: the block there has {usable} usable bytes; a registration covers one block"),
        ));
    }
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
    ranges.insert(
        (device, ptr),
        Entry {
            bytes,
            stream,
            asked,
            usable,
            freed: None,
        },
    );
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
    Ok(e.freed.map(|size| (e.stream, size)))
}

/// Whether a free of `ptr` on `device` must wait for its range's deregistration: `Ok(true)`
/// when it was registered (the free is now recorded), `Ok(false)` when it was not; an error,
/// recording nothing, when it was freed already or the free does not match the block (another
/// stream, another size than asked or usable), as `cupool_free` refuses those.
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
    if stream != e.stream {
        return Err(Failure::new(
            CupoolStatus::UnknownPointer,
            format!("{ptr:#x} was not handed out by cupool on device {device}, stream {stream:#x} (it is stream {:#x}'s)", e.stream),
        ));
    }
    if size != e.asked && size != e.usable {
        return Err(Failure::new(
            CupoolStatus::SizeMismatch,
            format!("{ptr:#x} was allocated with {} bytes ({} usable) but freed with {size}: pass the size it was allocated with, or the usable size cupool reported", e.asked, e.usable),
        ));
    }
    e.freed = Some(size);
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
