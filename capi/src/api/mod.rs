//! The C functions. Each runs inside `guard`: a failure sets the thread's error text and
//! returns its status (or null, or 0); no panic crosses.

use crate::boundary;
use crate::config::Config;
use crate::state::{self, with_stream};
use crate::status::{guard, status, CupoolStatus, Failure};
use cupool_pool::{synchronize, Purge, PurgePolicy};
use std::ffi::{c_char, c_void, CStr};

/// The version of this C API: incremented when a function changes meaning or signature.
pub const CUPOOL_API_VERSION: u32 = 1;

/// The version of the C API this library implements ([`CUPOOL_API_VERSION`]).
#[no_mangle]
pub extern "C" fn cupool_api_version() -> u32 {
    CUPOOL_API_VERSION
}

/// Opens the library. `config` is a string of `NAME=VALUE` pairs (the environment variables'
/// names, e.g. `"GGML_POOL=vmm GGML_CUDA_ALLOC_FALLBACK_MANAGED=1"`), or null to read the
/// environment. Fails if already open.
///
/// # Safety
/// `config` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_init(config: *const c_char) -> CupoolStatus {
    status(|| {
        let text = if config.is_null() {
            None
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            let c = unsafe { CStr::from_ptr(config) };
            Some(c.to_str().map_err(|_| {
                Failure::new(
                    CupoolStatus::InvalidArgument,
                    "the configuration string is not UTF-8",
                )
            })?)
        };
        state::init(Config::parse(text)?)
    })
}

/// Closes the library and gives its memory back. Refused while blocks are live.
#[no_mangle]
pub extern "C" fn cupool_shutdown() -> CupoolStatus {
    status(state::shutdown)
}

/// How many devices the open library has, or -1 (with the error text set).
#[no_mangle]
pub extern "C" fn cupool_device_count() -> i32 {
    guard(|_| -1, || Ok(state::lib()?.devices as i32))
}

/// Allocates from the pool of `device` × `stream`. When the device is out of memory, the idle
/// memory of all its pools (other streams' included) goes back to the driver after a
/// synchronize, and the allocation is tried once more, unless `CUPOOL_PURGE=never`.
pub(crate) fn alloc_on(
    device: i32,
    stream: u64,
    size: usize,
    name: Option<&str>,
) -> Result<(u64, usize), Failure> {
    match try_alloc(device, stream, size, name) {
        Err(mut f) if f.status == CupoolStatus::OutOfMemory => {
            if state::lib()?.purge == PurgePolicy::Never {
                f.text.push_str("\n(CUPOOL_PURGE=never: the cache was neither purged at ubatch boundaries nor before this failure; CUPOOL_PURGE=auto, the default, returns what a growing request outgrew)");
                return Err(f);
            }
            let released = purge_device(device, &Purge::All)?;
            if released == 0 {
                return Err(f);
            }
            tracing::info!(
                device,
                size,
                released,
                "out of memory: trimmed every pool of the device and retrying"
            );
            try_alloc(device, stream, size, name)
        }
        r => r,
    }
}

fn try_alloc(
    device: i32,
    stream: u64,
    size: usize,
    name: Option<&str>,
) -> Result<(u64, usize), Failure> {
    with_stream(device, stream, true, |s| {
        let b = s.pool.alloc(size)?;
        let (ptr, capacity) = (b.ptr(), b.capacity());
        s.live.lock().insert(ptr, (size, b));
        s.usage.lock().alloc(size);
        crate::record::alloc(s.device, stream, ptr, size, name);
        Ok((ptr, capacity))
    })
}

pub(crate) fn free_on(device: i32, stream: u64, ptr: u64, size: usize) -> Result<(), Failure> {
    with_stream(device, stream, false, |s| {
        let mut live = s.live.lock();
        match live.remove(&ptr) {
            None => Err(Failure::new(
                CupoolStatus::UnknownPointer,
                format!("{ptr:#x} was not handed out by cupool on device {device}, stream {stream:#x}, or it was freed already"),
            )),
            // ggml frees with the usable size the allocation reported, PyTorch with the size it
            // asked for: both name the block.
            Some((asked, b)) if asked != size && b.capacity() != size => {
                let usable = b.capacity();
                live.insert(ptr, (asked, b));
                Err(Failure::new(
                    CupoolStatus::SizeMismatch,
                    format!("{ptr:#x} was allocated with {asked} bytes ({usable} usable) but freed with {size}: pass the size it was allocated with, or the usable size cupool reported"),
                ))
            }
            Some((asked, b)) => {
                drop(live);
                s.usage.lock().free(asked);
                crate::record::free(s.device, ptr);
                s.pool.free(b).map_err(|e| Failure::from(e.error))
            }
        }
    })
}

/// Allocates `size` bytes on `device` for `stream` (an opaque stream handle; one pool per
/// device × stream). Writes the usable bytes to `actual` if it is not null. Returns null on
/// failure.
///
/// # Safety
/// `actual` is null or points to writable memory for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_alloc(
    device: i32,
    stream: u64,
    size: usize,
    actual: *mut usize,
) -> *mut c_void {
    guard(
        |_| std::ptr::null_mut(),
        || {
            let (ptr, capacity) = alloc_on(device, stream, size, None)?;
            if !actual.is_null() {
                // SAFETY: the caller passes null or a writable size_t.
                unsafe { actual.write(capacity) };
            }
            Ok(ptr as *mut c_void)
        },
    )
}

