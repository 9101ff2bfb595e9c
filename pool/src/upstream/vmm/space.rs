//! The VMM upstream's address space: its reservations in the order they were made, the
//! segments handed out in them, the segments apart (`apart.rs`), and the pages of physical
//! memory behind all of them.
//!
//! Segments are address space only: they are handed out at the end of the last reservation,
//! crossing into the next only where that one starts exactly where the previous ends (the driver
//! honoured the address hint), so the pool sees one contiguous range. Physical memory is put
//! behind a segment's ranges where blocks land (`recycle.rs`), as pages: each one physical
//! allocation mapped inside one reservation. A range of a segment with no page is *vacant*;
//! the pool core asks [`AddressSpace::backed`] before it hands out a block, so no block ever
//! lies on a vacant range. Vacant ranges come from growth (a new segment starts vacant), from
//! recycling (a free page moved to where a new block lands) and from a release the driver
//! refused halfway.
//!
//! Segments come back from the top of the stack (`unmap.rs`); a reservation other than the
//! first is released as soon as nothing is handed out in it, so the address space a pool holds
//! follows its peak down after a trim. The first stays until the pool closes, as ggml keeps its
//! one reservation: a pool that trims at every ubatch does not reserve again each time.

use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, PhysHandle};
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::collections::{BTreeMap, HashMap, VecDeque};

#[derive(Clone, Copy, Debug)]
pub(super) struct Reservation {
    pub base: DevicePtr,
    pub len: usize,
    /// End of the address space handed out in it, from `base`: where the next segment goes.
    pub top: usize,
}

impl Reservation {
    pub(super) fn end(&self) -> DevicePtr {
        self.base + self.len as u64
    }
}

/// One physical allocation mapped at its address (the key in [`AddressSpace::pages`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Page {
    pub len: usize,
    pub handle: PhysHandle,
    /// Unmapped by a sleep: the address range is kept, the physical memory is gone until the
    /// pool wakes (`sleep.rs`).
    pub asleep: bool,
}

/// One stale mapping (the key in [`AddressSpace::stale`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Stale {
    pub len: usize,
    pub handle: PhysHandle,
    /// The device's epoch when the page moved away: idle once a synchronize after it finished.
    pub epoch: u64,
}

/// Where the next segment goes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tail {
    /// Its address: the end of what the last reservation handed out.
    pub at: DevicePtr,
    /// Bytes left in the last reservation.
    pub room: usize,
    /// Whether it starts where the last segment ends (or there is none), so the pool sees a
    /// segment there as extending its range.
    pub extends: bool,
    /// The end of the last reservation: the hint for the next one.
    pub end: DevicePtr,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct AddressSpace {
    pub(super) reservations: Vec<Reservation>,
    /// The segments handed out, in order (address, length): released from the end.
    pub(super) segs: Vec<(DevicePtr, usize)>,
    /// Segments apart, each a reservation of its own: start → length (`apart.rs`).
    pub(super) apart: BTreeMap<DevicePtr, usize>,
    /// The pages behind the segments, by address.
    pub(super) pages: BTreeMap<DevicePtr, Page>,
    /// Bytes of `pages`, kept as they change: the core reads it after every slow path.
    pub(super) held: usize,
    /// Ranges of segments with no page behind them: start → end, merged with their neighbours.
    pub(super) vacant: super::runs::Runs,
    /// Host copies of pages that sleep offloaded, by page address, until wake restores them
    /// (`sleep.rs`).
    pub(super) copies: Vec<(DevicePtr, crate::driver::HostBuffer)>,
    /// Host buffers a wake emptied, kept for the next offload (`sleep.rs`).
    pub(super) spares: Vec<crate::driver::HostBuffer>,
    /// Old addresses of moved pages, still mapped (`stale.rs`); their ranges are vacant too.
    pub(super) stale: BTreeMap<DevicePtr, Stale>,
    /// The stale mappings of each page's memory.
    pub(super) stale_of: HashMap<PhysHandle, Vec<DevicePtr>>,
    /// (epoch, bytes) of every move that left a stale mapping, oldest first, until it is idle.
    pub(super) stale_queue: VecDeque<(u64, usize)>,
    /// Bytes of `stale_queue`.
    pub(super) busy_stale: usize,
}

impl AddressSpace {
    /// Bytes of physical memory mapped now (asleep pages hold none).
    pub fn mapped(&self) -> usize {
        self.pages
            .values()
            .filter(|p| !p.asleep)
            .map(|p| p.len)
            .sum()
    }

