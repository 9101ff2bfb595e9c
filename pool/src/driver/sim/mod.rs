//! A simulated device on host memory.
//!
//! Three parts: the memory model (`memory.rs`: what is allocated, reserved and mapped), the
//! host backing (`backing.rs`: real host memory behind every address, or unique fake addresses
//! for dry runs of huge cards) and the ledger (`ledger.rs`: every call counted and optionally
//! logged, and what is alive). Addresses of a backed device are real host addresses, so CPU
//! code can read and write pool memory. Faults are injected by wrapping the device in
//! [`super::fault::FaultInjector`], as for any driver.

mod access;
mod backing;
mod config;
mod ledger;
mod memory;
mod moves;
mod snapshot;
mod space;

pub use config::{SimConfig, MAX_CAPACITY};
pub use ledger::CallRecord;
pub use snapshot::SimSnapshot;

use super::{
    CallKind, DevicePtr, DeviceShared, Driver, DriverError, ErrorCode, MemInfo, PhysHandle,
};
use crate::invalid::InvalidConfig;
use backing::Backing;
use ledger::Calls;
use memory::{Alloc, Memory, Reservation};
use parking_lot::Mutex;
use std::sync::atomic::AtomicUsize;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug)]
struct State {
    calls: Calls,
    memory: Memory,
    backing: Backing,
}

/// A simulated CUDA device. See the module docs.
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    /// Device memory, the configured capacity until [`SimDevice::set_capacity`].
    capacity: AtomicUsize,
    shared: DeviceShared,
    state: Mutex<State>,
}

impl SimDevice {
    /// A simulated device as configured; a field out of range is an error naming it.
    pub fn new(config: SimConfig) -> Result<Self, InvalidConfig> {
        config.validate()?;
        let backing = if config.backed {
            Backing::host()
        } else {
            Backing::fake()
        };
        Ok(Self {
            state: Mutex::new(State {
                calls: Calls::new(config.record_calls),
                memory: Memory::default(),
                backing,
            }),
            capacity: AtomicUsize::new(config.capacity),
            config,
            shared: DeviceShared::new(),
        })
    }

    /// The configuration this device was built with (its capacity as built: [`SimDevice::capacity`]
    /// is the one it has now).
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Counts a call and runs `body` on the state; a failure marks the logged call failed.
    fn call<T>(
        &self,
        kind: CallKind,
        bytes: usize,
        body: impl FnOnce(&mut State) -> Result<T, (ErrorCode, String)>,
    ) -> Result<T, DriverError> {
        let mut s = self.state.lock();
        s.calls.enter(kind, bytes);
        body(&mut s).map_err(|(code, detail)| {
            s.calls.failed();
            DriverError::new(kind, code, detail)
        })
    }

    fn vmm_check(&self, bytes: usize) -> Result<(), (ErrorCode, String)> {
        let gran = self.config.granularity;
        if !self.config.vmm {
            return Err((
                ErrorCode::NotSupported,
                "VMM is off on this simulated device".into(),
            ));
        }
        if bytes == 0 || bytes % gran != 0 {
            return Err((
                ErrorCode::InvalidValue,
                format!("{bytes} bytes is not a positive multiple of the granularity {gran}"),
            ));
        }
        Ok(())
    }

    /// cuMemAlloc or cuMemAllocManaged: device memory counts against the capacity, managed
    /// memory against the host's.
    fn allocate(&self, bytes: usize, managed: bool) -> Result<DevicePtr, DriverError> {
        let kind = if managed {
            CallKind::MallocManaged
        } else {
            CallKind::Malloc
        };
        self.call(kind, bytes, |s| {
            if managed && !self.config.managed {
                return Err((
                    ErrorCode::NotSupported,
                    "this simulated device has no managed memory".into(),
                ));
            }
            if bytes == 0 {
                return Err((ErrorCode::InvalidValue, "size 0".into()));
            }
            let (capacity, used) = if managed {
                (self.config.managed_capacity, s.memory.managed_used)
            } else {
                (self.capacity(), s.memory.device_used)
            };
            let free = capacity.saturating_sub(used);
            // What the card gives up: whole pages where the driver hands out pages.
            let taken = if managed {
                bytes
            } else {
                super::in_pages(bytes, self.config.malloc_page)
            };
            if taken > free {
                if !managed {
                    s.memory.failed(used.saturating_add(taken));
                }
                let what = if managed { "managed " } else { "" };
                let pages = if taken > bytes {
                    format!(" ({taken} in whole pages)")
                } else {
                    String::new()
                };
                return Err((
                    ErrorCode::OutOfMemory,
                    format!("asked for {bytes} {what}bytes{pages}, {free} of {capacity} free"),
                ));
            }
            let len = backing::round_to_page(bytes)
                .ok_or((ErrorCode::InvalidValue, format!("size {bytes} overflows")))?;
            let range = s.backing.alloc(len).ok_or_else(|| {
                (
                    ErrorCode::OutOfMemory,
                    format!("the host could not back {bytes} bytes"),
                )
            })?;
            s.memory.add_alloc(Alloc {
                bytes,
                taken,
                managed,
                range,
            });
            Ok(range.base)
        })
    }

