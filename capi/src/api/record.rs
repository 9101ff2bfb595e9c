//! Recording traces for `repro-prefill replay`, and marking phases in them.

use super::text_arg;
use crate::status::{status, CupoolStatus};
use std::ffi::c_char;

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
