//! Sleep and wake: the physical memory behind the pool's mappings goes back to the driver while
//! every address range stays reserved, so each block keeps its address; wake maps new physical
//! memory at the same addresses and copies back what sleep offloaded.
//!
//! A page is one physical allocation (one `cuMemCreate`), so a sleep is one unmap per page
//! and a wake one create-and-map, not one per block; vacant ranges stay vacant. Sleep does not synchronize: the
//! pool core does that once, before it calls in here (an offload copies only after the device
//! is idle). A failure stops where it happened and leaves every page either awake (mapped,
//! with its contents) or asleep (unmapped, with its host copy when offloaded): a later sleep or
//! wake goes on from there, and nothing is lost.
//!
//! Page-locking host memory is the slow part of an offload (about 1.6 GB/s measured on an H100
//! host, against some 20 GB/s for the copy itself), and a program that sleeps once sleeps
//! again (a training step between two generations): the buffers a wake has emptied are kept
//! for the next sleep, and given back by a purge of everything (a trim) or when the pool
//! closes.

use super::space::AddressSpace;
use crate::driver::DevicePtr;
use crate::driver::{CallKind, Driver, DriverError};
use crate::pool::Moved;
use crate::stats::DriverCalls;

impl AddressSpace {
    /// Bytes of the pool's pages that are asleep, or mapped but still waiting for their
    /// contents (a restore that failed).
    pub fn asleep(&self) -> usize {
        self.pages
            .iter()
            .filter(|(&at, p)| p.asleep || self.copy_of(at).is_some())
            .map(|(_, p)| p.len)
            .sum()
    }

    fn copy_of(&self, at: DevicePtr) -> Option<usize> {
        self.copies.iter().position(|(p, _)| *p == at)
    }

    /// Unmaps every awake page, copying it to page-locked host memory first if `offload`.
    pub fn sleep(
        &mut self,
        driver: &dyn Driver,
        offload: bool,
        calls: &mut DriverCalls,
    ) -> Result<Moved, DriverError> {
        let mut out = Moved::default();
        let all: Vec<_> = self.pages.iter().map(|(&at, &p)| (at, p)).collect();
        for (at, p) in all {
            if p.asleep {
                continue;
            }
            // Its memory goes back only once no old mapping of it is left (idle: the core
            // synchronized before the sleep).
            self.clear_stale_of(driver, p.handle, calls)?;
            // A copy still waiting from a failed restore holds the contents: keep it.
            let copy = if offload && self.copy_of(at).is_none() {
                let mut buf = match self.spares.iter().position(|b| b.len() == p.len) {
                    Some(i) => self.spares.swap_remove(i),
                    None => driver.host_buffer(p.len)?,
                };
                driver.copy_to_host(at, buf.bytes_mut())?;
                Some(buf)
            } else {
                None
            };
            driver.unmap(at, p.len, p.handle)?;
            calls.record(CallKind::Unmap);
            if let Some(pg) = self.pages.get_mut(&at) {
                pg.asleep = true;
            }
            out.bytes += p.len;
            if let Some(buf) = copy {
                out.copied += p.len;
                self.copies.push((at, buf));
            }
        }
        Ok(out)
    }

    /// Maps every asleep page again at its address and restores its host copy, if any.
    pub fn wake(
        &mut self,
        driver: &dyn Driver,
        calls: &mut DriverCalls,
    ) -> Result<Moved, DriverError> {
        let mut out = Moved::default();
        let all: Vec<_> = self.pages.iter().map(|(&at, &p)| (at, p)).collect();
        for (at, p) in all {
            let mut handle = p.handle;
            if p.asleep {
                handle = driver.map(at, p.len)?;
                calls.record(CallKind::Map);
            }
            // Also for an awake page: a restore that failed at an earlier wake is retried.
            if let Some(i) = self.copy_of(at) {
                let restored = driver.copy_from_host(at, self.copies[i].1.bytes());
                if let Err(e) = restored {
                    if p.asleep && driver.unmap(at, p.len, handle).is_ok() {
                        // As it was: asleep, with its copy.
                        calls.record(CallKind::Unmap);
                        return Err(e);
                    }
                    // Mapped, its copy kept for the next wake.
                    self.awake(at, handle);
                    return Err(e);
                }
                let (_, buf) = self.copies.swap_remove(i);
                self.spares.push(buf);
                out.copied += p.len;
            }
            if p.asleep {
                self.awake(at, handle);
                out.bytes += p.len;
            }
        }
        Ok(out)
    }

    fn awake(&mut self, at: DevicePtr, handle: crate::driver::PhysHandle) {
        if let Some(pg) = self.pages.get_mut(&at) {
            pg.handle = handle;
            pg.asleep = false;
        }
    }

    /// Gives back the host buffers kept for the next offload; returns their bytes.
    pub fn drop_spares(&mut self) -> usize {
        let bytes = self.spares.iter().map(|b| b.len()).sum();
        self.spares.clear();
        bytes
    }

    /// Drops what is left of an asleep page that the pool releases: its host copy.
    pub(super) fn forget_asleep(&mut self, at: DevicePtr) {
        self.copies.retain(|(p, _)| *p != at);
    }
}
