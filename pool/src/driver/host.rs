//! Host memory behind the simulated device's addresses.
//!
//! On Unix the memory is an anonymous `mmap` with `MAP_NORESERVE`: pages are committed only
//! when touched, so a dry run that "allocates" gigabytes costs nothing, while a CPU kernel can
//! still read and write every byte a pool hands out. Reservations are `PROT_NONE` ranges that
//! become readable and writable when mapped, so touching unmapped simulated memory faults
//! like it would on a GPU.

pub(crate) const PAGE: usize = 4096;

#[cfg(unix)]
mod imp {
    use std::ptr;

    fn mmap(len: usize, prot: libc::c_int) -> Option<*mut u8> {
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the
        // result is checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            None
        } else {
            Some(p.cast())
        }
    }

    /// Readable, writable, zeroed, committed lazily.
    pub(crate) fn alloc(len: usize) -> Option<*mut u8> {
        mmap(len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Address space only: every access faults until [`commit`].
    pub(crate) fn reserve(len: usize) -> Option<*mut u8> {
        mmap(len, libc::PROT_NONE)
    }

    /// # Safety
    /// `[p, p+len)` must lie inside a live range from [`reserve`], page aligned.
    pub(crate) unsafe fn commit(p: *mut u8, len: usize) -> bool {
        // SAFETY: the caller guarantees the range belongs to one of our mappings.
        unsafe { libc::mprotect(p.cast(), len, libc::PROT_READ | libc::PROT_WRITE) == 0 }
    }

    /// # Safety
    /// `[p, p+len)` must lie inside a live range from [`reserve`], page aligned, and nothing
    /// may hold references into it.
    pub(crate) unsafe fn decommit(p: *mut u8, len: usize) -> bool {
        // SAFETY: as above; MADV_DONTNEED drops the pages so the next map reads zeros, the
        // way fresh physical memory would.
        unsafe {
            libc::madvise(p.cast(), len, libc::MADV_DONTNEED) == 0
                && libc::mprotect(p.cast(), len, libc::PROT_NONE) == 0
        }
    }

    /// # Safety
    /// `[p, p+len)` must be exactly a range from [`alloc`] or [`reserve`], no longer used.
    pub(crate) unsafe fn release(p: *mut u8, len: usize) {
        // SAFETY: the caller hands back a range this module mapped.
        unsafe {
            libc::munmap(p.cast(), len);
        }
    }
}

#[cfg(not(unix))]
mod imp {
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len, super::PAGE).ok()
    }

    pub(crate) fn alloc(len: usize) -> Option<*mut u8> {
        // SAFETY: the layout has a non-zero size (callers round up to a page).
        layout(len)
            .map(|l| unsafe { alloc_zeroed(l) })
            .filter(|p| !p.is_null())
    }

    pub(crate) fn reserve(len: usize) -> Option<*mut u8> {
        alloc(len)
    }

    pub(crate) unsafe fn commit(_p: *mut u8, _len: usize) -> bool {
        true
    }

    pub(crate) unsafe fn decommit(p: *mut u8, len: usize) -> bool {
        // SAFETY: the caller guarantees the range is ours and unused.
        unsafe { std::ptr::write_bytes(p, 0, len) };
        true
    }

    pub(crate) unsafe fn release(p: *mut u8, len: usize) {
        if let Some(l) = layout(len) {
            // SAFETY: the caller hands back a range from `alloc`/`reserve` of this length.
            unsafe { dealloc(p, l) }
        }
    }
}

pub(crate) use imp::{alloc, commit, decommit, release, reserve};

pub(crate) fn round_to_page(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(PAGE)
}
