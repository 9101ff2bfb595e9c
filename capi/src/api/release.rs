//! Giving memory back to the driver: purges, trims, an engine's ubatch boundary, and the count
//! of releases that tells captured addresses they went stale.

use crate::boundary;
use crate::state;
use crate::status::{status, CupoolStatus, Failure};
use cupool_pool::{synchronize, Pool, Purge};

/// Synchronizes `device`, then returns its pools' idle memory to the driver: every idle
/// buffer smaller than `smaller_than` bytes, or everything idle when it is 0 (for VMM pools,
/// the mapped memory above the live top). Writes the bytes released to `released` if not null.
///
/// # Safety
/// `released` is null or points to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_purge(
    device: i32,
    smaller_than: usize,
    released: *mut usize,
) -> CupoolStatus {
    status(|| {
        let what = if smaller_than == 0 {
            Purge::All
        } else {
            Purge::SmallerThan(smaller_than)
        };
        let total = purge_device(device, &what)?;
        if !released.is_null() {
            // SAFETY: the caller passes null or a writable size_t.
            unsafe { released.write(total) };
        }
        Ok(())
    })
}

/// Synchronizes `device`, then purges `what` from each of its pools; returns the bytes released.
pub(super) fn purge_device(device: i32, what: &Purge) -> Result<usize, Failure> {
    let lib = state::lib()?;
    let d = lib.check_device(device)?;
    let driver = lib.registry.driver(d).ok_or_else(|| {
        Failure::new(
            CupoolStatus::InvalidArgument,
            format!("device {d} has no driver"),
        )
    })?;
    let token = synchronize(driver.as_ref())?;
    crate::record::sync();
    let mut total = 0;
    for s in lib.pools_of(Some(d)) {
        total += s.pool.purge(&token, what.clone())?.bytes;
    }
    Ok(total)
}

/// Synchronizes `device` and returns everything its pools hold idle to the driver (for VMM
/// pools, the mapped memory above the live top): `cupool_purge(device, 0, released)`.
///
/// # Safety
/// `released` is null or points to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_trim(device: i32, released: *mut usize) -> CupoolStatus {
    // SAFETY: the same contract as ours.
    unsafe { cupool_purge(device, 0, released) }
}

/// Ends a prefill ubatch of an inference engine on `device` (every device when -1), for
/// llama.cpp's shim and any engine that calls it after each prefill ubatch. Each pool of the
/// device applies `CUPOOL_PURGE`: `never` keeps its cache; `always` synchronizes the device and
/// returns every idle buffer; `auto` (the default) returns the idle buffers that the ubatch just
/// ended would not reuse (for each request size, as many as it held at once), synchronizing
/// only when there are any. Then the ubatch's peaks are logged (`CUPOOL_LOG=info`) and the next
/// ubatch's accounting starts afresh (the peaks `cupool_stats_json` reports go on until
/// `cupool_reset_peaks`), and a recording closes the ubatch's phase. Writes the bytes returned
/// to the driver to `released` if not null: when nonzero, anything that captured pool addresses
/// (CUDA graphs) must be dropped.
///
/// # Safety
/// `released` is null or points to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_ubatch_end(device: i32, released: *mut usize) -> CupoolStatus {
    status(|| {
        let d = if device == -1 {
            None
        } else {
            Some(state::lib()?.check_device(device)?)
        };
        let total = boundary::ubatch_end(d)?;
        if !released.is_null() {
            // SAFETY: the caller passes null or a writable size_t.
            unsafe { released.write(total) };
        }
        Ok(())
    })
}

/// Writes to `count` how many times memory of `device`'s pools has gone back to the driver
/// since `cupool_init` (device frees, unmaps and managed frees: ubatch-boundary purges, trims,
/// the trim before an out-of-memory retry, and pools that keep no cache). Anything that
/// captured pool addresses (a CUDA graph) and was captured before the count last changed may
/// hold freed memory: compare a remembered count before replaying it.
///
/// # Safety
/// `count` points to writable memory for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_releases(device: i32, count: *mut u64) -> CupoolStatus {
    status(|| {
        if count.is_null() {
            return Err(Failure::new(
                CupoolStatus::InvalidArgument,
                "cupool_releases: count is null; pass the address of a uint64_t",
            ));
        }
        let lib = state::lib()?;
        let d = lib.check_device(device)?;
        let n = lib
            .pools_of(Some(d))
            .iter()
            .map(|s| {
                let c = s.pool.stats().calls;
                c.frees + c.unmaps + c.managed_frees
            })
            .sum();
        // SAFETY: checked non-null above; the caller passes a writable uint64_t.
        unsafe { count.write(n) };
        Ok(())
    })
}
