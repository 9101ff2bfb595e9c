//! Allocating and freeing: the pool of a device × stream, the out-of-memory retry, and the
//! checks on what is given back.

use super::text_arg;
use crate::state::{self, StreamPool};
use crate::status::{guard, status, CupoolStatus, Failure};
use crate::tags;
use crate::threads::with_local;
use cupool_pool::{Purge, PurgePolicy};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

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
        Err(f) if f.status == CupoolStatus::OutOfMemory => {
            let r = purge_and_retry(device, stream, size, name, f);
            if let Err(f) = &r {
                if f.status == CupoolStatus::OutOfMemory && crate::history::on() {
                    note_oom(device, stream, size);
                }
            }
            r
        }
        r => r,
    }
}

/// The out-of-memory path of `alloc_on`: out of line, so the served path stays as short as it
/// can be.
#[cold]
#[inline(never)]
fn purge_and_retry(
    device: i32,
    stream: u64,
    size: usize,
    name: Option<&str>,
    mut f: Failure,
) -> Result<(u64, usize), Failure> {
    if state::lib()?.purge == PurgePolicy::Never {
        f.text.push_str("\n(CUPOOL_PURGE=never: the cache was neither purged at ubatch boundaries nor before this failure; CUPOOL_PURGE=auto, the default, returns what a growing request outgrew)");
        return Err(f);
    }
    let released = super::release::purge_device(device, &Purge::All)?;
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

/// Notes a failed allocation in the memory history, with what the device has free.
#[cold]
fn note_oom(device: i32, stream: u64, size: usize) {
    let Ok(lib) = state::lib() else { return };
    let Ok(d) = lib.check_device(device) else {
        return;
    };
    let free = lib
        .registry
        .driver(d)
        .and_then(|dr| dr.mem_info().ok())
        .map_or(0, |m| m.free);
    crate::history::oom(d, stream, size, free);
}

fn try_alloc(
    device: i32,
    stream: u64,
    size: usize,
    name: Option<&str>,
) -> Result<(u64, usize), Failure> {
    let tag = tags::current();
    if let Some(r) = with_local(device, stream, tag, true, |me, s, held| {
        Some(s.alloc(me, held, size, name))
    }) {
        return r;
    }
    state::with_shared(device, stream, tag, true, |s| {
        s.alloc(&s.shared, &mut s.shared.lock().held, size, name)
    })
}

/// Frees `ptr` into the pool of the tag in force on this thread, else into whichever tagged
/// pool of `device` × `stream` handed it out: a block may be freed under another tag (or none)
/// than it was allocated with.
pub(crate) fn free_on(device: i32, stream: u64, ptr: u64, size: usize) -> Result<(), Failure> {
    if let Ok(d) = usize::try_from(device) {
        if crate::registered::deferred(d, stream, ptr, size)? {
            return Ok(());
        }
    }
    let now = tags::current();
    let first = free_in(device, stream, now, ptr, size);
    match first {
        Err(f) if f.status == CupoolStatus::UnknownPointer && tags::count() > 1 => {
            for tag in (0..tags::count()).filter(|&t| t != now) {
                match free_in(device, stream, tag, ptr, size) {
                    Err(g) if g.status == CupoolStatus::UnknownPointer => continue,
                    other => return other,
                }
            }
            Err(f)
        }
        other => other,
    }
}

/// Where a free went through this thread's state: done, or the block is another thread's.
enum Freed {
    Done(Result<(), Failure>),
    Elsewhere(Arc<StreamPool>),
}

/// Frees `ptr` from this thread's state if this thread allocated it (no shared state touched),
/// else wherever the pool's directory says it is live. A remote free runs after this thread's
/// lock is let go (two threads freeing each other's blocks must not wait on each other), on
/// the pool this thread's state served from: it only takes a live block off its holder, and a
/// shutdown that closes meanwhile has the holders give blocks to the pool, not keep them.
fn free_in(device: i32, stream: u64, tag: u32, ptr: u64, size: usize) -> Result<(), Failure> {
    let unknown = || {
        Failure::new(
            CupoolStatus::UnknownPointer,
            format!("{ptr:#x} was not handed out by cupool on device {device}, stream {stream:#x}, or it was freed already"),
        )
    };
    let local = with_local(device, stream, tag, false, |_, s, held| {
        Some(Ok(match s.free(held, ptr, size) {
            Some(r) => Freed::Done(r),
            None => Freed::Elsewhere(s.clone()),
        }))
    });
    match local {
        Some(Ok(Freed::Done(r))) => r,
        Some(Ok(Freed::Elsewhere(s))) => s.free_any(ptr, size).unwrap_or_else(|| Err(unknown())),
        Some(Err(f)) => Err(f),
        None => state::with_shared(device, stream, tag, false, |s| {
            s.free_any(ptr, size).unwrap_or_else(|| Err(unknown()))
        }),
    }
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
