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

pub(crate) fn round_to_page(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(PAGE)
}

/// Where the simulated device's addresses come from.
#[derive(Debug)]
pub(super) enum Backing {
    /// Real host memory: CPU code can read and write every address.
    Host,
    /// Unique addresses with nothing behind them, for dry runs of cards larger than the host.
    Fake(FakeSpace),
}

/// A range of addresses taken from the backing: `base` is aligned as asked, `host_base` and
/// `host_len` are what must be handed back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Range {
    pub base: u64,
    pub host_base: u64,
    pub host_len: usize,
}

impl Backing {
    /// `len` bytes (a page multiple) of readable and writable memory.
    pub fn alloc(&mut self, len: usize) -> Option<Range> {
        match self {
            Backing::Host => imp::alloc(len).map(|p| Range {
                base: p as u64,
                host_base: p as u64,
                host_len: len,
            }),
            Backing::Fake(f) => f.take(len, PAGE),
        }
    }

    /// `len` bytes of address space aligned to `align` (a power of two), not yet accessible.
    pub fn reserve(&mut self, len: usize, align: usize) -> Option<Range> {
        match self {
            Backing::Host => {
                // Over-reserve by one alignment unit so the base can be aligned.
                let host_len = len.checked_add(align)?;
                let p = imp::reserve(host_len)? as u64;
                Some(Range {
                    base: p.next_multiple_of(align as u64),
                    host_base: p,
                    host_len,
                })
            }
            Backing::Fake(f) => f.take(len, align),
        }
    }

    /// Makes `[at, at+len)` of a reservation accessible.
    ///
    /// # Safety
    /// The range lies inside a live reservation of this backing, page-aligned.
    pub unsafe fn commit(&mut self, at: u64, len: usize) -> bool {
        match self {
            // SAFETY: as the caller promises.
            Backing::Host => unsafe { imp::commit(at as *mut u8, len) },
            Backing::Fake(_) => true,
        }
    }

    /// Makes a committed range inaccessible again and drops its contents.
    ///
    /// # Safety
    /// The range was committed and no one uses it any more.
    pub unsafe fn decommit(&mut self, at: u64, len: usize) {
        if let Backing::Host = self {
            // SAFETY: as the caller promises.
            unsafe { imp::decommit(at as *mut u8, len) };
        }
    }

    /// Hands a range from `alloc` or `reserve` back.
    ///
    /// # Safety
    /// `r` came from this backing and no one uses it any more.
    pub unsafe fn release(&mut self, r: Range) {
        match self {
            // SAFETY: as the caller promises.
            Backing::Host => unsafe { imp::release(r.host_base as *mut u8, r.host_len) },
            Backing::Fake(f) => f.give_back(r),
        }
    }
}

/// Fake addresses for an unbacked device: from 2^44 up to 2^62, with released ranges reused
/// (first fit), so a long replay that makes and drops many pools never runs out, and running
/// past the end is a refusal, never a wrap onto live addresses.
#[derive(Debug, Default)]
pub(super) struct FakeSpace {
    next: u64,
    /// Released ranges: start → length.
    free: std::collections::BTreeMap<u64, u64>,
}

impl FakeSpace {
    const START: u64 = 1 << 44;
    /// The end of the fake address space.
    pub const END: u64 = 1 << 62;

    fn take(&mut self, len: usize, align: usize) -> Option<Range> {
        let len = (len as u64).checked_add(PAGE as u64)?; // a guard page between ranges
        let align = align as u64;
        let reuse = self.free.iter().find_map(|(&s, &l)| {
            let at = s.checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= s + l).then_some((s, l, at))
        });
        let (base, host_base, host_len) = match reuse {
            Some((s, l, at)) => {
                self.free.remove(&s);
                (at, s, l)
            }
            None => {
                let at = self.next.max(Self::START).checked_next_multiple_of(align)?;
                let end = at.checked_add(len)?;
                if end > Self::END {
                    return None;
                }
                self.next = end;
                (at, at, len)
            }
        };
        Some(Range {
            base,
            host_base,
            host_len: host_len as usize,
        })
    }

    /// Returns a range: merged with free neighbours, and given back to the bump pointer when it
    /// ends there, so the free list stays short (first fit scans it) however many ranges a
    /// long dry run takes and drops.
    fn give_back(&mut self, r: Range) {
        let (mut start, mut len) = (r.host_base, r.host_len as u64);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                (start, len) = (s, l + len);
            }
        }
        if let Some(&l) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += l;
        }
        if start + len == self.next {
            self.next = start;
        } else {
            self.free.insert(start, len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges given back in any order merge with their free neighbours and return to the bump
    /// pointer: the free list a first fit scans stays as short as the holes really are.
    #[test]
    fn fake_ranges_coalesce_and_return_to_the_top() {
        let mut f = FakeSpace::default();
        let a = f.take(1 << 20, 256).unwrap();
        let b = f.take(2 << 20, 256).unwrap();
        let c = f.take(3 << 20, 256).unwrap();
        let top = f.next;
        f.give_back(b);
        assert_eq!(f.free.len(), 1);
        f.give_back(a);
        assert_eq!(f.free.len(), 1, "a merged with b");
        // A range that fits the hole reuses it.
        let d = f.take(2 << 20, 256).unwrap();
        assert_eq!(d.host_base, FakeSpace::START);
        assert_eq!(f.next, top);
        f.give_back(c);
        f.give_back(d);
        assert!(f.free.is_empty(), "{:?}", f.free);
        assert_eq!(
            f.next,
            FakeSpace::START,
            "everything back to the bump pointer"
        );
    }
}
