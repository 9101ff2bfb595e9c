//! Fault injection as a driver adaptor: wraps any driver, the simulated device or CUDA, and
//! makes chosen calls fail.
//!
//! Faults are armed per [`CallKind`] and counted per kind from the moment they are armed
//! ([`FaultInjector::fail_nth`], [`FaultInjector::fail_from`]). A mapping is three steps
//! (cuMemCreate, cuMemMap, cuMemSetAccess): a fault on the first fails before the wrapped
//! driver is called; a fault on a later step maps, then unmaps again and fails, which is what a
//! real partial failure leaves behind. An unmap is two (cuMemUnmap, cuMemRelease): either fault
//! leaves the mapping in place, as [`Driver::unmap`] promises. A second mapping ([`Driver::alias`]) is
//! two (cuMemMap, cuMemSetAccess): a fault on the first fails before anything is mapped; on the
//! second the memory is mapped and unmapped again. Removing one ([`Driver::unalias`]) is one
//! (cuMemUnmap).

use super::forward::Forward;
use super::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, MemInfo, PhysHandle};
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: CallKind,
    /// Fails the call whose running count of this kind equals `at` (or any later one, if
    /// `sticky`).
    at: u64,
    sticky: bool,
    code: ErrorCode,
}

#[derive(Debug, Default)]
struct Armed {
    counts: [u64; CallKind::ALL.len()],
    faults: Vec<Fault>,
}

/// See the module docs.
#[derive(Debug)]
pub struct FaultInjector {
    inner: Arc<dyn Driver>,
    armed: Mutex<Armed>,
}

impl FaultInjector {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn Driver>) -> Self {
        Self {
            inner,
            armed: Mutex::new(Armed::default()),
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &Arc<dyn Driver> {
        &self.inner
    }

    /// Makes the `n`-th call of `kind` from now fail with `code` (n = 1: the next one).
    pub fn fail_nth(&self, kind: CallKind, n: u64, code: ErrorCode) {
        self.arm(kind, n, false, code);
    }

    /// Makes every call of `kind` from the `n`-th on fail with `code`, until
    /// [`Self::clear_faults`].
    pub fn fail_from(&self, kind: CallKind, n: u64, code: ErrorCode) {
        self.arm(kind, n, true, code);
    }

    fn arm(&self, kind: CallKind, n: u64, sticky: bool, code: ErrorCode) {
        let mut a = self.armed.lock();
        let at = a.counts[kind as usize] + n.max(1);
        a.faults.push(Fault {
            kind,
            at,
            sticky,
            code,
        });
    }

    /// Removes every armed fault.
    pub fn clear_faults(&self) {
        self.armed.lock().faults.clear();
    }

    /// How many calls of `kind` passed through (failed ones included).
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.armed.lock().counts[kind as usize]
    }

    /// Counts a call of `kind` and fails it if a fault is armed on it.
    fn step(&self, kind: CallKind) -> Result<(), DriverError> {
        let mut a = self.armed.lock();
        a.counts[kind as usize] += 1;
        let n = a.counts[kind as usize];
        let Some(i) = a
            .faults
            .iter()
            .position(|f| f.kind == kind && (f.at == n || (f.sticky && n >= f.at)))
        else {
            return Ok(());
        };
        let f = a.faults[i];
        if !f.sticky {
            a.faults.remove(i);
        }
        Err(DriverError::new(
            kind,
            f.code,
            format!("fault injected on call #{n} of this kind"),
        ))
    }
}

impl Forward for FaultInjector {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.step(CallKind::MemInfo)?;
        self.inner.mem_info()
    }

    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.step(CallKind::MemInfo)?;
        self.inner.managed_headroom()
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.step(CallKind::Malloc)?;
        self.inner.malloc(bytes)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.step(CallKind::Free)?;
        self.inner.free(ptr)
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.step(CallKind::MallocManaged)?;
        self.inner.malloc_managed(bytes)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.step(CallKind::FreeManaged)?;
        self.inner.free_managed(ptr)
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        self.step(CallKind::Granularity)?;
        self.inner.granularity()
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.step(CallKind::Reserve)?;
        self.inner.reserve(bytes, hint)
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.step(CallKind::ReleaseReservation)?;
        self.inner.release_reservation(base, bytes)
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.step(CallKind::Create)?;
        let handle = self.inner.map(at, bytes)?;
        for later in [CallKind::Map, CallKind::SetAccess] {
            if let Err(e) = self.step(later) {
                if let Err(undo) = self.inner.unmap(at, bytes, handle) {
                    tracing::error!(error = %undo, "undoing a mapping after an injected fault failed");
                }
                return Err(e);
            }
        }
        Ok(handle)
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.step(CallKind::Unmap)?;
        self.step(CallKind::Release)?;
        self.inner.unmap(at, bytes, handle)
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.step(CallKind::Map)?;
        if let Err(e) = self.step(CallKind::SetAccess) {
            // The real driver unmaps the new mapping again: nothing changed.
            self.inner.alias(from, to, bytes, handle)?;
            if let Err(undo) = self.inner.unalias(to, bytes) {
                tracing::error!(error = %undo, "undoing a second mapping after an injected fault failed");
            }
            return Err(e);
        }
        self.inner.alias(from, to, bytes, handle)
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.step(CallKind::Unmap)?;
        self.inner.unalias(at, bytes)
    }

    fn host_buffer(&self, bytes: usize) -> Result<super::HostBuffer, DriverError> {
        self.step(CallKind::HostAlloc)?;
        self.inner.host_buffer(bytes)
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.step(CallKind::Copy)?;
        self.inner.copy_to_host(src, dst)
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.step(CallKind::Copy)?;
        self.inner.copy_from_host(dst, src)
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.step(CallKind::Synchronize)?;
        self.inner.synchronize_device()
    }
}
