//! Sleep and wake: the physical memory behind the pool's mappings goes back to the driver while
//! every address range stays reserved, so each block keeps its address; wake maps new physical
//! memory at the same addresses and copies back what sleep offloaded.
//!
//! A mapping is one physical allocation (one `cuMemCreate`), so a sleep is one unmap per
//! mapping and a wake one create-and-map, not one per block. Sleep does not synchronize: the
//! pool core does that once, before it calls in here (an offload copies only after the device
//! is idle). A failure stops where it happened and leaves every mapping either awake (mapped,
//! with its contents) or asleep (unmapped, with its host copy when offloaded): a later sleep or
//! wake goes on from there, and nothing is lost.
//!
//! Page-locking host memory is the slow part of an offload (about 1.6 GB/s measured on an H100
//! host, against some 20 GB/s for the copy itself), and a program that sleeps once sleeps
//! again (a training step between two generations): the buffers a wake has emptied are kept
//! for the next sleep, and given back by a purge of everything (a trim) or when the pool
//! closes.

use super::space::{AddressSpace, Mapping};
use crate::driver::{CallKind, Driver, DriverError};
use crate::pool::Moved;
use crate::stats::DriverCalls;

impl AddressSpace {
    /// Bytes of the pool's mappings that are asleep, or mapped but still waiting for their
    /// contents (a restore that failed).
    pub fn asleep(&self) -> usize {
        self.maps
            .iter()
            .filter(|m| m.asleep || self.copy_of(m).is_some())
            .map(|m| m.len)
            .sum()
    }

    fn copy_of(&self, m: &Mapping) -> Option<usize> {
        self.copies.iter().position(|(p, _)| *p == m.ptr)
    }

    /// Unmaps every awake mapping, copying it to page-locked host memory first if `offload`.
    pub fn sleep(
        &mut self,
        driver: &dyn Driver,
        offload: bool,
        calls: &mut DriverCalls,
    ) -> Result<Moved, DriverError> {
        let mut out = Moved::default();
        for i in 0..self.maps.len() {
            let m = self.maps[i];
            if m.asleep {
                continue;
            }
            // A copy still waiting from a failed restore holds the contents: keep it.
            let copy = if offload && self.copy_of(&m).is_none() {
                let mut buf = match self.spares.iter().position(|b| b.len() == m.len) {
                    Some(i) => self.spares.swap_remove(i),
                    None => driver.host_buffer(m.len)?,
                };
                driver.copy_to_host(m.ptr, buf.bytes_mut())?;
                Some(buf)
            } else {
                None
            };
            driver.unmap(m.ptr, m.len, m.handle)?;
            calls.record(CallKind::Unmap);
            self.maps[i].asleep = true;
            out.bytes += m.len;
            if let Some(buf) = copy {
                out.copied += m.len;
                self.copies.push((m.ptr, buf));
            }
        }
        Ok(out)
    }

    /// Maps every asleep mapping again at its address and restores its host copy, if any.
    pub fn wake(
        &mut self,
        driver: &dyn Driver,
        calls: &mut DriverCalls,
    ) -> Result<Moved, DriverError> {
        let mut out = Moved::default();
        for i in 0..self.maps.len() {
            let m = self.maps[i];
            let mut handle = m.handle;
            if m.asleep {
                handle = driver.map(m.ptr, m.len)?;
                calls.record(CallKind::Map);
            }
            // Also for an awake mapping: a restore that failed at an earlier wake is retried.
            if let Some(at) = self.copy_of(&m) {
                let restored = driver.copy_from_host(m.ptr, self.copies[at].1.bytes());
                if let Err(e) = restored {
                    if m.asleep && driver.unmap(m.ptr, m.len, handle).is_ok() {
                        // As it was: asleep, with its copy.
                        calls.record(CallKind::Unmap);
                        return Err(e);
                    }
                    // Mapped, its copy kept for the next wake.
                    self.maps[i] = Mapping {
                        handle,
                        asleep: false,
                        ..m
                    };
                    return Err(e);
                }
                let (_, buf) = self.copies.swap_remove(at);
                self.spares.push(buf);
                out.copied += m.len;
            }
            if m.asleep {
                self.maps[i] = Mapping {
                    handle,
                    asleep: false,
                    ..m
                };
                out.bytes += m.len;
            }
        }
        Ok(out)
    }

    /// Gives back the host buffers kept for the next offload; returns their bytes.
    pub fn drop_spares(&mut self) -> usize {
        let bytes = self.spares.iter().map(|b| b.len()).sum();
        self.spares.clear();
        bytes
    }

    /// Drops what is left of an asleep mapping that the pool releases: its host copy.
    pub(super) fn forget_asleep(&mut self, m: &Mapping) {
        self.copies.retain(|(p, _)| *p != m.ptr);
    }
}
