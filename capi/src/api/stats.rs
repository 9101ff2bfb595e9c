//! Statistics: as JSON, and their peaks reset.

use crate::state;
use crate::status::{guard, status, CupoolStatus};
use cupool_pool::Pool;
use std::ffi::c_char;

/// Sets the peaks of `device`'s statistics (every device when -1) to the current values. Only
/// this call restarts them (ubatch boundaries do not), as `torch.cuda.reset_peak_memory_stats`.
#[no_mangle]
pub extern "C" fn cupool_reset_peaks(device: i32) -> CupoolStatus {
    status(|| {
        let lib = state::lib()?;
        let d = if device == -1 {
            None
        } else {
            Some(lib.check_device(device)?)
        };
        for s in lib.pools_of(d) {
            s.pool.reset_peaks();
            s.pool.reset_live_peaks();
            s.peaks.reset(s.pool.reserved_bytes());
        }
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
            let d = super::devices_arg(&lib, device)?;
            let of = |i: usize| d.is_none_or(|want| want == i);
            let drivers = crate::stats::Drivers {
                timers: (lib.timers.iter().enumerate())
                    .filter(|(i, _)| of(*i))
                    .map(|(_, t)| t)
                    .collect(),
                deferred: (lib.deferred.iter().enumerate())
                    .filter(|(i, _)| of(*i))
                    .map(|(_, t)| t)
                    .collect(),
            };
            let json = crate::stats::json(&lib.pools_of(d), &drivers);
            // SAFETY: the caller passes null or `cap` writable bytes.
            Ok(unsafe { super::write_text(&json, buf, cap) })
        },
    )
}
