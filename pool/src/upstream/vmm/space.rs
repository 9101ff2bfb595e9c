//! The VMM upstream's address space: its reservations in the order they were made, and the
//! stack of physical mappings in them.
//!
//! Mappings go at the mapped end of the last reservation. A mapping run may cross into the
//! next reservation only where that one starts exactly where the previous ends (the driver
//! honoured the address hint): it is then two driver mappings, one in each, behind one segment,
//! and the pool sees one contiguous range. Mappings come back from the top of the stack; a
//! reservation other than the first is released as soon as nothing is mapped in it, so the
//! address space a pool holds follows its peak down after a trim. The first stays until the
//! pool closes, as ggml keeps its one reservation: a pool that trims at every ubatch does not
//! reserve again each time.
//!
//! A mapping that a failed growth made and could not undo (the driver refused the unmap every
//! time) is a leftover: no block may use it, yet the device holds it. It is handed to the pool
//! as a segment of its own ([`AddressSpace::take_leftovers`]), which counts it as reserved and
//! releases it with the releases the driver refused, at the next purge (`unmap.rs`). Growth
//! goes on above it.

use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, PhysHandle};
use crate::placement::Segment;
use crate::stats::DriverCalls;

#[derive(Clone, Copy, Debug)]
pub(super) struct Reservation {
    pub base: DevicePtr,
    pub len: usize,
    /// End of its highest mapping, from `base`: where the next mapping in it goes.
    pub top: usize,
}