    /// Bytes of pages, asleep or not: what the pool counts as reserved.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether `[at, at+len)` has memory behind every byte. O(log n), and one comparison
    /// while nothing is vacant: the pool asks it on its fast path.
    #[inline]
    pub fn backed(&self, at: DevicePtr, len: usize) -> bool {
        self.vacant.is_empty() || {
            let end = at + len as u64;
            self.vacant.before(end).next().is_none_or(|(_, e)| e <= at)
        }
    }

    /// Bytes of `[at, at+len)` with no memory behind them.
    pub fn unbacked(&self, at: DevicePtr, len: usize) -> usize {
        let end = at + len as u64;
        let mut n = 0;
        // Vacant ranges are disjoint and sorted, so their ends are too: from the last one that
        // starts before `end`, back to the first that ends by `at`. One bisection (`runs.rs`),
        // and for a range with memory behind all of it (a lane weighed for a block, on every
        // large allocation) one entry looked at.
        for (s, e) in self.vacant.before(end) {
            if e <= at {
                break;
            }
            n += (e.min(end).saturating_sub(s.max(at))) as usize;
        }
        n
    }

    /// Live reservations.
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    /// Where the next segment goes; `None` before the first reservation.
    pub fn tail(&self) -> Option<Tail> {
        let r = self.reservations.last()?;
        let at = r.base + r.top as u64;
        Some(Tail {
            at,
            room: r.len - r.top,
            extends: self.segs.last().is_none_or(|&(p, l)| p + l as u64 == at),
            end: r.end(),
        })
    }

