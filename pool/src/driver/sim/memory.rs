//! The simulated device's memory model: what is allocated, reserved and mapped, and what that
//! leaves free. Pure bookkeeping over address ranges; where the addresses come from is
//! `backing.rs`.

use super::ledger::Ledger;
use super::space::Range;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
pub(super) struct Alloc {
    pub bytes: usize,
    /// What the card gave up for it: `bytes`, or whole pages ([`super::SimConfig::malloc_page`]).
    pub taken: usize,
    pub managed: bool,
    pub range: Range,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Reservation {
    pub bytes: usize,
    pub range: Range,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    bytes: usize,
    handle: u64,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Memory {
    pub device_used: usize,
    /// The most `device_used` has been.
    pub device_peak: usize,
    /// The least capacity in which a device allocation that failed would have succeeded.
    pub failed_below: Option<usize>,
    pub managed_used: usize,
    /// Bytes of address space live reservations cover.
    pub reserved: usize,
    /// Mappings of each live handle (more than one after `alias`), and whether it was
    /// released: its memory goes when both its mappings are gone and it was released.
    handles: BTreeMap<u64, (u32, bool)>,
    allocs: BTreeMap<u64, Alloc>,
    reservations: BTreeMap<u64, Reservation>,
    mappings: BTreeMap<u64, Mapping>,
    next_handle: u64,
}

impl Memory {
    pub fn ledger(&self) -> Ledger {
        Ledger {
            device_bytes: self.device_used,
            managed_bytes: self.managed_used,
            allocations: self.allocs.values().filter(|a| !a.managed).count(),
            managed_allocations: self.allocs.values().filter(|a| a.managed).count(),
            reservations: self.reservations.len(),
            mappings: self.mappings.len(),
        }
    }

    /// Whether `[ptr, ptr+len)` lies inside one live allocation or a run of adjacent mappings.
    pub fn contains(&self, ptr: u64, len: usize) -> bool {
        let Some(end) = ptr.checked_add(len.max(1) as u64) else {
            return false;
        };
        if let Some((&base, a)) = self.allocs.range(..=ptr).next_back() {
            if end <= base + a.bytes as u64 {
                return true;
            }
        }
        let Some((&base, m)) = self.mappings.range(..=ptr).next_back() else {
            return false;
        };
        let mut reach = base + m.bytes as u64;
        if ptr >= reach {
            return false;
        }
        while reach < end {
            match self.mappings.get(&reach) {
                Some(m) => reach += m.bytes as u64,
                None => return false,
            }
        }
        true
    }

    /// Notes a device allocation refused that needed a capacity of `needed`.
    pub fn failed(&mut self, needed: usize) {
        self.failed_below = Some(self.failed_below.map_or(needed, |f| f.min(needed)));
    }

    pub fn add_alloc(&mut self, a: Alloc) {
        if a.managed {
            self.managed_used += a.taken;
        } else {
            self.device_used += a.taken;
            self.device_peak = self.device_peak.max(self.device_used);
        }
        self.allocs.insert(a.range.base, a);
    }

    /// Removes a live allocation of the given kind.
    pub fn remove_alloc(&mut self, ptr: u64, managed: bool) -> Result<Alloc, String> {
        match self.allocs.get(&ptr).copied() {
            Some(a) if a.managed == managed => {
                self.allocs.remove(&ptr);
                if managed {
                    self.managed_used -= a.taken;
                } else {
                    self.device_used -= a.taken;
                }
                Ok(a)
            }
            Some(_) if managed => Err(format!("{ptr:#x} is a device allocation freed as managed")),
            Some(_) => Err(format!(
                "{ptr:#x} is a managed allocation freed as device memory"
            )),
            None => Err(format!("{ptr:#x} is not a live allocation")),
        }
    }

    /// Checks that `bytes` more of address space fit under `cap`.
    pub fn check_reserve(&self, bytes: usize, cap: Option<usize>) -> Result<(), String> {
        match cap {
            Some(cap) if self.reserved.saturating_add(bytes) > cap => Err(format!(
                "no address space left for {bytes} bytes: {} of {cap} bytes already reserved",
                self.reserved
            )),
            _ => Ok(()),
        }
    }

    pub fn add_reservation(&mut self, r: Reservation) {
        self.reserved += r.bytes;
        self.reservations.insert(r.range.base, r);
    }

    /// Removes a reservation that has nothing mapped in it.
    pub fn remove_reservation(&mut self, base: u64, bytes: usize) -> Result<Reservation, String> {
        let Some(r) = self.reservations.get(&base).copied() else {
            return Err(format!("{base:#x} is not a reservation"));
        };
        if r.bytes != bytes {
            return Err(format!(
                "reservation at {base:#x} is {} bytes, not {bytes}",
                r.bytes
            ));
        }
        if self
            .mappings
            .range(base..base + bytes as u64)
            .next()
            .is_some()
        {
            return Err(format!("reservation at {base:#x} still has mappings"));
        }
        self.reservations.remove(&base);
        self.reserved -= r.bytes;
        Ok(r)
    }

    /// Checks that `[at, at+bytes)` is an aligned range of one reservation over nothing mapped.
    pub fn check_map(&self, at: u64, bytes: usize, gran: usize) -> Result<(), String> {
        let end = at.checked_add(bytes as u64);
        let inside = self
            .reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(&b, r)| {
                end.is_some_and(|e| e <= b + r.bytes as u64) && (at - b) % gran as u64 == 0
            });
        if !inside {
            return Err(format!(
                "{bytes} bytes at {at:#x}: not an aligned range of one reservation"
            ));
        }
        let overlaps = end.is_none_or(|e| {
            self.mappings
                .range(..e)
                .next_back()
                .is_some_and(|(&b, m)| b + m.bytes as u64 > at)
        });
        if overlaps {
            return Err(format!("{bytes} bytes at {at:#x}: overlaps a mapping"));
        }
        Ok(())
    }

    pub fn add_mapping(&mut self, at: u64, bytes: usize) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.device_used += bytes;
        self.device_peak = self.device_peak.max(self.device_used);
        self.mappings.insert(at, Mapping { bytes, handle });
        self.handles.insert(handle, (1, false));
        handle
    }

