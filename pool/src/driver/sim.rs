//! A simulated device on host memory.
//!
//! Addresses the sim hands out are real host addresses (see `host.rs`), so CPU code can read
//! and write pool memory. The sim keeps a *ledger*: a count of every call by kind, an optional
//! log of each call, and every live allocation, reservation and mapping, so tests can assert
//! call counts and that nothing leaked. Faults can be injected into any kind of call.

use super::host;
use super::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, MemInfo, PhysHandle};
use crate::sync::SyncEpoch;
use parking_lot::Mutex;
use std::collections::BTreeMap;

const GIB: f64 = (1u64 << 30) as f64;

/// How the simulated card looks.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Device memory in bytes.
    pub capacity: usize,
    /// VMM granularity in bytes (a power of two, a multiple of 4096).
    pub granularity: usize,
    /// Whether VMM (reserve and map) is supported.
    pub vmm: bool,
    /// Whether managed memory is supported.
    pub managed: bool,
    /// Host memory available to managed allocations, in bytes.
    pub managed_capacity: usize,
    /// Device ordinal to report.
    pub ordinal: usize,
    /// Keep a log entry for every call (counts are always kept).
    pub record_calls: bool,
    /// Back addresses with host memory. Off: addresses are unique but fake (nothing can read
    /// or write them), for dry runs of cards far larger than this machine.
    pub backed: bool,
}

impl SimConfig {
    /// A card of `gib` GiB with VMM and managed memory, 2 MiB granularity.
    pub fn gib(gib: f64) -> Self {
        let capacity = if gib.is_finite() && gib > 0.0 {
            (gib * GIB) as usize
        } else {
            0
        };
        Self {
            capacity,
            granularity: 2 << 20,
            vmm: true,
            managed: true,
            managed_capacity: 256 << 30,
            ordinal: 0,
            record_calls: true,
            backed: true,
        }
    }

    /// Sets whether addresses are backed by host memory.
    pub fn backed(mut self, on: bool) -> Self {
        self.backed = on;
        self
    }

    /// Sets VMM support.
    pub fn vmm(mut self, on: bool) -> Self {
        self.vmm = on;
        self
    }

    /// Sets managed-memory support.
    pub fn managed(mut self, on: bool) -> Self {
        self.managed = on;
        self
    }

    /// Sets the VMM granularity.
    pub fn granularity(mut self, bytes: usize) -> Self {
        self.granularity = bytes;
        self
    }

    /// Sets whether every call is logged.
    pub fn record_calls(mut self, on: bool) -> Self {
        self.record_calls = on;
        self
    }
}

/// One logged driver call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Which primitive.
    pub kind: CallKind,
    /// The size argument, where the call has one.
    pub bytes: usize,
    /// Whether it succeeded.
    pub ok: bool,
}

/// What is alive on the device right now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Device bytes in use (mallocs plus mapped physical memory).
    pub device_bytes: usize,
    /// Managed bytes in use.
    pub managed_bytes: usize,
    /// Live `malloc` allocations.
    pub allocations: usize,
    /// Live managed allocations.
    pub managed_allocations: usize,
    /// Live address reservations.
    pub reservations: usize,
    /// Live physical mappings.
    pub mappings: usize,
}

impl Ledger {
    /// Whether nothing at all is held on the device.
    pub fn is_empty(&self) -> bool {
        *self == Ledger::default()
    }
}

#[derive(Clone, Copy, Debug)]
struct Alloc {
    bytes: usize,
    host_len: usize,
    managed: bool,
}

#[derive(Clone, Copy, Debug)]
struct Reservation {
    bytes: usize,
    host_base: u64,
    host_len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    bytes: usize,
    handle: u64,
}

#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: CallKind,
    /// Fails the call whose running count of this kind equals `at` (or is beyond it, if `sticky`).
    at: u64,
    sticky: bool,
    code: ErrorCode,
}

