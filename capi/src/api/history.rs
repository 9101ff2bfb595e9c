//! The memory history and the memory snapshot, in PyTorch's format: what its memory viewer
//! (pytorch.org/memory_viz) and `torch.cuda._memory_viz` read.

use crate::state;
use crate::status::{guard, status, CupoolStatus, Failure};
use std::ffi::c_char;

/// Turns the memory history on (`enabled` nonzero) or off, as PyTorch's
/// `torch.cuda.memory._record_memory_history`: while on, the last `max_entries` events of each
/// device (allocations, frees, segments mapped or allocated from the driver and given back,
/// out-of-memory failures, with address, size, stream and time) are kept for
/// `cupool_memory_snapshot_json`. Turning it on while on keeps the history and sets the new
/// bound; turning it off forgets it. Needs no `cupool_init` and outlives `cupool_shutdown`.
/// `max_entries` is at least 1 when turning it on (ignored when turning it off). While off,
/// the cost is one atomic load per allocation and free.
#[no_mangle]
pub extern "C" fn cupool_memory_history(enabled: i32, max_entries: u64) -> CupoolStatus {
    status(|| {
        if enabled == 0 {
            crate::history::stop();
            return Ok(());
        }
        if max_entries == 0 {
            return Err(Failure::new(
                CupoolStatus::InvalidArgument,
                "max_entries is 0: the history keeps at least the last event (pass 1 or more; UINT64_MAX for no bound)",
            ));
        }
        crate::history::start(usize::try_from(max_entries).unwrap_or(usize::MAX));
        Ok(())
    })
}

/// Writes the memory snapshot of `device` (every device when -1) as a NUL-terminated JSON object
/// into `buf` (`cap` bytes) and returns the JSON's length without the NUL; a call with a null
/// `buf` asks for the size. When the return is `cap` or more, `buf` holds a truncated prefix:
/// the snapshot grew since the size was asked, so call again with a larger buffer. Returns 0
/// on failure.
///
/// The JSON is PyTorch's `torch.cuda.memory._snapshot()`: `{"segments": [...],
/// "device_traces": [[...], ...]}`. Each segment (`device`, `address`, `total_size`,
/// `allocated_size`, `active_size`, `requested_size`, `stream`, `segment_type`,
/// `segment_pool_id`, `is_expandable`, `frames`, `blocks`) is memory a pool holds from the
/// driver (mapped VMM memory is `is_expandable`), its `blocks` (`address`, `size`,
/// `requested_size`, `state`: `active_allocated` or `inactive`, `frames`) tiling it. The traces
/// hold one list per device of the history's events (`action`, `addr`, `size`, `stream`,
/// `time_us`, `frames`; an `oom` has `device_free` instead of `addr`), oldest first, empty
/// while the history is off. Frames name what `cupool_alloc_named` named and the tag in force.
///
/// # Safety
/// `buf` is null or points to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn cupool_memory_snapshot_json(
    device: i32,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    guard(
        |_| 0,
        || {
            let lib = state::lib()?;
            let d = super::devices_arg(&lib, device)?;
            let json = crate::snapshot::json(&lib, d);
            // SAFETY: the caller passes null or `cap` writable bytes.
            Ok(unsafe { super::write_text(&json, buf, cap) })
        },
    )
}
