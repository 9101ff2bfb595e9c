//! Putting physical memory behind the vacant ranges where a block lands: pages recycled from
//! free ranges first, new pages for the rest.
//!
//! PyTorch's traffic replaces large tensors by slightly larger ones (a KV cache concatenated
//! every chunk): the freed tensors leave holes just too small for their successors, and the
//! pages in those holes stay mapped where they are. Instead of creating memory for the new
//! block, the pool moves whole free pages from the holes to where the block lands
//! ([`crate::driver::Driver::remap`]): the memory the device holds follows what is live, not
//! the high-water mark of the address range. A page is moved only if it lies wholly inside a
//! free range the pool names (`donors`), so no byte under a live block is ever unmapped, and the
//! pool core synchronizes before naming any (a kernel queued before a free may still read the
//! freed block). Recycling needs pages that can be unmapped one by one, so with
//! [`super::VmmConfig::recycle`] every page is one granule; without it a page is what one growth
//! maps, as ggml does.
//!
//! A failure stops where it happened: every page is either where it was or where it went (a
//! failed move leaves the page at its old place: the driver's promise), and the pages the call
//! created are unmapped again, so a failed allocation holds no more memory than before.
//! Pages created for a growth beyond the block (the amortised step) are best effort.

use super::space::{AddressSpace, Page};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError};
use crate::stats::DriverCalls;

/// What a call to [`AddressSpace::back`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Backed {
    /// Bytes of pages moved from the donors.
    pub moved: usize,
    /// Bytes of pages created.
    pub created: usize,
}

impl AddressSpace {
    /// The pages that lie wholly inside the free ranges `donors` (address, length), awake and of
    /// `page` bytes: what may be moved. The smallest ranges give first, so large holes keep
    /// their pages for the large requests that fit them.
    pub(super) fn donor_pages(&self, donors: &[(u64, usize)], page: usize) -> Vec<DevicePtr> {
        let mut spans = donors.to_vec();
        spans.sort_unstable_by_key(|&(at, len)| (len, at));
        let mut out = Vec::new();
        for (at, len) in spans {
            let end = at + len as u64;
            for (&p, pg) in self.pages.range(at..end) {
                if !pg.asleep && pg.len == page && p + pg.len as u64 <= end {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Puts memory behind every vacant byte of `[from, to)` (granule-aligned, inside
    /// segments): pages moved from `donors` first, then new pages of `page` bytes (0: one page
    /// per vacant run). On error what was done stays done (see the module docs).
    pub(super) fn back(
        &mut self,
        driver: &dyn Driver,
        (from, to): (DevicePtr, DevicePtr),
        donors: &mut Vec<DevicePtr>,
        page: usize,
        calls: &mut DriverCalls,
    ) -> Result<Backed, DriverError> {
        let mut out = Backed::default();
        let mut made: Vec<DevicePtr> = Vec::new();
        for (s, e) in self.vacant_in(from, to) {
            let step = if page == 0 { (e - s) as usize } else { page };
            let mut at = s;
            while at < e {
                let len = step.min((e - at) as usize);
                if self.move_page(driver, donors, at, len, calls) {
                    out.moved += len;
                } else {
                    match driver.map(at, len) {
                        Ok(handle) => {
                            calls.record(CallKind::Map);
                            self.place(at, len, handle);
                            made.push(at);
                            out.created += len;
                        }
                        Err(e) => {
                            self.unmake(driver, &made, calls);
                            return Err(e);
                        }
                    }
                }
                at += len as u64;
            }
        }
        Ok(out)
    }

    /// Gives back the pages a failed [`AddressSpace::back`] created, so a failed allocation
    /// holds no more memory than before. A page the driver refuses to unmap stays, backing free
    /// space (counted, and released with its segment).
    fn unmake(&mut self, driver: &dyn Driver, made: &[DevicePtr], calls: &mut DriverCalls) {
        for &at in made.iter().rev() {
            let Some(p) = self.pages.get(&at).copied() else {
                continue;
            };
            match driver.unmap(at, p.len, p.handle) {
                Ok(()) => {
                    calls.record(CallKind::Unmap);
                    self.pages.remove(&at);
                    self.held -= p.len;
                    self.add_vacant(at, at + p.len as u64);
                }
                Err(e) => {
                    tracing::error!(error = %e, bytes = p.len, "could not undo part of a failed vmm growth; the page stays, behind free space");
                }
            }
        }
    }

    /// Moves one of `donors` (a page of `len` bytes) to `at`; false if none is left or the
    /// driver refused (then no other is tried: the pool creates memory instead).
    fn move_page(
        &mut self,
        driver: &dyn Driver,
        donors: &mut Vec<DevicePtr>,
        at: DevicePtr,
        len: usize,
        calls: &mut DriverCalls,
    ) -> bool {
        let Some(&src) = donors.last() else {
            return false;
        };
        let Some(p) = self.pages.get(&src).copied().filter(|p| p.len == len) else {
            return false;
        };
        if let Err(e) = driver.remap(src, at, len, p.handle) {
            tracing::debug!(error = %e, "could not move a free vmm page; creating memory instead");
            donors.clear();
            return false;
        }
        donors.pop();
        calls.remaps += 1;
        self.pages.remove(&src);
        self.held -= len;
        self.add_vacant(src, src + len as u64);
        self.place(at, len, p.handle);
        true
    }

    fn place(&mut self, at: DevicePtr, len: usize, handle: crate::driver::PhysHandle) {
        self.held += len;
        self.pages.insert(
            at,
            Page {
                len,
                handle,
                asleep: false,
            },
        );
        self.remove_vacant(at, at + len as u64);
    }
}