#[derive(Default)]
struct State {
    /// Next fake address when the device is not backed.
    next_fake: u64,
    device_used: usize,
    managed_used: usize,
    allocs: BTreeMap<u64, Alloc>,
    reservations: BTreeMap<u64, Reservation>,
    mappings: BTreeMap<u64, Mapping>,
    next_handle: u64,
    counts: [u64; CallKind::ALL.len()],
    log: Vec<CallRecord>,
    faults: Vec<Fault>,
}

fn idx(kind: CallKind) -> usize {
    kind as usize
}

/// A simulated CUDA device. See the module docs.
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    epoch: SyncEpoch,
    state: Mutex<State>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("device_used", &self.device_used)
            .field("allocs", &self.allocs.len())
            .field("mappings", &self.mappings.len())
            .finish()
    }
}

impl SimDevice {
    /// A simulated device as configured.
    pub fn new(config: SimConfig) -> Self {
        Self {
            config,
            epoch: SyncEpoch::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// The configuration this device was built with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Makes the `n`-th call of `kind` from now fail with `code` (n = 1: the next one).
    pub fn fail_nth(&self, kind: CallKind, n: u64, code: ErrorCode) {
        let mut s = self.state.lock();
        let at = s.counts[idx(kind)] + n.max(1);
        s.faults.push(Fault {
            kind,
            at,
            sticky: false,
            code,
        });
    }

    /// Makes every call of `kind` from the `n`-th on fail with `code`, until [`Self::clear_faults`].
    pub fn fail_from(&self, kind: CallKind, n: u64, code: ErrorCode) {
        let mut s = self.state.lock();
        let at = s.counts[idx(kind)] + n.max(1);
        s.faults.push(Fault {
            kind,
            at,
            sticky: true,
            code,
        });
    }

    /// Removes every armed fault.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// How many calls of `kind` were made.
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.state.lock().counts[idx(kind)]
    }

    /// The log of every call so far (empty if `record_calls` is off).
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.state.lock().log.clone()
    }

    /// What is alive on the device.
    pub fn ledger(&self) -> Ledger {
        let s = self.state.lock();
        Ledger {
            device_bytes: s.device_used,
            managed_bytes: s.managed_used,
            allocations: s.allocs.values().filter(|a| !a.managed).count(),
            managed_allocations: s.allocs.values().filter(|a| a.managed).count(),
            reservations: s.reservations.len(),
            mappings: s.mappings.len(),
        }
    }

    /// Whether `[ptr, ptr+len)` lies inside memory the device handed out and still holds:
    /// one live allocation, or a run of adjacent live mappings.
    pub fn contains(&self, ptr: DevicePtr, len: usize) -> bool {
        let s = self.state.lock();
        Self::contains_locked(&s, ptr, len)
    }

    fn contains_locked(s: &State, ptr: DevicePtr, len: usize) -> bool {
        let Some(end) = ptr.checked_add(len.max(1) as u64) else {
            return false;
        };
        if let Some((&base, a)) = s.allocs.range(..=ptr).next_back() {
            if end <= base + a.bytes as u64 {
                return true;
            }
        }
        // Walk adjacent mappings from the one holding `ptr`.
        let mut cursor = ptr;
        let Some((&base, m)) = s.mappings.range(..=cursor).next_back() else {
            return false;
        };
        let mut reach = base + m.bytes as u64;
        if cursor >= reach {
            return false;
        }
        while reach < end {
            cursor = reach;
            match s.mappings.get(&cursor) {
                Some(m) => reach = cursor + m.bytes as u64,
                None => return false,
            }
        }
        true
    }

    /// Copies `data` to device memory at `ptr`, after checking the range is live.
    pub fn write(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), DriverError> {
        self.check_range(ptr, data.len())?;
        // SAFETY: the range lies inside live, readable and writable host memory of ours.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
        Ok(())
    }

