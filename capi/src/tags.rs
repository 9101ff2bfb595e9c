//! Tags: names a caller gives to what it allocates ("weights", "kv_cache"), so that a tag's
//! memory can be put to sleep and woken on its own (`api/sleep.rs`).
//!
//! Each tag has pools of its own (one per device × stream × tag), so its memory lies in
//! mappings no other tag shares: a sleep unmaps whole mappings. The tag in force is the
//! calling thread's (`cupool_set_tag`), as PyTorch's allocator callbacks carry no tag; frees
//! find their block whatever tag is in force. Tag 0 is "no tag". Names are kept for the life
//! of the process (there are few), so the pointers `cupool_tag` hands out stay valid.

use crate::status::{CupoolStatus, Failure};
use parking_lot::RwLock;
use std::cell::Cell;
use std::ffi::{c_char, CString};

/// Tags a process may name: each is a pool per device and stream.
pub(crate) const MAX_TAGS: usize = 64;
/// Longest name, in bytes.
const MAX_NAME: usize = 64;

/// Every name given so far; index = tag, 0 = "" (no tag).
static NAMES: RwLock<Vec<CString>> = RwLock::new(Vec::new());

thread_local! {
    /// The tag of this thread's allocations. No destructor: readable at thread exit too.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
}

/// The tag of `name` ("" is no tag), named on first use.
pub(crate) fn intern(name: &str) -> Result<u32, Failure> {
    if name.is_empty() {
        return Ok(0);
    }
    if let Some(t) = find(name) {
        return Ok(t);
    }
    if name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("tag {name:?} is not accepted: a tag is a name of 1 to {MAX_NAME} bytes without control characters"),
        ));
    }
    let mut names = NAMES.write();
    if names.is_empty() {
        names.push(CString::default());
    }
    if let Some(t) = names.iter().position(|n| n.as_bytes() == name.as_bytes()) {
        return Ok(t as u32);
    }
    if names.len() > MAX_TAGS {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("tag {name:?} would be one too many: at most {MAX_TAGS} tags per process (each is a pool per device and stream); reuse one of {}", list(&names)),
        ));
    }
    let c = CString::new(name)
        .map_err(|_| Failure::new(CupoolStatus::InvalidArgument, "a tag holds a NUL character"))?;
    names.push(c);
    Ok((names.len() - 1) as u32)
}

/// The tag of `name` if it was ever named ("" is no tag).
pub(crate) fn find(name: &str) -> Option<u32> {
    if name.is_empty() {
        return Some(0);
    }
    NAMES
        .read()
        .iter()
        .position(|n| n.as_bytes() == name.as_bytes())
        .map(|t| t as u32)
}

/// The error for a tag that was never named, listing those that were.
pub(crate) fn unknown(name: &str) -> Failure {
    Failure::new(
        CupoolStatus::InvalidArgument,
        format!(
            "no allocation was ever tagged {name:?}: the tags named so far are {} (name one with cupool_set_tag before allocating)",
            list(&NAMES.read())
        ),
    )
}

fn list(names: &[CString]) -> String {
    let named: Vec<String> = names
        .iter()
        .skip(1)
        .map(|n| format!("{:?}", n.to_string_lossy()))
        .collect();
    if named.is_empty() {
        "none".into()
    } else {
        named.join(", ")
    }
}

/// Every tag named so far, "no tag" included.
pub(crate) fn count() -> u32 {
    NAMES.read().len().max(1) as u32
}

/// The tag of this thread's allocations.
#[inline]
pub(crate) fn current() -> u32 {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

/// Sets the tag of this thread's allocations.
pub(crate) fn set_current(tag: u32) {
    let _ = CURRENT.try_with(|c| c.set(tag));
}

/// The name of `tag` ("" for none), valid for the life of the process.
pub(crate) fn name_ptr(tag: u32) -> *const c_char {
    NAMES
        .read()
        .get(tag as usize)
        // The CString's buffer never moves: names are only ever appended, never dropped.
        .map_or(c"".as_ptr(), |n| n.as_ptr())
}

/// The name of `tag`, for messages and statistics.
pub(crate) fn name(tag: u32) -> String {
    NAMES
        .read()
        .get(tag as usize)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
