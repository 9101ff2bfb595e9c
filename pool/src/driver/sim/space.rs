//! An address-range allocator over `[start, end)`: where the simulated device's fake addresses
//! come from, and where its backed reservations sit inside one host arena.
//!
//! A range taken anywhere starts with a guard page, so two unrelated ranges never touch (a
//! block can never appear to span two allocations). A range taken at a hint has no guard: it
//! is meant to extend the range that ends there, as `cuMemAddressReserve` does when its
//! address hint is free. Released ranges are reused first fit and merged with their free
//! neighbours, and a range that ends at the bump pointer gives its space back to it, so the
//! free list stays as short as the holes really are.

use std::collections::BTreeMap;

/// The host's page size, the unit of the guard between ranges.
pub(crate) const PAGE: usize = 4096;

/// A range of addresses taken from the backing or a space: `base` is aligned as asked,
/// `host_base` and `host_len` are what must be handed back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Range {
    pub base: u64,
    pub host_base: u64,
    pub host_len: usize,
}

/// See the module docs.
#[derive(Clone, Debug)]
pub(super) struct Space {
    start: u64,
    end: u64,
    /// Everything from here to `end` is free.
    next: u64,
    /// Released ranges below `next`: start → length.
    free: BTreeMap<u64, u64>,
}

impl Space {
    pub fn new(start: u64, end: u64) -> Self {
        Self {
            start,
            end,
            next: start,
            free: BTreeMap::new(),
        }
    }

    /// `len` bytes aligned to `align` (a power of two): at `hint` when it is aligned and the
    /// range there is free, else anywhere with a guard page before it. `None` when no room.
    pub fn take(&mut self, len: usize, align: usize, hint: u64) -> Option<Range> {
        let len = len as u64;
        if hint != 0 && hint % align as u64 == 0 {
            if let Some(r) = self.take_at(hint, len) {
                return Some(r);
            }
        }
        self.take_anywhere(len, align as u64)
    }

    fn take_at(&mut self, at: u64, len: u64) -> Option<Range> {
        let stop = at.checked_add(len)?;
        if at >= self.next {
            if stop > self.end {
                return None;
            }
            if at > self.next {
                self.free.insert(self.next, at - self.next);
            }
            self.next = stop;
        } else {
            let (&s, &l) = self.free.range(..=at).next_back()?;
            if stop > s + l {
                return None;
            }
            self.free.remove(&s);
            self.keep_free(s, at);
            self.keep_free(stop, s + l);
        }
        Some(Range {
            base: at,
            host_base: at,
            host_len: len as usize,
        })
    }

    fn take_anywhere(&mut self, len: u64, align: u64) -> Option<Range> {
        let place = |s: u64| -> Option<(u64, u64)> {
            let at = s
                .checked_add(PAGE as u64)?
                .checked_next_multiple_of(align)?;
            Some((at, at.checked_add(len)?))
        };
        let reuse = self.free.iter().find_map(|(&s, &l)| {
            let (at, stop) = place(s)?;
            (stop <= s + l).then_some((s, l, at, stop))
        });
        let (host_base, at, stop) = match reuse {
            Some((s, l, at, stop)) => {
                self.free.remove(&s);
                self.keep_free(stop, s + l);
                (s, at, stop)
            }
            None => {
                let s = self.next;
                let (at, stop) = place(s)?;
                if stop > self.end {
                    return None;
                }
                self.next = stop;
                (s, at, stop)
            }
        };
        Some(Range {
            base: at,
            host_base,
            host_len: (stop - host_base) as usize,
        })
    }

    fn keep_free(&mut self, from: u64, to: u64) {
        if to > from {
            self.free.insert(from, to - from);
        }
    }

    /// The first address of the space.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Whether `r` was taken from this space.
    pub fn owns(&self, r: &Range) -> bool {
        r.host_base >= self.start && r.host_base < self.end
    }

    /// Returns a range taken from this space.
    pub fn give_back(&mut self, r: Range) {
        let (mut start, mut len) = (r.host_base, r.host_len as u64);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                (start, len) = (s, l + len);
            }
        }
        if let Some(l) = self.free.remove(&(start + len)) {
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

    const START: u64 = 1 << 44;
    const MIB: usize = 1 << 20;

    fn space() -> Space {
        Space::new(START, 1 << 62)
    }

    /// Ranges given back in any order merge with their free neighbours and return to the bump
    /// pointer: the free list a first fit scans stays as short as the holes really are.
    #[test]
    fn ranges_coalesce_and_return_to_the_top() {
        let mut f = space();
        let a = f.take(MIB, 256, 0).unwrap();
        let b = f.take(2 * MIB, 256, 0).unwrap();
        let c = f.take(3 * MIB, 256, 0).unwrap();
        let top = f.next;
        f.give_back(b);
        assert_eq!(f.free.len(), 1);
        f.give_back(a);
        assert_eq!(f.free.len(), 1, "a merged with b");
        // A range that fits the hole reuses it.
        let d = f.take(2 * MIB, 256, 0).unwrap();
        assert_eq!(d.host_base, START);
        assert_eq!(f.next, top);
        f.give_back(c);
        f.give_back(d);
        assert!(f.free.is_empty(), "{:?}", f.free);
        assert_eq!(f.next, START, "everything back to the bump pointer");
    }

    /// A free hint is honoured, so a range extends the one before it; a taken or misaligned
    /// hint is not, and a range taken anywhere never touches another.
    #[test]
    fn hints_extend_when_free_and_ranges_never_touch_otherwise() {
        let mut f = space();
        let a = f.take(2 * MIB, 2 * MIB, 0).unwrap();
        let a_end = a.base + 2 * MIB as u64;
        let b = f.take(2 * MIB, 2 * MIB, a_end).unwrap();
        assert_eq!(b.base, a_end, "the free hint is honoured");
        let c = f.take(2 * MIB, 2 * MIB, a_end).unwrap();
        assert!(c.base > a_end + 2 * MIB as u64, "a taken hint is not");
        let d = f.take(2 * MIB, 2 * MIB, a_end + 1).unwrap();
        assert!(d.base > c.base, "a misaligned hint is not");
        for (x, y) in [(&a, &c), (&c, &d)] {
            assert!(x.base + 2 * MIB as u64 <= y.host_base && y.host_base < y.base);
        }
        // A hint inside a released range is honoured too, and splits it.
        f.give_back(b);
        let e = f.take(MIB, 2 * MIB, a_end).unwrap();
        assert_eq!(e.base, a_end);
        for r in [a, c, d, e] {
            f.give_back(r);
        }
        assert!(f.free.is_empty(), "{:?}", f.free);
        assert_eq!(f.next, START);
    }

    /// Past the end is a refusal, never a wrap.
    #[test]
    fn the_end_is_a_refusal() {
        let mut f = Space::new(START, START + 8 * MIB as u64);
        let a = f.take(4 * MIB, 2 * MIB, 0).unwrap();
        assert!(f.take(4 * MIB, 2 * MIB, 0).is_none());
        assert!(f.take(8 * MIB, 2 * MIB, a.base + 4 * MIB as u64).is_none());
        f.give_back(a);
        assert!(f.take(4 * MIB, 2 * MIB, 0).is_some());
    }
}