    /// Copies `len` bytes of device memory at `ptr`, after checking the range is live.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, DriverError> {
        self.check_range(ptr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, out.as_mut_ptr(), len) };
        Ok(out)
    }

    fn check_range(&self, ptr: DevicePtr, len: usize) -> Result<(), DriverError> {
        if !self.config.backed {
            return Err(DriverError::new(
                CallKind::MemInfo,
                ErrorCode::NotSupported,
                "this simulated device is not backed by host memory (a dry-run device): nothing can be read or written",
            ));
        }
        if self.contains(ptr, len) {
            Ok(())
        } else {
            Err(DriverError::new(
                CallKind::MemInfo,
                ErrorCode::InvalidValue,
                format!("{len} bytes at {ptr:#x} are not inside live device memory"),
            ))
        }
    }

    /// Counts a call, applies armed faults, and logs it.
    fn enter(&self, s: &mut State, kind: CallKind, bytes: usize) -> Result<(), DriverError> {
        s.counts[idx(kind)] += 1;
        let n = s.counts[idx(kind)];
        let hit = s
            .faults
            .iter()
            .position(|f| f.kind == kind && (f.at == n || (f.sticky && n >= f.at)));
        let result = match hit {
            Some(i) => {
                let f = s.faults[i];
                if !f.sticky {
                    s.faults.remove(i);
                }
                Err(DriverError::new(
                    kind,
                    f.code,
                    format!("fault injected on call #{n} of this kind"),
                ))
            }
            None => Ok(()),
        };
        if self.config.record_calls {
            s.log.push(CallRecord {
                kind,
                bytes,
                ok: result.is_ok(),
            });
        }
        result
    }

    /// Marks the last logged call as failed (a check after `enter` rejected it).
    fn fail(&self, s: &mut State, err: DriverError) -> DriverError {
        if self.config.record_calls {
            if let Some(last) = s.log.last_mut() {
                last.ok = false;
            }
        }
        err
    }

    fn oom(&self, kind: CallKind, bytes: usize, free: usize) -> DriverError {
        DriverError::new(
            kind,
            ErrorCode::OutOfMemory,
            format!(
                "asked for {bytes} bytes, {free} of {} free",
                self.config.capacity
            ),
        )
    }

    fn host_alloc(
        &self,
        s: &mut State,
        kind: CallKind,
        bytes: usize,
        managed: bool,
    ) -> Result<DevicePtr, DriverError> {
        let host_len = host::round_to_page(bytes)
            .ok_or_else(|| self.fail_invalid(kind, format!("size {bytes} overflows")))?;
        let ptr = if self.config.backed {
            let p = host::alloc(host_len).ok_or_else(|| {
                DriverError::new(
                    kind,
                    ErrorCode::OutOfMemory,
                    format!("host could not back {bytes} bytes"),
                )
            })?;
            p as u64
        } else {
            Self::fake(s, host_len, host::PAGE)
        };
        s.allocs.insert(
            ptr,
            Alloc {
                bytes,
                host_len,
                managed,
            },
        );
        Ok(ptr)
    }

    /// A fresh fake address range of `len` bytes aligned to `align`.
    fn fake(s: &mut State, len: usize, align: usize) -> u64 {
        if s.next_fake == 0 {
            s.next_fake = 1 << 44;
        }
        let at = s.next_fake.next_multiple_of(align as u64);
        s.next_fake = at + len as u64 + host::PAGE as u64;
        at
    }

    fn fail_invalid(&self, kind: CallKind, detail: String) -> DriverError {
        DriverError::new(kind, ErrorCode::InvalidValue, detail)
    }

    fn free_alloc(&self, kind: CallKind, ptr: DevicePtr, managed: bool) -> Result<(), DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, kind, 0)?;
        match s.allocs.get(&ptr).copied() {
            Some(a) if a.managed == managed => {
                s.allocs.remove(&ptr);
                if managed {
                    s.managed_used -= a.bytes;
                } else {
                    s.device_used -= a.bytes;
                }
                if self.config.backed {
                    // SAFETY: `ptr`/`host_len` is exactly a live range we mapped; the caller gave it up.
                    unsafe { host::release(ptr as *mut u8, a.host_len) };
                }
                Ok(())
            }
            Some(_) => {
                let what = if managed {
                    "a device allocation freed as managed"
                } else {
                    "a managed allocation freed as device memory"
                };
                Err(self.fail(
                    &mut s,
                    self.fail_invalid(kind, format!("{ptr:#x} is {what}")),
                ))
            }
            None => Err(self.fail(
                &mut s,
                self.fail_invalid(kind, format!("{ptr:#x} is not a live allocation")),
            )),
        }
    }

    /// cuMemAlloc or cuMemAllocManaged: device memory counts against the capacity, managed
    /// memory against the host's.
    fn allocate(&self, bytes: usize, managed: bool) -> Result<DevicePtr, DriverError> {
        let kind = if managed {
            CallKind::MallocManaged
        } else {
            CallKind::Malloc
        };
        let mut s = self.state.lock();
        self.enter(&mut s, kind, bytes)?;
        if managed && !self.config.managed {
            let e = DriverError::new(
                kind,
                ErrorCode::NotSupported,
                "this simulated device has no managed memory",
            );
            return Err(self.fail(&mut s, e));
        }
        if let Err(e) = self.check_size(kind, bytes) {
            return Err(self.fail(&mut s, e));
        }
        let (capacity, used) = if managed {
            (self.config.managed_capacity, s.managed_used)
        } else {
            (self.config.capacity, s.device_used)
        };
        let free = capacity.saturating_sub(used);
        if bytes > free {
            let e = if managed {
                DriverError::new(
                    kind,
                    ErrorCode::OutOfMemory,
                    format!("asked for {bytes} managed bytes, {free} left"),
                )
            } else {
                self.oom(kind, bytes, free)
            };
            return Err(self.fail(&mut s, e));
        }
        match self.host_alloc(&mut s, kind, bytes, managed) {
            Ok(p) => {
                if managed {
                    s.managed_used += bytes;
                } else {
                    s.device_used += bytes;
                }
                Ok(p)
            }
            Err(e) => Err(self.fail(&mut s, e)),
        }
    }

    fn check_size(&self, kind: CallKind, bytes: usize) -> Result<(), DriverError> {
        if bytes == 0 {
            Err(self.fail_invalid(kind, "size 0".into()))
        } else {
            Ok(())
        }
    }
}

