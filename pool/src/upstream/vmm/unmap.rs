//! Giving a segment back: its pages unmapped from the top down, then its address space.
//!
//! Only the last segment handed out comes back (the placement releases from the top). A page
//! the driver refuses to unmap stops the release: the pages unmapped until then are vacant
//! from now on, the segment stays, and its release can be retried later. Nothing is half
//! mapped: a vacant range is an ordinary state of a segment, which the pool backs again before
//! a block lands on it.

use super::space::AddressSpace;
use crate::driver::{CallKind, Driver, DriverError, ErrorCode};
use crate::placement::Segment;
use crate::stats::DriverCalls;

impl AddressSpace {
    /// Unmaps `seg`'s pages and gives its address space back. A refusal leaves the segment in
    /// place, with the pages unmapped so far vacant.
    pub fn unmap(
        &mut self,
        driver: &dyn Driver,
        seg: &Segment,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        if self.segs.last() != Some(&(seg.ptr, seg.len)) {
            return Err(DriverError::new(
                CallKind::Unmap,
                ErrorCode::InvalidValue,
                format!(
                    "{} bytes at {:#x} are not the last segment of the pool's address space",
                    seg.len, seg.ptr
                ),
            ));
        }
        let end = seg.ptr + seg.len as u64;
        self.unmap_pages(driver, seg.ptr, end, calls)?;
        self.remove_vacant(seg.ptr, end);
        self.segs.pop();
        for r in &mut self.reservations {
            if r.base < end && r.base + r.top as u64 > seg.ptr {
                r.top = seg.ptr.saturating_sub(r.base) as usize;
            }
        }
        self.drop_empty_tail(driver);
        Ok(())
    }

    /// Unmaps every page in `[from, to)` from the top down (asleep ones are only forgotten),
    /// leaving the range vacant. A refusal stops there: what was unmapped until then is vacant.
    pub(super) fn unmap_pages(
        &mut self,
        driver: &dyn Driver,
        from: crate::driver::DevicePtr,
        to: crate::driver::DevicePtr,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        self.clear_stale(driver, from, to, calls)?;
        let inside: Vec<_> = self
            .pages
            .range(from..to)
            .rev()
            .map(|(&at, &p)| (at, p))
            .collect();
        for (at, p) in inside {
            if !p.asleep {
                // Its memory goes back only once no old mapping of it is left.
                self.clear_stale_of(driver, p.handle, calls)?;
                driver.unmap(at, p.len, p.handle)?;
                calls.record(CallKind::Unmap);
            } else {
                // Its physical memory went at the sleep: only the range and any copy are left.
                self.forget_asleep(at);
            }
            self.pages.remove(&at);
            self.held -= p.len;
            self.add_vacant(at, at + p.len as u64);
        }
        Ok(())
    }
}
