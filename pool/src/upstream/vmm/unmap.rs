//! Giving the VMM upstream's mappings back: a segment from the top of the stack, or a leftover
//! of a failed growth (see `space.rs`).
//!
//! A segment across two reservations is two driver mappings. If the upper one is unmapped and
//! the lower is refused, the segment would be half there while the pool still places blocks in
//! it, so the lower is retried, and failing that the upper is mapped again: the segment is
//! whole and its release can be retried later. Only if that fails too is the segment given up:
//! what is left of it becomes a leftover, which the pool counts and releases on its own.

use super::space::{AddressSpace, Mapping, UNDO_TRIES};
use crate::driver::{CallKind, Driver, DriverError, ErrorCode};
use crate::placement::Segment;
use crate::stats::DriverCalls;

impl AddressSpace {
    /// Unmaps `seg`: a leftover, or the top of the stack (its mappings from the top down). A
    /// refusal leaves `seg` as it was, to be unmapped again later, except where a segment
    /// across two reservations is given up (`Ok`; see the module docs).
    pub fn unmap(
        &mut self,
        driver: &dyn Driver,
        seg: &Segment,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        if let Some(i) = self
            .strays
            .iter()
            .position(|m| m.ptr == seg.ptr && m.len == seg.len)
        {
            let m = self.strays[i];
            driver.unmap(m.ptr, m.len, m.handle)?;
            calls.record(CallKind::Unmap);
            self.strays.remove(i);
            self.settle_top(m.res);
            self.drop_empty_tail(driver);
            return Ok(());
        }
        let end = seg.ptr + seg.len as u64;
        // The mappings of `seg`: a run at the top of the stack from `seg.ptr`.
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
            if m.asleep {
                // Its physical memory went at the sleep: only the range and any copy are left.
                self.forget_asleep(&m);
                self.maps.pop();
                self.settle_top(m.res);
                continue;
            }
            let mut result = driver.unmap(m.ptr, m.len, m.handle);
            let tries = if gone.is_empty() { 1 } else { UNDO_TRIES };
            for _ in 1..tries {
                if result.is_ok() {
                    break;
                }
                result = driver.unmap(m.ptr, m.len, m.handle);
            }
            if let Err(e) = result {
                if gone.is_empty() || self.restore(driver, &gone, first, calls) {
                    return Err(e);
                }
                return Ok(());
            }
            calls.record(CallKind::Unmap);
            self.maps.pop();
            self.settle_top(m.res);
            gone.push(m);
        }
        self.drop_empty_tail(driver);
        Ok(())
    }

    /// Maps `gone` (the upper mappings of a segment, unmapped from the top down) again, so the
    /// segment whose lower mapping refused is whole. Returns whether it is; if not, what is
    /// left of the segment (`maps[first..]`) becomes a leftover.
    #[cold]
    fn restore(
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
                    self.settle_top(m.res);
                }
                Err(e) => {
                    tracing::error!(error = %e, bytes = m.len, "could not map again the unmapped part of a vmm segment whose release failed halfway; the rest is released on its own");
                    let again: Vec<Mapping> = self.maps.drain(self.maps.len() - i..).collect();
                    self.undo(driver, &again, calls);
                    let rest: Vec<Mapping> = self.maps.drain(first..).collect();
                    self.adopt(&rest);
                    return false;
                }
            }
        }
        true
    }
}