impl Driver for SimDevice {
    fn ordinal(&self) -> usize {
        self.config.ordinal
    }

    fn name(&self) -> String {
        format!(
            "simulated {:.1} GiB card",
            self.config.capacity as f64 / GIB
        )
    }

    fn epoch(&self) -> &SyncEpoch {
        &self.epoch
    }

    fn host_accessible(&self) -> bool {
        self.config.backed
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::MemInfo, 0)?;
        Ok(MemInfo {
            free: self.config.capacity.saturating_sub(s.device_used),
            total: self.config.capacity,
        })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.allocate(bytes, false)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.free_alloc(CallKind::Free, ptr, false)
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.allocate(bytes, true)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.free_alloc(CallKind::FreeManaged, ptr, true)
    }

    fn vmm_supported(&self) -> bool {
        self.config.vmm
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::Granularity, 0)?;
        if !self.config.vmm {
            let e = DriverError::new(
                CallKind::Granularity,
                ErrorCode::NotSupported,
                "VMM is off on this simulated device",
            );
            return Err(self.fail(&mut s, e));
        }
        Ok(self.config.granularity)
    }

    fn reserve(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::Reserve, bytes)?;
        let gran = self.config.granularity;
        if !self.config.vmm {
            let e = DriverError::new(
                CallKind::Reserve,
                ErrorCode::NotSupported,
                "VMM is off on this simulated device",
            );
            return Err(self.fail(&mut s, e));
        }
        if bytes == 0 || bytes % gran != 0 {
            let e = self.fail_invalid(
                CallKind::Reserve,
                format!("{bytes} bytes is not a positive multiple of the granularity {gran}"),
            );
            return Err(self.fail(&mut s, e));
        }
        // Over-reserve by one granule so the base can be aligned to the granularity.
        let Some(host_len) = bytes.checked_add(gran) else {
            let e = self.fail_invalid(CallKind::Reserve, format!("{bytes} bytes overflows"));
            return Err(self.fail(&mut s, e));
        };
        if !self.config.backed {
            let base = Self::fake(&mut s, bytes, gran);
            s.reservations.insert(
                base,
                Reservation {
                    bytes,
                    host_base: base,
                    host_len,
                },
            );
            return Ok(base);
        }
        let Some(p) = host::reserve(host_len) else {
            let e = DriverError::new(
                CallKind::Reserve,
                ErrorCode::OutOfMemory,
                format!("no host address space for {bytes} bytes"),
            );
            return Err(self.fail(&mut s, e));
        };
        let host_base = p as u64;
        let base = host_base.next_multiple_of(gran as u64);
        s.reservations.insert(
            base,
            Reservation {
                bytes,
                host_base,
                host_len,
            },
        );
        Ok(base)
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::ReleaseReservation, bytes)?;
        let Some(r) = s.reservations.get(&base).copied() else {
            let e = self.fail_invalid(
                CallKind::ReleaseReservation,
                format!("{base:#x} is not a reservation"),
            );
            return Err(self.fail(&mut s, e));
        };
        if r.bytes != bytes {
            let e = self.fail_invalid(
                CallKind::ReleaseReservation,
                format!("reservation at {base:#x} is {} bytes, not {bytes}", r.bytes),
            );
            return Err(self.fail(&mut s, e));
        }
        if s.mappings.range(base..base + bytes as u64).next().is_some() {
            let e = self.fail_invalid(
                CallKind::ReleaseReservation,
                format!("reservation at {base:#x} still has mappings"),
            );
            return Err(self.fail(&mut s, e));
        }
        s.reservations.remove(&base);
        if self.config.backed {
            // SAFETY: exactly the range `reserve` mapped; nothing is mapped inside it any more.
            unsafe { host::release(r.host_base as *mut u8, r.host_len) };
        }
        Ok(())
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        let mut s = self.state.lock();
        // cuMemCreate: the physical memory.
        self.enter(&mut s, CallKind::Create, bytes)?;
        let gran = self.config.granularity;
        if !self.config.vmm {
            let e = DriverError::new(
                CallKind::Create,
                ErrorCode::NotSupported,
                "VMM is off on this simulated device",
            );
            return Err(self.fail(&mut s, e));
        }
        if bytes == 0 || bytes % gran != 0 {
            let e = self.fail_invalid(
                CallKind::Create,
                format!("{bytes} bytes is not a positive multiple of the granularity {gran}"),
            );
            return Err(self.fail(&mut s, e));
        }
        let free = self.config.capacity.saturating_sub(s.device_used);
        if bytes > free {
            return Err(self.fail(&mut s, self.oom(CallKind::Create, bytes, free)));
        }
        // cuMemMap: the range must sit inside one reservation, aligned, over nothing mapped.
        let handle = s.next_handle;
        if let Err(e) = self.enter(&mut s, CallKind::Map, bytes) {
            self.unwind(&mut s, CallKind::Release, bytes);
            return Err(e);
        }
        let end = at.checked_add(bytes as u64);
        let inside = s
            .reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(&b, r)| {
                end.is_some_and(|e| e <= b + r.bytes as u64) && (at - b) % gran as u64 == 0
            });
        let overlaps = end.is_none_or(|e| {
            s.mappings
                .range(..e)
                .next_back()
                .is_some_and(|(&b, m)| b + m.bytes as u64 > at)
        });
        if !inside || overlaps {
            let e = self.fail_invalid(
                CallKind::Map,
                format!(
                    "{bytes} bytes at {at:#x}: {}",
                    if inside {
                        "overlaps a mapping"
                    } else {
                        "not an aligned range of one reservation"
                    }
                ),
            );
            let e = self.fail(&mut s, e);
            self.unwind(&mut s, CallKind::Release, bytes);
            return Err(e);
        }
        // cuMemSetAccess: make it readable and writable.
        if let Err(e) = self.enter(&mut s, CallKind::SetAccess, bytes) {
            self.unwind(&mut s, CallKind::Unmap, bytes);
            self.unwind(&mut s, CallKind::Release, bytes);
            return Err(e);
        }
        // SAFETY: the range lies inside one of our reservations (checked above) and is aligned
        // to the granularity, itself a multiple of the page size.
        if self.config.backed && !unsafe { host::commit(at as *mut u8, bytes) } {
            let e = DriverError::new(
                CallKind::SetAccess,
                ErrorCode::OutOfMemory,
                "host refused to commit the range",
            );
            let e = self.fail(&mut s, e);
            self.unwind(&mut s, CallKind::Unmap, bytes);
            self.unwind(&mut s, CallKind::Release, bytes);
            return Err(e);
        }
        s.next_handle += 1;
        s.device_used += bytes;
        s.mappings.insert(at, Mapping { bytes, handle });
        Ok(PhysHandle(handle))
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::Unmap, bytes)?;
        match s.mappings.get(&at).copied() {
            Some(m) if m.bytes == bytes && m.handle == handle.0 => {}
            _ => {
                let e = self.fail_invalid(
                    CallKind::Unmap,
                    format!(
                        "no mapping of {bytes} bytes with handle {} at {at:#x}",
                        handle.0
                    ),
                );
                return Err(self.fail(&mut s, e));
            }
        }
        // cuMemRelease. A failure leaves the mapping in place, as the CUDA driver does by
        // mapping the handle again (see `Driver::unmap`).
        self.enter(&mut s, CallKind::Release, bytes)?;
        if self.config.backed {
            // SAFETY: exactly a live mapping of ours; the caller no longer uses it.
            unsafe { host::decommit(at as *mut u8, bytes) };
        }
        s.mappings.remove(&at);
        s.device_used -= bytes;
        Ok(())
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        if !self.config.backed {
            return Ok(());
        }
        let s = self.state.lock();
        if !Self::contains_locked(&s, ptr, bytes) {
            return Err(self.fail_invalid(
                CallKind::MemInfo,
                format!("poison of {bytes} bytes at {ptr:#x}: not live device memory"),
            ));
        }
        // SAFETY: the range lies inside live, writable host memory of ours (checked above); the
        // pool that calls this owns it and no user holds it any more.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xFF, bytes) };
        Ok(())
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        let mut s = self.state.lock();
        self.enter(&mut s, CallKind::Synchronize, 0)
    }
}

impl SimDevice {
    /// Counts an undo step inside `map`; the sim never fails those.
    fn unwind(&self, s: &mut State, kind: CallKind, bytes: usize) {
        s.counts[idx(kind)] += 1;
        if self.config.record_calls {
            s.log.push(CallRecord {
                kind,
                bytes,
                ok: true,
            });
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let s = self.state.get_mut();
        if !s.allocs.is_empty() || !s.mappings.is_empty() || !s.reservations.is_empty() {
            tracing::warn!(
                allocations = s.allocs.len(),
                mappings = s.mappings.len(),
                reservations = s.reservations.len(),
                "simulated device dropped with memory still held"
            );
        }
        if !self.config.backed {
            return;
        }
        for (&p, a) in &s.allocs {
            // SAFETY: a range we mapped; the device is going away, nobody may use it now.
            unsafe { host::release(p as *mut u8, a.host_len) };
        }
        for r in s.reservations.values() {
            // SAFETY: as above.
            unsafe { host::release(r.host_base as *mut u8, r.host_len) };
        }
    }
}