    /// Reserves `len` bytes at `hint` if the driver can (0: anywhere), halving the size on
    /// out-of-memory down to `need` (both multiples of `gran`). Returns the base and the size
    /// reserved.
    pub fn reserve(
        &mut self,
        driver: &dyn Driver,
        len: usize,
        need: usize,
        hint: DevicePtr,
        gran: usize,
        calls: &mut DriverCalls,
    ) -> Result<(DevicePtr, usize), DriverError> {
        let mut len = len.max(need);
        loop {
            match driver.reserve(len, hint) {
                Ok(base) => {
                    calls.record(CallKind::Reserve);
                    self.reservations.push(Reservation { base, len, top: 0 });
                    tracing::debug!(
                        base = format_args!("{base:#x}"),
                        bytes = len,
                        at_hint = hint != 0 && base == hint,
                        reservations = self.reservations.len(),
                        "vmm reserved address space"
                    );
                    return Ok((base, len));
                }
                Err(e) if e.is_oom() && len > need => {
                    let smaller = (len / 2).next_multiple_of(gran).max(need);
                    tracing::debug!(refused = len, retry = smaller, error = %e, "vmm reservation refused; trying a smaller one");
                    len = smaller;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands out `len` bytes of address space at `at`, the end of what a reservation handed
    /// out, continuing into the next reservation where `at + len` passes its end (the next
    /// must then start there). The segment starts vacant.
    pub fn claim(&mut self, at: DevicePtr, len: usize) -> Result<Segment, DriverError> {
        let continues = |r: &Reservation| r.base + r.top as u64 == at && at < r.end();
        let Some(first) = self.reservations.iter().rposition(continues) else {
            return Err(outside(at, len));
        };
        // Check the whole run first: a refusal changes nothing.
        let (mut ptr, mut left, mut res) = (at, len, first);
        let mut parts = Vec::with_capacity(2);
        while left > 0 {
            match self.reservations.get(res) {
                Some(r) if r.base + r.top as u64 == ptr && ptr < r.end() => {
                    let part = left.min((r.end() - ptr) as usize);
                    parts.push((res, part));
                    (ptr, left, res) = (ptr + part as u64, left - part, res + 1);
                }
                _ => return Err(outside(at, len)),
            }
        }
        for (res, part) in parts {
            self.reservations[res].top += part;
        }
        self.segs.push((at, len));
        self.add_vacant(at, at + len as u64);
        Ok(Segment {
            ptr: at,
            len,
            handle: 0,
        })
    }

    /// Marks `[from, to)` vacant, merged with the vacant ranges it touches.
    pub(super) fn add_vacant(&mut self, mut from: DevicePtr, mut to: DevicePtr) {
        if from >= to {
            return;
        }
        if let Some((s, e)) = self.vacant.last_by(from) {
            if e >= from {
                self.vacant.remove(s);
                from = s;
                to = to.max(e);
            }
        }
        // The ranges that start in `[from, to]` merge with it (`to` inclusive: one that starts
        // where it ends touches it).
        loop {
            let next = self.vacant.starting_in(from, to.saturating_add(1)).next();
            let Some((s, e)) = next else { break };
            self.vacant.remove(s);
            to = to.max(e);
        }
        self.vacant.insert(from, to);
    }

    /// Marks `[from, to)` backed: removes it from the vacant ranges.
    pub(super) fn remove_vacant(&mut self, from: DevicePtr, to: DevicePtr) {
        let mut hit: Vec<(DevicePtr, DevicePtr)> = Vec::new();
        if let Some((s, e)) = self.vacant.before(from).next() {
            if e > from {
                hit.push((s, e));
            }
        }
        hit.extend(self.vacant.starting_in(from, to));
        for (s, e) in hit {
            self.vacant.remove(s);
            if s < from {
                self.vacant.insert(s, from);
            }
            if e > to {
                self.vacant.insert(to, e);
            }
        }
    }

    /// The vacant ranges inside `[from, to)`, each cut at reservation ends and segment starts:
    /// a page lies in one reservation, and in one segment, so releasing the last segment
    /// unmaps every page behind it (a page reaching back into the segment before would stay
    /// mapped under address space handed out again).
    pub(super) fn vacant_in(&self, from: DevicePtr, to: DevicePtr) -> Vec<(DevicePtr, DevicePtr)> {
        let mut runs: Vec<(DevicePtr, DevicePtr)> = Vec::new();
        if let Some((_, e)) = self.vacant.before(from).next() {
            if e > from {
                runs.push((from, e.min(to)));
            }
        }
        runs.extend(
            self.vacant
                .starting_in(from, to)
                .map(|(s, e)| (s, e.min(to))),
        );
        let mut out = Vec::with_capacity(runs.len());
        for (mut s, e) in runs {
            let mut cuts: Vec<DevicePtr> = self
                .reservations
                .iter()
                .map(|r| r.base)
                .chain(self.segs.iter().map(|&(p, _)| p))
                .chain(self.apart.iter().flat_map(|(&p, &l)| [p, p + l as u64]))
                .filter(|&c| c > s && c < e)
                .collect();
            cuts.sort_unstable();
            cuts.dedup();
            for c in cuts {
                out.push((s, c));
                s = c;
            }
            out.push((s, e));
        }
        out.sort_unstable();
        out
    }

    /// Releases the reservations after the first that nothing is handed out in, from the last.
    /// A refusal is logged and the reservation kept: segments go there next, and close retries.
    pub fn drop_empty_tail(&mut self, driver: &dyn Driver) {
        while self.reservations.len() > 1 {
            let r = self.reservations[self.reservations.len() - 1];
            if r.top > 0 {
                return;
            }
            if let Err(e) = driver.release_reservation(r.base, r.len) {
                tracing::error!(error = %e, "could not release an empty vmm reservation; kept");
                return;
            }
            self.reservations.pop();
        }
    }

    /// Releases every reservation, once no segment is left.
    pub fn close(&mut self, driver: &dyn Driver) -> Result<(), DriverError> {
        if !self.segs.is_empty() || !self.apart.is_empty() || !self.pages.is_empty() {
            return Ok(());
        }
        while let Some(r) = self.reservations.last().copied() {
            driver.release_reservation(r.base, r.len)?;
            self.reservations.pop();
        }
        Ok(())
    }
}

fn outside(at: DevicePtr, len: usize) -> DriverError {
    DriverError::new(
        CallKind::Map,
        ErrorCode::InvalidValue,
        format!("{len} bytes at {at:#x} do not continue the end of the pool's reservations"),
    )
}

#[cfg(test)]
mod tests {
    use super::AddressSpace;
    use proptest::prelude::*;

    proptest! {
        /// The one-descent count of bytes without memory is the count page by page.
        #[test]
        fn unbacked_bytes_are_the_vacant_bytes_of_the_range(
            gaps in proptest::collection::vec((0u64..8, 1u64..8), 0..12),
            at in 0u64..120,
            len in 0usize..60,
        ) {
            let mut space = AddressSpace::default();
            let mut next = 0;
            for (skip, n) in gaps {
                // Disjoint, and never adjacent: merged ranges, as the space keeps them.
                let s = next + skip + 1;
                space.vacant.insert(s, s + n);
                next = s + n;
            }
            let naive = (at..at + len as u64)
                .filter(|&b| space.vacant.iter().any(|(s, e)| s <= b && b < e))
                .count();
            prop_assert_eq!(space.unbacked(at, len), naive);
        }
    }
}
