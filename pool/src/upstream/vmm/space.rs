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

use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, PhysHandle};
use crate::placement::Segment;
use crate::stats::DriverCalls;

#[derive(Clone, Copy, Debug)]
struct Reservation {
    base: DevicePtr,
    len: usize,
    /// Bytes mapped from `base`.
    mapped: usize,
}

impl Reservation {
    fn end(&self) -> DevicePtr {
        self.base + self.len as u64
    }
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    ptr: DevicePtr,
    len: usize,
    handle: PhysHandle,
    /// Index of its reservation.
    res: usize,
}

impl Mapping {
    fn end(&self) -> DevicePtr {
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
    reservations: Vec<Reservation>,
    maps: Vec<Mapping>,
    /// Mappings of a failed growth that could not be undone: no segment holds them; close
    /// unmaps them. Mappings never go below them (their reservation's mapped end is above).
    strays: Vec<Mapping>,
}

/// How often undoing part of a failed growth is tried before the mapping is left for close.
const UNDO_TRIES: usize = 3;

impl AddressSpace {
    /// Bytes mapped in all reservations.
    pub fn mapped(&self) -> usize {
        self.reservations.iter().map(|r| r.mapped).sum()
    }

    /// Live reservations.
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    /// Where the next mapping goes; `None` before the first reservation.
    pub fn tail(&self) -> Option<Tail> {
        let r = self.reservations.last()?;
        let at = r.base + r.mapped as u64;
        Some(Tail {
            at,
            room: r.len - r.mapped,
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
                    self.reservations.push(Reservation {
                        base,
                        len,
                        mapped: 0,
                    });
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
        let continues = |r: &Reservation| r.base + r.mapped as u64 == at && at < r.end();
        let Some(first) = self.reservations.iter().rposition(continues) else {
            return Err(outside(at, len));
        };
        let mut done: Vec<Mapping> = Vec::with_capacity(2);
        let (mut ptr, mut left, mut res) = (at, len, first);
        while left > 0 {
            let r = self.reservations.get(res).copied();
            let part = match r {
                Some(r) if r.base + r.mapped as u64 == ptr && ptr < r.end() => {
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
                    });
                    self.reservations[res].mapped += part;
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

    /// Unmaps what one [`AddressSpace::map`] call mapped before it failed.
    fn undo(&mut self, driver: &dyn Driver, done: &[Mapping], calls: &mut DriverCalls) {
        for m in done.iter().rev() {
            let mut result = driver.unmap(m.ptr, m.len, m.handle);
            for _ in 1..UNDO_TRIES {
                if result.is_ok() {
                    break;
                }
                result = driver.unmap(m.ptr, m.len, m.handle);
            }
            match result {
                Ok(()) => {
                    calls.record(CallKind::Unmap);
                    self.reservations[m.res].mapped -= m.len;
                }
                Err(e) => {
                    tracing::error!(error = %e, bytes = m.len, "could not undo part of a failed vmm growth; it stays mapped until the pool closes");
                    self.strays.push(*m);
                }
            }
        }
    }

    /// Unmaps `seg`, which must be the top of the stack: its mappings from the top down. A
    /// refusal leaves `seg` whole, to be unmapped again later; only if a segment crossing two
    /// reservations can neither finish nor be made whole again is it given up (`Ok`, with its
    /// leftovers unmapped at close; see [`AddressSpace::settle_partial`]).
    pub fn unmap(
        &mut self,
        driver: &dyn Driver,
        seg: &Segment,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let end = seg.ptr + seg.len as u64;
        // The mappings of `seg` still held: a run at the top of the stack from `seg.ptr`.
        let mut first = self.maps.len();
        while first > 0 {
            let m = self.maps[first - 1];
            if m.ptr < seg.ptr || m.end() > end {
                break;
            }
            first -= 1;
            if m.ptr == seg.ptr {
                break;
            }
        }
        if first == self.maps.len() || self.maps[first].ptr != seg.ptr {
            return Err(DriverError::new(
                CallKind::Unmap,
                ErrorCode::InvalidValue,
                format!(
                    "{} bytes at {:#x} are not the end of the mapped range",
                    seg.len, seg.ptr
                ),
            ));
        }
        let mut gone: Vec<Mapping> = Vec::new();
        while self.maps.len() > first {
            let m = self.maps[self.maps.len() - 1];
            let mut result = driver.unmap(m.ptr, m.len, m.handle);
            // Once part of a segment that crosses into a further reservation is unmapped, the
            // rest is retried: a half-unmapped segment must not stay behind.
            let tries = if gone.is_empty() { 1 } else { UNDO_TRIES };
            for _ in 1..tries {
                if result.is_ok() {
                    break;
                }
                result = driver.unmap(m.ptr, m.len, m.handle);
            }
            if let Err(e) = result {
                if gone.is_empty() || self.settle_partial(driver, &gone, first, calls) {
                    return Err(e);
                }
                // Given up: the segment is no longer the pool's.
                return Ok(());
            }
            calls.record(CallKind::Unmap);
            self.maps.pop();
            self.reservations[m.res].mapped -= m.len;
            gone.push(m);
        }
        self.drop_empty_tail(driver);
        Ok(())
    }

    /// After the mappings `gone` (the top of a segment, from the top down) were unmapped and
    /// the one below them refused: maps them again, so the segment is whole and its release
    /// can be retried. If that fails too, the segment is given up: what is still mapped of it
    /// becomes stray (no segment holds it; close unmaps it), so the pool never places a block
    /// over the unmapped part. Returns whether the segment is whole again.
    #[cold]
    fn settle_partial(
        &mut self,
        driver: &dyn Driver,
        gone: &[Mapping],
        first: usize,
        calls: &mut DriverCalls,
    ) -> bool {
        for (i, m) in gone.iter().rev().enumerate() {
            match driver.map(m.ptr, m.len) {
                Ok(handle) => {
                    calls.record(CallKind::Map);
                    self.maps.push(Mapping { handle, ..*m });
                    self.reservations[m.res].mapped += m.len;
                }
                Err(e) => {
                    tracing::error!(error = %e, bytes = m.len, "could not map again the unmapped part of a vmm segment whose release failed halfway; the rest of it stays mapped until the pool closes");
                    // Mapped again so far: unmapped once more (best effort), then the segment's
                    // remaining mappings are strays.
                    let again: Vec<Mapping> = self.maps.drain(self.maps.len() - i..).collect();
                    self.undo(driver, &again, calls);
                    let rest: Vec<Mapping> = self.maps.drain(first..).collect();
                    self.strays.extend(rest);
                    return false;
                }
            }
        }
        true
    }

    /// Releases the reservations after the first that nothing is mapped in, from the last.
    /// A refusal is logged and the reservation kept: mappings go there next, and close retries.
    pub fn drop_empty_tail(&mut self, driver: &dyn Driver) {
        while self.reservations.len() > 1 {
            let r = self.reservations[self.reservations.len() - 1];
            if r.mapped > 0 {
                return;
            }
            if let Err(e) = driver.release_reservation(r.base, r.len) {
                tracing::error!(error = %e, "could not release an empty vmm reservation; kept");
                return;
            }
            self.reservations.pop();
        }
    }

    /// Releases every reservation, once no segment is mapped.
    pub fn close(&mut self, driver: &dyn Driver) -> Result<(), DriverError> {
        if !self.maps.is_empty() {
            return Ok(());
        }
        while let Some(m) = self.strays.last().copied() {
            driver.unmap(m.ptr, m.len, m.handle)?;
            self.strays.pop();
            self.reservations[m.res].mapped -= m.len;
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