    fn mapping(&self, at: u64, bytes: usize, handle: Option<u64>) -> Result<u64, String> {
        match self.mappings.get(&at) {
            Some(m) if m.bytes == bytes && handle.is_none_or(|h| h == m.handle) => Ok(m.handle),
            _ => Err(match handle {
                Some(h) => format!("no mapping of {bytes} bytes with handle {h} at {at:#x}"),
                None => format!("no mapping of {bytes} bytes at {at:#x}"),
            }),
        }
    }

    /// Drops one mapping of `handle`; its memory goes once no mapping is left and it was
    /// released.
    fn unref(&mut self, at: u64, bytes: usize, handle: u64, release: bool) {
        self.mappings.remove(&at);
        let left = self.handles.get_mut(&handle).map(|(n, released)| {
            *n -= 1;
            *released |= release;
            (*n, *released)
        });
        if let Some((0, true)) = left {
            self.handles.remove(&handle);
            self.device_used -= bytes;
        }
    }

    /// Removes the mapping of `bytes` at `at` with `handle` and releases the handle.
    pub fn remove_mapping(&mut self, at: u64, bytes: usize, handle: u64) -> Result<(), String> {
        self.mapping(at, bytes, Some(handle))?;
        self.unref(at, bytes, handle, true);
        Ok(())
    }

    /// Maps the memory of the mapping of `bytes` at `from` with `handle` at `to` as well, which
    /// must be an aligned range of one reservation over nothing mapped.
    pub fn alias_mapping(
        &mut self,
        from: u64,
        to: u64,
        bytes: usize,
        handle: u64,
        gran: usize,
    ) -> Result<(), String> {
        self.mapping(from, bytes, Some(handle))?;
        self.check_map(to, bytes, gran)?;
        self.mappings.insert(to, Mapping { bytes, handle });
        if let Some((n, _)) = self.handles.get_mut(&handle) {
            *n += 1;
        }
        Ok(())
    }

    /// Removes the mapping of `bytes` at `at`, whose memory must be mapped elsewhere too.
    pub fn unalias(&mut self, at: u64, bytes: usize) -> Result<(), String> {
        let handle = self.mapping(at, bytes, None)?;
        if self.handles.get(&handle).is_none_or(|&(n, _)| n < 2) {
            return Err(format!(
                "the {bytes} bytes at {at:#x} are the only mapping of their memory"
            ));
        }
        self.unref(at, bytes, handle, false);
        Ok(())
    }

    /// Everything still held, for the device's drop.
    pub fn drain(&mut self) -> Vec<Range> {
        self.mappings.clear();
        self.handles.clear();
        let mut out: Vec<Range> = std::mem::take(&mut self.allocs)
            .into_values()
            .map(|a| a.range)
            .collect();
        out.extend(
            std::mem::take(&mut self.reservations)
                .into_values()
                .map(|r| r.range),
        );
        out
    }
}
