//! Segments apart: address space outside the pool's contiguous range, for a placement that keeps
//! some blocks by themselves ([`crate::placement::lanes`]).
//!
//! Each is a reservation of its own, so it comes back in any order and its address space goes
//! back with it. Memory goes behind it as behind any segment, in pages, only where blocks land
//! (`recycle.rs`); its pages may move to other segments and back. A page never spans two
//! segments: vacant runs are cut at every segment apart's ends (`space.rs`).

use super::space::AddressSpace;
use super::VmmReserve;
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode};
use crate::placement::Segment;
use crate::stats::DriverCalls;

impl VmmReserve {
    /// [`crate::upstream::Upstream::acquire_apart`]: `len` rounded up to the granularity.
    pub(super) fn reserve_apart(
        &mut self,
        len: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        if self.granularity == 0 {
            self.init()?;
        }
        let len = self.round(len)?;
        let driver = self.driver.clone();
        self.space.claim_apart(driver.as_ref(), len, calls)
    }

    /// [`crate::upstream::Upstream::release`]: a segment apart in any order, one of the range
    /// from its top.
    pub(super) fn release_segment(
        &mut self,
        seg: Segment,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let driver = self.driver.clone();
        match self.space.is_apart(&seg) {
            true => self.space.release_apart(driver.as_ref(), &seg, calls),
            false => self.space.unmap(driver.as_ref(), &seg, calls),
        }
    }
}

impl AddressSpace {
    /// Reserves `len` bytes (a multiple of the granularity) anywhere, handed out at once and
    /// vacant.
    pub(super) fn claim_apart(
        &mut self,
        driver: &dyn Driver,
        len: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let base = driver.reserve(len, 0)?;
        calls.record(CallKind::Reserve);
        self.apart.insert(base, len);
        self.add_vacant(base, base + len as u64);
        Ok(Segment {
            ptr: base,
            len,
            handle: 0,
        })
    }

    /// Whether `seg` is a segment apart.
    pub(super) fn is_apart(&self, seg: &Segment) -> bool {
        self.apart.get(&seg.ptr) == Some(&seg.len)
    }

    /// Unmaps a segment apart's pages and releases its reservation. A refusal leaves it in
    /// place, with the pages unmapped so far vacant, to retry later.
    pub(super) fn release_apart(
        &mut self,
        driver: &dyn Driver,
        seg: &Segment,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        if !self.is_apart(seg) {
            return Err(DriverError::new(
                CallKind::Unmap,
                ErrorCode::InvalidValue,
                format!(
                    "{} bytes at {:#x} are not a segment apart of the pool",
                    seg.len, seg.ptr
                ),
            ));
        }
        let end: DevicePtr = seg.ptr + seg.len as u64;
        self.unmap_pages(driver, seg.ptr, end, calls)?;
        driver.release_reservation(seg.ptr, seg.len)?;
        self.remove_vacant(seg.ptr, end);
        self.apart.remove(&seg.ptr);
        Ok(())
    }
}
