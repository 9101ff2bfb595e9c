//! Putting physical memory behind the vacant ranges where a block lands: pages recycled from
//! free ranges first, new pages for the rest.
//!
//! PyTorch's traffic replaces large tensors by slightly larger ones (a KV cache concatenated
//! every chunk): the freed tensors leave holes just too small for their successors, and the
//! pages in those holes stay mapped where they are. Instead of creating memory for the new
//! block, the pool moves whole free pages from the holes to where the block lands
//! ([`crate::driver::Driver::remap`]): the memory the device holds follows what is live, not
//! the high-water mark of the address range. A page is moved only if it lies wholly inside a
//! free range the pool names (`donors`), so no byte under a live block is ever unmapped. A
//! kernel queued before a free may still use the freed block, so unless a synchronize covers
//! the donors' frees, a moved page stays mapped at its old address too until one does
//! (`stale.rs`): a move never waits for the device. Recycling needs pages that can be
//! unmapped one by one, so with
//! [`super::VmmConfig::recycle`] memory is created in pages of
//! [`super::VmmConfig::recycle_page`] bytes (a block's tail in a smaller one); without it a page
//! is what one growth maps, as ggml does. A page moves whole, to a vacant range it fits: each
//! position takes the largest donor that fits the rest of the range, so a large block is filled
//! with few moves and small pages are kept for small gaps.
//!
//! A failure stops where it happened: every page is either where it was or where it went (a
//! failed move leaves the page at its old place: the driver's promise), and the pages the call
//! created are unmapped again, so a failed allocation holds no more memory than before.
//! Pages created for a growth beyond the block (the amortised step) are best effort.

use super::space::{AddressSpace, Page};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError};
use crate::stats::DriverCalls;

/// The pages [`AddressSpace::back`] may move, as [`AddressSpace::donor_pages`] orders them,
/// and whether a synchronize covers their frees (then a moved page leaves nothing behind, and
/// one may go back to the device in exchange for a new page).
#[derive(Debug, Default)]
pub(super) struct Donors {
    pub pages: Vec<DevicePtr>,
    pub idle: bool,
}

/// What a call to [`AddressSpace::back`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Backed {
    /// Bytes of pages moved from the donors.
    pub moved: usize,
    /// Bytes of pages created.
    pub created: usize,
}

impl AddressSpace {
    /// The awake pages that lie wholly inside the free ranges `donors` (address, length): what
    /// may be moved, ordered by (page length, length of its range, address). A move takes the
    /// last that fits: among pages of one size, those of the largest free range first, so a
    /// hole is emptied whole and its address space merges as vacant (measured: on the PyTorch
    /// prefill traces, fewer synchronizes than taking small holes first).
    pub(super) fn donor_pages(&self, donors: &[(u64, usize)]) -> Vec<DevicePtr> {
        let mut out: Vec<(usize, usize, DevicePtr)> = Vec::new();
        for &(at, len) in donors {
            let end = at + len as u64;
            for (&p, pg) in self.pages.range(at..end) {
                if !pg.asleep && p + pg.len as u64 <= end {
                    out.push((pg.len, len, p));
                }
            }
        }
        out.sort_unstable();
        out.into_iter().map(|(_, _, p)| p).collect()
    }