/// `cupool_alloc`, naming what is allocated: a recording writes `name` beside the allocation
/// (null: no name). llama.cpp's shim passes the ggml op or buffer the memory is for.
///
/// # Safety
/// `actual` is null or points to writable memory for one `size_t`; `name` is null or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_alloc_named(
    device: i32,
    stream: u64,
    size: usize,
    actual: *mut usize,
    name: *const c_char,
) -> *mut c_void {
    guard(
        |_| std::ptr::null_mut(),
        || {
            let name = if name.is_null() {
                None
            } else {
                // SAFETY: checked non-null; the caller passes a NUL-terminated string.
                Some(unsafe { text_arg(name, "the name") }?)
            };
            let (ptr, capacity) = alloc_on(device, stream, size, name)?;
            if !actual.is_null() {
                // SAFETY: the caller passes null or a writable size_t.
                unsafe { actual.write(capacity) };
            }
            Ok(ptr as *mut c_void)
        },
    )
}

/// Returns `ptr`, allocated on `device` for `stream` with `size` bytes (the size asked for, or
/// the usable size the allocation wrote to `actual`). A pointer cupool did not hand out there,
/// a second free or another size is refused and changes nothing.
#[no_mangle]
pub extern "C" fn cupool_free(
    device: i32,
    stream: u64,
    ptr: *mut c_void,
    size: usize,
) -> CupoolStatus {
    status(|| free_on(device, stream, ptr as u64, size))
}

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
fn purge_device(device: i32, what: &Purge) -> Result<usize, Failure> {
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
/// only when there are any. Then the ubatch's peaks are logged (`CUPOOL_LOG=info`) and reset, and
/// a recording closes the ubatch's phase. Writes the bytes returned to the driver to `released`
/// if not null: when nonzero, anything that captured pool addresses (CUDA graphs) must be
/// dropped.
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

/// Sets the peaks of `device`'s statistics (every device when -1) to the current values.
#[no_mangle]
pub extern "C" fn cupool_reset_peaks(device: i32) -> CupoolStatus {
    status(|| {
        let lib = state::lib()?;
        let d = if device == -1 {
            None
        } else {
            Some(lib.check_device(device)?)
        };
        lib.pools_of(d).iter().for_each(|s| s.pool.reset_peaks());
        Ok(())
    })
}

/// Writes `device`'s statistics (every device when -1) as a NUL-terminated JSON object into
/// `buf` (`cap` bytes; truncated if too small) and returns the JSON's length without the NUL,
/// so a call with a null `buf` asks for the size. Returns 0 on failure.
///
/// # Safety
/// `buf` is null or points to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cupool_stats_json(device: i32, buf: *mut c_char, cap: usize) -> usize {
    guard(
        |_| 0,
        || {
            let lib = state::lib()?;
            let d = if device == -1 {
                None
            } else {
                Some(lib.check_device(device)?)
            };
            let json = crate::stats::json(&lib.pools_of(d));
            if !buf.is_null() && cap > 0 {
                let n = json.len().min(cap - 1);
                // SAFETY: `buf` has `cap` writable bytes; `n + 1 <= cap`.
                unsafe {
                    std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), n);
                    buf.add(n).write(0);
                }
            }
            Ok(json.len())
        },
    )
}

/// Starts recording every allocation and free (all devices and streams) as a trace in `path`,
/// the JSON-lines format `repro-prefill replay` reads. Blocks allocated before the start are
/// not in it. Fails if a recording is open or the file cannot be created.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_record_start(path: *const c_char) -> CupoolStatus {
    status(|| {
        // SAFETY: the caller passes null or a NUL-terminated string.
        let path = unsafe { text_arg(path, "the trace path") }?;
        crate::record::start(path)
    })
}

/// Stops the recording and flushes its file. Writes the number of allocations recorded to
/// `allocations` if not null. Fails if nothing records or a write failed.
///
/// # Safety
/// `allocations` is null or points to writable memory for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cupool_record_stop(allocations: *mut u64) -> CupoolStatus {
    status(|| {
        let n = crate::record::stop()?;
        if !allocations.is_null() {
            // SAFETY: the caller passes null or a writable uint64_t.
            unsafe { allocations.write(n) };
        }
        Ok(())
    })
}

/// Marks the start of a phase named `name` in the recording (a no-op when nothing records),
/// closing an open one: a replay reports each phase's high-water mark.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cupool_phase_begin(name: *const c_char) -> CupoolStatus {
    status(|| {
        // SAFETY: the caller passes null or a NUL-terminated string.
        let name = unsafe { text_arg(name, "the phase name") }?;
        crate::record::phase_begin(name);
        Ok(())
    })
}

/// Marks the end of the open phase in the recording; a nonzero `prefill` makes it a purge
/// boundary for the replay (as a prefill ubatch is).
#[no_mangle]
pub extern "C" fn cupool_phase_end(prefill: i32) -> CupoolStatus {
    status(|| {
        crate::record::phase_end(prefill != 0);
        Ok(())
    })
}

/// A string argument, checked for null and UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
unsafe fn text_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{what} is null: pass a NUL-terminated UTF-8 string"),
        ));
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| {
        Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{what} is not UTF-8"),
        )
    })
}
