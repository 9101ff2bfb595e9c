//! Host memory behind the simulated device's addresses.
//!
//! On Unix the memory is an anonymous `mmap` with `MAP_NORESERVE`: pages are committed only
//! when touched, so a dry run that "allocates" gigabytes costs nothing, while a CPU kernel can
//! still read and write every byte a pool hands out. Reservations are `PROT_NONE` ranges that
//! become readable and writable when mapped, so touching unmapped simulated memory faults
//! like it would on a GPU. Reservations are carved from one arena of address space per device
//! (`space.rs`), so a reservation can be placed at an address hint right after another, as
//! `cuMemAddressReserve` does; when the arena is full they fall back to a mapping of their own.

use super::space::{Range, Space, PAGE};

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

    /// Address space to carve reservations from.
    pub(crate) fn arena(len: usize) -> Option<*mut u8> {
        reserve(len)
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

    /// No arena: heap memory is committed, so a large one would cost real memory.
    pub(crate) fn arena(_len: usize) -> Option<*mut u8> {
        None
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

pub(crate) fn round_to_page(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(PAGE)
}

/// Address space of the arena each backed device carves its reservations from: far more than
/// any simulated pool reserves at once, and only address space (nothing is committed until
/// mapped).
const ARENA: usize = 64 << 30;

/// Where the simulated device's addresses come from.
#[derive(Debug)]
pub(super) enum Backing {
    /// Real host memory: CPU code can read and write every address. Reservations come from the
    /// arena, made at the first reservation (`None` until then, or where none can be made).
    Host(Option<Space>),
    /// Unique addresses with nothing behind them, for dry runs of cards larger than the host:
    /// from 2^44 up to 2^62, so running past the end is a refusal, never a wrap onto live
    /// addresses.
    Fake(Space),
}

impl Backing {
    /// Whether the addresses are fake (nothing behind them).
    pub fn is_fake(&self) -> bool {
        matches!(self, Backing::Fake(_))
    }

    /// A copy of fake addresses' bookkeeping; `None` for host memory, whose copy would alias
    /// the memory behind it.
    pub fn copy_fake(&self) -> Option<Self> {
        match self {
            Backing::Host(_) => None,
            Backing::Fake(f) => Some(Backing::Fake(f.clone())),
        }
    }

    pub fn host() -> Self {
        Backing::Host(None)
    }

    pub fn fake() -> Self {
        Backing::Fake(Space::new(1 << 44, 1 << 62))
    }

    /// `len` bytes (a page multiple) of readable and writable memory.
    pub fn alloc(&mut self, len: usize) -> Option<Range> {
        match self {
            Backing::Host(_) => imp::alloc(len).map(|p| Range {
                base: p as u64,
                host_base: p as u64,
                host_len: len,
            }),
            Backing::Fake(f) => f.take(len, PAGE, 0),
        }
    }

    /// `len` bytes of address space aligned to `align` (a power of two), not yet accessible:
    /// at `hint` if it is aligned and free there, else anywhere.
    pub fn reserve(&mut self, len: usize, align: usize, hint: u64) -> Option<Range> {
        match self {
            Backing::Host(arena) => {
                if arena.is_none() {
                    *arena =
                        imp::arena(ARENA).map(|p| Space::new(p as u64, (p as u64) + ARENA as u64));
                }
                if let Some(r) = arena.as_mut().and_then(|a| a.take(len, align, hint)) {
                    return Some(r);
                }
                // The arena is full: a mapping of its own, over-reserved by one alignment unit
                // so the base can be aligned.
                let host_len = len.checked_add(align)?;
                let p = imp::reserve(host_len)? as u64;
                Some(Range {
                    base: p.next_multiple_of(align as u64),
                    host_base: p,
                    host_len,
                })
            }
            Backing::Fake(f) => f.take(len, align, hint),
        }
    }

    /// Makes `[at, at+len)` of a reservation accessible.
    ///
    /// # Safety
    /// The range lies inside a live reservation of this backing, page-aligned.
    pub unsafe fn commit(&mut self, at: u64, len: usize) -> bool {
        match self {
            // SAFETY: as the caller promises.
            Backing::Host(_) => unsafe { imp::commit(at as *mut u8, len) },
            Backing::Fake(_) => true,
        }
    }

    /// Makes a committed range inaccessible again and drops its contents.
    ///
    /// # Safety
    /// The range was committed and no one uses it any more.
    pub unsafe fn decommit(&mut self, at: u64, len: usize) {
        if let Backing::Host(_) = self {
            // SAFETY: as the caller promises.
            unsafe { imp::decommit(at as *mut u8, len) };
        }
    }

    /// Hands a range from `alloc` or `reserve` back. A reservation from the arena must have
    /// nothing committed in it any more (it stays inaccessible address space of the arena).
    ///
    /// # Safety
    /// `r` came from this backing and no one uses it any more.
    pub unsafe fn release(&mut self, r: Range) {
        match self {
            Backing::Host(Some(arena)) if arena.owns(&r) => arena.give_back(r),
            // SAFETY: as the caller promises.
            Backing::Host(_) => unsafe { imp::release(r.host_base as *mut u8, r.host_len) },
            Backing::Fake(f) => f.give_back(r),
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Host(Some(arena)) = self {
            // SAFETY: the arena is address space this backing mapped; the device owning it is
            // going away, and with it every range carved from it.
            unsafe { imp::release(arena.start() as *mut u8, ARENA) };
        }
    }
}