    fn free_alloc(&self, kind: CallKind, ptr: DevicePtr, managed: bool) -> Result<(), DriverError> {
        self.call(kind, 0, |s| {
            let a = s
                .memory
                .remove_alloc(ptr, managed)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: exactly a live range of ours; the caller gave it up.
            unsafe { s.backing.release(a.range) };
            Ok(())
        })
    }
}

impl Driver for SimDevice {
    fn ordinal(&self) -> usize {
        self.config.ordinal
    }

    fn name(&self) -> String {
        format!("simulated {:.1} GiB card", self.capacity() as f64 / GIB)
    }

    fn shared(&self) -> &DeviceShared {
        &self.shared
    }

    fn host_accessible(&self) -> bool {
        self.config.backed
    }

    fn simulated(&self) -> bool {
        true
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.call(CallKind::MemInfo, 0, |s| {
            Ok(MemInfo {
                free: self.capacity().saturating_sub(s.memory.device_used),
                total: self.capacity(),
            })
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

    fn malloc_page(&self) -> usize {
        self.config.malloc_page
    }

    fn vmm_supported(&self) -> bool {
        self.config.vmm
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        self.call(CallKind::Granularity, 0, |_| {
            self.vmm_check(self.config.granularity)?;
            Ok(self.config.granularity)
        })
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.call(CallKind::Reserve, bytes, |s| {
            self.vmm_check(bytes)?;
            s.memory
                .check_reserve(bytes, self.config.address_space)
                .map_err(|e| (ErrorCode::OutOfMemory, e))?;
            let hint = if self.config.address_hints { hint } else { 0 };
            let range = s
                .backing
                .reserve(bytes, self.config.granularity, hint)
                .ok_or_else(|| {
                    (
                        ErrorCode::OutOfMemory,
                        format!("no address space left for {bytes} bytes"),
                    )
                })?;
            s.memory.add_reservation(Reservation { bytes, range });
            Ok(range.base)
        })
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.call(CallKind::ReleaseReservation, bytes, |s| {
            let r = s
                .memory
                .remove_reservation(base, bytes)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: exactly the range `reserve` took; nothing is mapped inside it any more.
            unsafe { s.backing.release(r.range) };
            Ok(())
        })
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        // cuMemCreate: the physical memory.
        self.call(CallKind::Create, bytes, |s| {
            self.vmm_check(bytes)?;
            let free = self.capacity().saturating_sub(s.memory.device_used);
            if bytes > free {
                s.memory.failed(s.memory.device_used.saturating_add(bytes));
                return Err((
                    ErrorCode::OutOfMemory,
                    format!(
                        "asked for {bytes} bytes, {free} of {} free",
                        self.capacity()
                    ),
                ));
            }
            Ok(())
        })?;
        // cuMemMap: inside one reservation, aligned, over nothing mapped. A failure releases
        // the physical memory again (counted as a cuMemRelease).
        let mapped = self.call(CallKind::Map, bytes, |s| {
            s.memory
                .check_map(at, bytes, self.config.granularity)
                .map_err(|e| (ErrorCode::InvalidValue, e))
        });
        if let Err(e) = mapped {
            self.state.lock().calls.enter(CallKind::Release, bytes);
            return Err(e);
        }
        // cuMemSetAccess: readable and writable.
        self.call(CallKind::SetAccess, bytes, |s| {
            // SAFETY: the range lies inside one of our reservations (checked above) and is
            // aligned to the granularity, itself a multiple of the page size.
            if !unsafe { s.backing.commit(at, bytes) } {
                s.calls.enter(CallKind::Unmap, bytes);
                s.calls.enter(CallKind::Release, bytes);
                return Err((
                    ErrorCode::OutOfMemory,
                    "the host refused to commit the range".into(),
                ));
            }
            Ok(PhysHandle(s.memory.add_mapping(at, bytes)))
        })
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.call(CallKind::Unmap, bytes, |s| {
            s.memory
                .remove_mapping(at, bytes, handle.0)
                .map_err(|e| (ErrorCode::InvalidValue, e))?;
            // SAFETY: exactly a live mapping of ours; the caller no longer uses it.
            unsafe { s.backing.decommit(at, bytes) };
            s.calls.enter(CallKind::Release, bytes);
            Ok(())
        })
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.alias_mapping(from, to, bytes, handle)
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.unalias_mapping(at, bytes)
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        if !self.config.backed {
            return Ok(());
        }
        let s = self.state.lock();
        if !s.memory.contains(ptr, bytes) {
            return Err(DriverError::new(
                CallKind::MemInfo,
                ErrorCode::InvalidValue,
                format!("poison of {bytes} bytes at {ptr:#x}: not live device memory"),
            ));
        }
        // SAFETY: the range lies inside live, writable host memory of ours (checked above); the
        // pool that calls this owns it and no user holds it any more. The lock keeps it live.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xFF, bytes) };
        Ok(())
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.copy_out(src, dst)
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.copy_in(dst, src)
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.call(CallKind::Synchronize, 0, |_| Ok(()))
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let s = self.state.get_mut();
        let held = s.memory.ledger();
        if !held.is_empty() {
            tracing::warn!(?held, "simulated device dropped with memory still held");
        }
        for r in s.memory.drain() {
            // SAFETY: a range of ours; the device is going away, nobody may use it now.
            unsafe { s.backing.release(r) };
        }
    }
}