impl Reservation {
    fn end(&self) -> DevicePtr {
        self.base + self.len as u64
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Mapping {
    pub ptr: DevicePtr,
    pub len: usize,
    pub handle: PhysHandle,
    /// Index of its reservation.
    pub res: usize,
    /// Unmapped by a sleep: the address range is kept, the physical memory is gone until the
    /// pool wakes (`sleep.rs`).
    pub asleep: bool,
}

impl Mapping {
    pub(super) fn end(&self) -> DevicePtr {
        self.ptr + self.len as u64
    }
}

/// Where the next mapping goes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tail {
    /// Its address: the mapped end of the last reservation.
    pub at: DevicePtr,
    /// Bytes left in the last reservation.
    pub room: usize,
    /// Whether it starts where the last mapping ends (or there is none), so the pool sees a
    /// mapping there as extending its range.
    pub extends: bool,
    /// The end of the last reservation: the hint for the next one.
    pub end: DevicePtr,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct AddressSpace {
    pub(super) reservations: Vec<Reservation>,
    /// The mappings behind the pool's segments, in the order they were made.
    pub(super) maps: Vec<Mapping>,
    /// Leftover mappings (see the module docs), each a segment of the pool's refused releases.
    pub(super) strays: Vec<Mapping>,
    /// How many of `strays`, from the end, the pool has not been handed yet.
    unclaimed: usize,
    /// Host copies of mappings that sleep offloaded, by mapping address, until wake restores
    /// them (`sleep.rs`).
    pub(super) copies: Vec<(DevicePtr, crate::driver::HostBuffer)>,
    /// Host buffers a wake emptied, kept for the next offload (`sleep.rs`).
    pub(super) spares: Vec<crate::driver::HostBuffer>,
}

/// How often undoing part of a failed growth, or finishing a half-done release, is tried.
pub(super) const UNDO_TRIES: usize = 3;

impl AddressSpace {
    /// Bytes mapped in all reservations (asleep mappings hold no physical memory).
    pub fn mapped(&self) -> usize {
        self.maps
            .iter()
            .chain(&self.strays)
            .filter(|m| !m.asleep)
            .map(|m| m.len)
            .sum()
    }

    /// Recomputes where the next mapping in reservation `res` goes, after an unmap: the end
    /// of its highest mapping. Within a reservation the stack is in address order, so that is
    /// its last mapping in `maps`, unless a leftover lies above.
    pub(super) fn settle_top(&mut self, res: usize) {
        let base = self.reservations[res].base;
        let ends = self.maps.iter().rev().find(|m| m.res == res).into_iter();
        let ends = ends.chain(self.strays.iter().filter(|m| m.res == res));
        self.reservations[res].top = ends.map(|m| (m.end() - base) as usize).max().unwrap_or(0);
    }

    /// Makes `rest` (mappings in no segment any more, in no list) leftovers.
    pub(super) fn adopt(&mut self, rest: &[Mapping]) {
        self.strays.extend_from_slice(rest);
        self.unclaimed += rest.len();
        for m in rest {
            self.settle_top(m.res);
        }
    }

    /// The leftovers made since the last call, as segments for the pool to count and release.
    pub fn take_leftovers(&mut self) -> Vec<Segment> {
        let new = &self.strays[self.strays.len() - self.unclaimed..];
        self.unclaimed = 0;
        new.iter()
            .map(|m| Segment {
                ptr: m.ptr,
                len: m.len,
                handle: m.handle.0,
            })
            .collect()
    }

    /// Live reservations.
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    /// Where the next mapping goes; `None` before the first reservation.
    pub fn tail(&self) -> Option<Tail> {
        let r = self.reservations.last()?;
        let at = r.base + r.top as u64;
        Some(Tail {
            at,
            room: r.len - r.top,
            extends: self.maps.last().is_none_or(|m| m.end() == at),
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

    /// Maps `len` bytes at `at`, the mapped end of a reservation, continuing into the next
    /// reservation where `at + len` passes its end (the next must then start there). A
    /// failure unmaps what this call mapped.
    pub fn map(
        &mut self,
        driver: &dyn Driver,
        at: DevicePtr,
        len: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let continues = |r: &Reservation| r.base + r.top as u64 == at && at < r.end();
        let Some(first) = self.reservations.iter().rposition(continues) else {
            return Err(outside(at, len));
        };
        let mut done: Vec<Mapping> = Vec::with_capacity(2);
        let (mut ptr, mut left, mut res) = (at, len, first);
        while left > 0 {
            let r = self.reservations.get(res).copied();
            let part = match r {
                Some(r) if r.base + r.top as u64 == ptr && ptr < r.end() => {
                    left.min((r.end() - ptr) as usize)
                }
                _ => {
                    self.undo(driver, &done, calls);
                    return Err(outside(at, len));
                }
            };
            match driver.map(ptr, part) {
                Ok(handle) => {
                    calls.record(CallKind::Map);
                    done.push(Mapping {
                        ptr,
                        len: part,
                        handle,
                        res,
                        asleep: false,
                    });
                    self.reservations[res].top += part;
                }
                Err(e) => {
                    self.undo(driver, &done, calls);
                    return Err(e);
                }
            }
            (ptr, left, res) = (ptr + part as u64, left - part, res + 1);
        }
        self.maps.extend_from_slice(&done);
        Ok(Segment {
            ptr: at,
            len,
            handle: done[0].handle.0,
        })
    }

    /// Unmaps what one [`AddressSpace::map`] call mapped before it failed (`done`, not in
    /// `maps`); what the driver refuses to unmap becomes a leftover.
    pub(super) fn undo(&mut self, driver: &dyn Driver, done: &[Mapping], calls: &mut DriverCalls) {
        for m in done.iter().rev() {
            let mut result = driver.unmap(m.ptr, m.len, m.handle);
            for _ in 1..UNDO_TRIES {
                if result.is_ok() {
                    break;
                }
                result = driver.unmap(m.ptr, m.len, m.handle);
            }
            match result {
                Ok(()) => calls.record(CallKind::Unmap),
                Err(e) => {
                    tracing::error!(error = %e, bytes = m.len, "could not undo part of a failed vmm growth; the pool keeps it as reserved and releases it at its next purge");
                    self.adopt(std::slice::from_ref(m));
                }
            }
            self.settle_top(m.res);
        }
    }

    /// Releases the reservations after the first that nothing is mapped in, from the last.
    /// A refusal is logged and the reservation kept: mappings go there next, and close retries.
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

    /// Releases every reservation, once nothing is mapped (the pool releases its leftovers
    /// before it closes).
    pub fn close(&mut self, driver: &dyn Driver) -> Result<(), DriverError> {
        if !self.maps.is_empty() || !self.strays.is_empty() {
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
        format!("{len} bytes at {at:#x} do not continue the mapped end of the pool's reservations"),
    )
}
