//! Tags, sleep and wake: a caller names what it allocates (`cupool_set_tag`), and puts a tag's
//! memory to sleep (its physical memory goes back to the driver, every address stays valid for
//! later, offloaded contents wait in page-locked host memory) and wakes it again. See
//! `tags.rs` for how tags map to pools, and the pool's `sleep` for what a sleep does.

use super::text_arg;
use crate::state::{self, Lib};
use crate::status::{status, CupoolStatus, Failure};
use crate::tags;
use cupool_pool::{synchronize, Moved, Pool};
use std::ffi::c_char;

/// Sets the tag of this thread's later allocations: a name of 1 to 64 bytes ("weights",
/// "kv_cache"), or null or "" for none. Each tag's memory lies in pools of its own, so
/// `cupool_sleep` can release it alone. Frees need no tag: a block is found under any.
///
/// # Safety
/// `tag` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_set_tag(tag: *const c_char) -> CupoolStatus {
    status(|| {
        let name = if tag.is_null() {
            ""
        } else {
            // SAFETY: checked non-null; the caller passes a NUL-terminated string.
            unsafe { text_arg(tag, "the tag") }?
        };
        tags::set_current(tags::intern(name)?);
        Ok(())
    })
}

/// The tag of this thread's allocations ("" for none). The string stays valid for the life
/// of the process.
#[no_mangle]
pub extern "C" fn cupool_tag() -> *const c_char {
    tags::name_ptr(tags::current())
}

/// The devices a call names: one, or every device when -1.
fn devices(lib: &Lib, device: i32) -> Result<Vec<usize>, Failure> {
    if device == -1 {
        Ok((0..lib.devices).collect())
    } else {
        Ok(vec![lib.check_device(device)?])
    }
}

/// A tag's pools on `device` and what `f` did to each, added up.
fn each_pool(
    lib: &Lib,
    device: usize,
    tag: u32,
    mut f: impl FnMut(&dyn cupool_pool::Pool) -> Result<Moved, cupool_pool::PoolError>,
) -> Result<Moved, Failure> {
    let mut out = Moved::default();
    for s in lib.pools_of(Some(device)).iter().filter(|s| s.tag == tag) {
        let m = f(&s.pool).map_err(|e| {
            Failure::from(e).context(format!(
                "tag {:?} on device {device}, stream {:#x}",
                tags::name(tag),
                s.stream
            ))
        })?;
        out.bytes += m.bytes;
        out.copied += m.copied;
    }
    Ok(out)
}

/// Runs `f` for the tag `tag` names on each device `device` names (-1: all), and writes the
/// sum of its results to `out` unless it is null.
///
/// # Safety
/// `tag` is null or a NUL-terminated string; `out` is null or points to writable memory for one
/// `size_t`.
unsafe fn per_device(
    device: i32,
    tag: *const c_char,
    out: *mut usize,
    mut f: impl FnMut(&Lib, usize, u32) -> Result<usize, Failure>,
) -> Result<(), Failure> {
    // SAFETY: the caller's contract.
    let t = unsafe { named_tag(tag) }?;
    let lib = state::lib()?;
    let mut total = 0;
    for d in devices(&lib, device)? {
        total += f(&lib, d, t)?;
    }
    if !out.is_null() {
        // SAFETY: the caller passes null or a writable size_t.
        unsafe { out.write(total) };
    }
    Ok(())
}

/// The tag a sleep or wake names: it must have been set before.
///
/// # Safety
/// `tag` is null or a NUL-terminated string.
unsafe fn named_tag(tag: *const c_char) -> Result<u32, Failure> {
    if tag.is_null() {
        return Ok(0);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { text_arg(tag, "the tag") }?;
    tags::find(name).ok_or_else(|| tags::unknown(name))
}

/// Puts the memory tagged `tag` (null or "": the untagged memory) on `device` (-1: every
/// device) to sleep: synchronizes the device, returns its cached memory and the physical
/// memory under every live block to the driver, keeping every address; with `offload` nonzero
/// the contents are copied to page-locked host memory first, for `cupool_wake` to restore.
/// The synchronize lets kernels already queued finish first; work queued after this call must
/// not touch the memory until `cupool_wake` (it would fault). Allocations under the tag fail
/// while it sleeps; frees are taken. Writes the bytes released to `released` if not null.
/// Only the vmm pool (the default) can sleep; refused while memory of the device is registered
/// (`cupool_register`). A failure leaves part of the tag asleep: call
/// `cupool_wake` (or sleep again).
///
/// # Safety
/// `tag` is null or a NUL-terminated string; `released` is null or points to writable memory
/// for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_sleep(
    device: i32,
    tag: *const c_char,
    offload: i32,
    released: *mut usize,
) -> CupoolStatus {
    status(|| {
        // Before any device sleeps: a refusal must leave every device as it was.
        let lib = state::lib()?;
        for d in devices(&lib, device)? {
            crate::registered::refuse_if_any(d, "sleep")?;
        }
        // SAFETY: the caller's contract.
        unsafe {
            per_device(device, tag, released, |lib, d, t| {
                let driver = lib.registry.driver(d).ok_or_else(|| {
                    Failure::new(CupoolStatus::Internal, format!("device {d} has no driver"))
                })?;
                let token = synchronize(driver.as_ref())?;
                crate::record::sync();
                Ok(each_pool(lib, d, t, |p| p.sleep(&token, offload != 0))?.bytes)
            })
        }
    })
}

/// Wakes the memory tagged `tag` (null or "": untagged) on `device` (-1: every device): new
/// physical memory at every address the sleep released, offloaded contents copied back (the
/// copies are done when this returns). Waking what is awake does nothing. Writes the bytes
/// mapped again to `mapped` if not null.
///
/// # Safety
/// `tag` is null or a NUL-terminated string; `mapped` is null or points to writable memory for
/// one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_wake(
    device: i32,
    tag: *const c_char,
    mapped: *mut usize,
) -> CupoolStatus {
    status(|| {
        // SAFETY: the caller's contract.
        unsafe {
            per_device(device, tag, mapped, |lib, d, t| {
                Ok(each_pool(lib, d, t, |p| p.wake())?.bytes)
            })
        }
    })
}

/// Writes to `asleep` the bytes of `tag`'s memory on `device` (-1: every device) that are
/// asleep now (0 when awake).
///
/// # Safety
/// `tag` is null or a NUL-terminated string; `asleep` points to writable memory for one
/// `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_asleep_bytes(
    device: i32,
    tag: *const c_char,
    asleep: *mut usize,
) -> CupoolStatus {
    status(|| {
        if asleep.is_null() {
            return Err(Failure::new(
                CupoolStatus::InvalidArgument,
                "cupool_asleep_bytes: asleep is null; pass the address of a size_t",
            ));
        }
        // SAFETY: the caller's contract; `asleep` is not null.
        unsafe {
            per_device(device, tag, asleep, |lib, d, t| {
                Ok(lib
                    .pools_of(Some(d))
                    .iter()
                    .filter(|s| s.tag == t)
                    .map(|s| s.pool.stats().asleep_bytes)
                    .sum())
            })
        }
    })
}
