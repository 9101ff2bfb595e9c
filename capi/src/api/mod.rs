//! The C functions. Each runs inside `guard`: a failure sets the thread's error text and
//! returns its status (or null, or 0); no panic crosses.
//!
//! Here: the library's version, opening and closing it, and its settings; by idea beside it:
//! `memory.rs` (alloc and free), `release.rs` (purges, trims, ubatch boundaries, the release
//! count), `stats.rs` (statistics), `record.rs` (traces), `history.rs` (the memory history and
//! snapshot, in PyTorch's format), `sleep.rs` (tags, sleep and wake) and `register.rs` (ranges
//! registered with NCCL).

// In the header's order: cbindgen follows the declarations.
mod memory;

mod release;

mod stats;

mod record;

mod history;

mod sleep;

mod register;

pub use history::{cupool_memory_history, cupool_memory_snapshot_json};
pub(crate) use memory::{alloc_on, free_on};
pub use memory::{cupool_alloc, cupool_alloc_named, cupool_free};
pub use record::{cupool_phase_begin, cupool_phase_end, cupool_record_start, cupool_record_stop};
pub use register::{cupool_deregister, cupool_register, cupool_registered_bytes};
pub use release::{cupool_purge, cupool_releases, cupool_trim, cupool_ubatch_end};
pub use sleep::{cupool_asleep_bytes, cupool_set_tag, cupool_sleep, cupool_tag, cupool_wake};
pub use stats::{cupool_reset_peaks, cupool_stats_json};

use crate::config::Config;
use crate::state;
use crate::status::{guard, status, CupoolStatus, Failure};
use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

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

/// Closes the library and gives all its memory back, what every thread's cache holds included.
/// Refused while blocks are live: their memory stays valid until they are freed. The blocks are
/// counted with no allocation or free in flight (those on other threads end first, later ones
/// wait), so no block's memory goes back under its owner.
#[no_mangle]
pub extern "C" fn cupool_shutdown() -> CupoolStatus {
    status(crate::threads::shutdown)
}

/// How many devices the open library has, or -1 (with the error text set).
#[no_mangle]
pub extern "C" fn cupool_device_count() -> i32 {
    guard(|_| -1, || Ok(state::lib()?.devices as i32))
}

/// Every setting libcupool, the Rust library, `repro-prefill`, llama.cpp's shim and the Python
/// package read, as a NUL-terminated JSON object: `{"front_ends": [...], "settings": [{"name",
/// "accepts", "choices", "defaults", "read_by", "keyword", "env_only", "doc"}, ...]}`, one
/// entry per environment variable with what it accepts, each front end's default, and what it
/// does. The string is static: valid for the life of the process, never to be freed. Needs no
/// `cupool_init`. Returns null on failure.
#[no_mangle]
pub extern "C" fn cupool_settings_json() -> *const c_char {
    static JSON: OnceLock<CString> = OnceLock::new();
    guard(
        |_| std::ptr::null(),
        || {
            if let Some(json) = JSON.get() {
                return Ok(json.as_ptr());
            }
            let json = CString::new(cupool_pool::settings::json()).map_err(|_| {
                Failure::new(
                    CupoolStatus::Internal,
                    "the settings table holds a NUL character",
                )
            })?;
            Ok(JSON.get_or_init(|| json).as_ptr())
        },
    )
}

/// Copies `text` into `buf` (`cap` bytes) as a NUL-terminated string, truncated to fit, and
/// returns its length without the NUL: the convention of the `*_json` calls (a null `buf`
/// asks for the size).
///
/// # Safety
/// `buf` is null or points to `cap` writable bytes.
pub(super) unsafe fn write_text(text: &str, buf: *mut c_char, cap: usize) -> usize {
    if !buf.is_null() && cap > 0 {
        let n = text.len().min(cap - 1);
        // SAFETY: `buf` has `cap` writable bytes; `n + 1 <= cap`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    text.len()
}

/// A device argument of the `*_json` calls: one device, or every device for -1 (`None`).
pub(super) fn devices_arg(lib: &crate::state::Lib, device: i32) -> Result<Option<usize>, Failure> {
    if device == -1 {
        Ok(None)
    } else {
        lib.check_device(device).map(Some)
    }
}

/// A string argument, checked for null and UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string that outlives the call.
pub(super) unsafe fn text_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
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