    /// Puts memory behind every vacant byte of `[from, to)` (granule-aligned, inside
    /// segments): at each position the largest of `donors` (as [`AddressSpace::donor_pages`]
    /// orders them) that fits is moved there, else a new page of `page` bytes (0: one page per
    /// vacant run; less where the run ends). On error what was done stays done (see the module
    /// docs).
    pub(super) fn back(
        &mut self,
        driver: &dyn Driver,
        (from, to): (DevicePtr, DevicePtr),
        donors: &mut Donors,
        page: usize,
        calls: &mut DriverCalls,
    ) -> Result<Backed, DriverError> {
        // Old mappings of pages moved away must go before memory is mapped here (refused while
        // the device may still use them: the core synchronizes first).
        self.clear_stale(driver, from, to, calls)?;
        let mut out = Backed::default();
        let mut made: Vec<DevicePtr> = Vec::new();
        for (s, e) in self.vacant_in(from, to) {
            let step = if page == 0 { (e - s) as usize } else { page };
            let mut at = s;
            while at < e {
                let room = (e - at) as usize;
                if let Some(moved) = self.move_page(driver, donors, at, room, calls) {
                    out.moved += moved;
                    at += moved as u64;
                } else {
                    let len = step.min(room);
                    // Every donor left is longer than the room: one goes back to the device
                    // for the page created here, so backing never grows the memory held while
                    // free pages are left (only idle ones can go back at once).
                    if donors.idle {
                        self.trade_donor(driver, &mut donors.pages, calls);
                    }
                    match driver.map(at, len) {
                        Ok(handle) => {
                            calls.record(CallKind::Map);
                            self.place(at, len, handle);
                            made.push(at);
                            out.created += len;
                            at += len as u64;
                        }
                        Err(e) => {
                            self.unmake(driver, &made, calls);
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Unmaps the page at `at` and gives its memory back to the device; its range is vacant
    /// from then on. On error the page stays where it is.
    fn release_page(
        &mut self,
        driver: &dyn Driver,
        at: DevicePtr,
        calls: &mut DriverCalls,
    ) -> Result<usize, DriverError> {
        let Some(p) = self.pages.get(&at).copied() else {
            return Ok(0);
        };
        self.clear_stale_of(driver, p.handle, calls)?;
        driver.unmap(at, p.len, p.handle)?;
        calls.record(CallKind::Unmap);
        self.pages.remove(&at);
        self.held -= p.len;
        self.add_vacant(at, at + p.len as u64);
        Ok(p.len)
    }

    /// Gives back the pages a failed [`AddressSpace::back`] created, so a failed allocation
    /// holds no more memory than before. A page the driver refuses to unmap stays, backing free
    /// space (counted, and released with its segment).
    fn unmake(&mut self, driver: &dyn Driver, made: &[DevicePtr], calls: &mut DriverCalls) {
        for &at in made.iter().rev() {
            if let Err(e) = self.release_page(driver, at, calls) {
                tracing::error!(error = %e, "could not undo part of a failed vmm growth; the page stays, behind free space");
            }
        }
    }

    /// Moves the last of `donors` no longer than `room` bytes to `at`; its length, or `None` if
    /// none fits or the driver refused (then no other is tried: the pool creates memory
    /// instead). The page stays mapped at its old address too until the device is past it,
    /// unless the donors are idle already.
    fn move_page(
        &mut self,
        driver: &dyn Driver,
        donors: &mut Donors,
        at: DevicePtr,
        room: usize,
        calls: &mut DriverCalls,
    ) -> Option<usize> {
        // Donors are sorted by length first: the last one that fits is the largest.
        let pages = &mut donors.pages;
        let k = pages.partition_point(|p| self.pages.get(p).map_or(0, |pg| pg.len) <= room);
        if k == 0 {
            return None;
        }
        let src = pages[k - 1];
        let p = self.pages.get(&src).copied()?;
        if let Err(e) = driver.alias(src, at, p.len, p.handle) {
            tracing::debug!(error = %e, "could not map a free vmm page at a second address; creating memory instead");
            pages.clear();
            return None;
        }
        pages.remove(k - 1);
        calls.remaps += 1;
        self.pages.remove(&src);
        self.held -= p.len;
        self.add_vacant(src, src + p.len as u64);
        let dropped = donors.idle
            && match driver.unalias(src, p.len) {
                Ok(()) => {
                    calls.record(CallKind::Unmap);
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not unmap a moved vmm page at its old address; dropped later");
                    false
                }
            };
        if !dropped {
            self.add_stale(src, p.len, p.handle, driver.epoch().current());
        }
        self.place(at, p.len, p.handle);
        Some(p.len)
    }

    /// Releases every awake page wholly inside the ranges `unused` once they are merged where
    /// they touch (a page may straddle a free range and the block being backed); the bytes
    /// released. A page the driver refuses stays.
    pub(super) fn shed(
        &mut self,
        driver: &dyn Driver,
        unused: &[(u64, usize)],
        calls: &mut DriverCalls,
    ) -> usize {
        let mut spans: Vec<(u64, u64)> = unused.iter().map(|&(a, l)| (a, a + l as u64)).collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in spans {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let mut gone = 0;
        for (s, e) in merged {
            let inside: Vec<_> = self
                .pages
                .range(s..e)
                .filter(|(&p, pg)| !pg.asleep && p + pg.len as u64 <= e)
                .map(|(&p, _)| p)
                .collect();
            for at in inside {
                match self.release_page(driver, at, calls) {
                    Ok(n) => gone += n,
                    Err(e) => tracing::debug!(error = %e, "could not release a free vmm page"),
                }
            }
        }
        gone
    }

    /// Releases the shortest of `donors` (unmapped, its memory back to the device); nothing if
    /// none is left or the driver refuses (the page then stays where it is, still free).
    fn trade_donor(
        &mut self,
        driver: &dyn Driver,
        donors: &mut Vec<DevicePtr>,
        calls: &mut DriverCalls,
    ) {
        let Some(&src) = donors.first() else {
            return;
        };
        match self.release_page(driver, src, calls) {
            Ok(_) => {
                donors.remove(0);
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not release a free vmm page in exchange for a new one");
                donors.clear();
            }
        }
    }

    pub(super) fn place(&mut self, at: DevicePtr, len: usize, handle: crate::driver::PhysHandle) {
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
