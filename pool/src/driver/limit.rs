//! A driver that behaves like a smaller card.
//!
//! Wraps another driver and refuses device memory beyond `limit` bytes, counting everything
//! allocated through it. This reproduces a 12 GiB card's OOM safely on an 80 GiB one, without
//! filling the real card. Managed memory is not counted (it lives on the host until touched),
//! and the managed-headroom check still asks the real card.

use super::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, MemInfo, PhysHandle};
use crate::sync::SyncEpoch;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct LimitedDriver {
    inner: Arc<dyn Driver>,
    limit: usize,
    state: Mutex<LimitState>,
}

#[derive(Debug, Default)]
struct LimitState {
    used: usize,
    mallocs: HashMap<DevicePtr, usize>,
}

impl LimitedDriver {
    /// `inner`, limited to `limit` bytes of device memory.
    pub fn new(inner: Arc<dyn Driver>, limit: usize) -> Self {
        Self {
            inner,
            limit,
            state: Mutex::new(LimitState::default()),
        }
    }

    /// The wrapped driver.
    pub fn inner(&self) -> &Arc<dyn Driver> {
        &self.inner
    }

    /// Bytes allocated through this wrapper and still held.
    pub fn used(&self) -> usize {
        self.state.lock().used
    }

    fn admit(&self, kind: CallKind, bytes: usize) -> Result<(), DriverError> {
        let s = self.state.lock();
        let free = self.limit.saturating_sub(s.used);
        if bytes > free {
            Err(DriverError::new(
                kind,
                ErrorCode::OutOfMemory,
                format!(
                    "asked for {bytes} bytes, {free} of the {}-byte limit free",
                    self.limit
                ),
            ))
        } else {
            Ok(())
        }
    }
}

impl Driver for LimitedDriver {
    fn ordinal(&self) -> usize {
        self.inner.ordinal()
    }

    fn name(&self) -> String {
        format!(
            "{} limited to {:.1} GiB",
            self.inner.name(),
            self.limit as f64 / (1u64 << 30) as f64
        )
    }

    fn epoch(&self) -> &SyncEpoch {
        self.inner.epoch()
    }

    fn host_accessible(&self) -> bool {
        self.inner.host_accessible()
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        let real = self.inner.mem_info()?;
        let used = self.state.lock().used;
        let total = self.limit.min(real.total);
        Ok(MemInfo {
            free: total.saturating_sub(used).min(real.free),
            total,
        })
    }

    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.inner.managed_headroom()
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.admit(CallKind::Malloc, bytes)?;
        let p = self.inner.malloc(bytes)?;
        let mut s = self.state.lock();
        s.used += bytes;
        s.mallocs.insert(p, bytes);
        Ok(p)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner.free(ptr)?;
        let mut s = self.state.lock();
        if let Some(b) = s.mallocs.remove(&ptr) {
            s.used -= b;
        }
        Ok(())
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.inner.malloc_managed(bytes)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner.free_managed(ptr)
    }

    fn vmm_supported(&self) -> bool {
        self.inner.vmm_supported()
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        self.inner.granularity()
    }

    fn reserve(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.inner.reserve(bytes)
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner.release_reservation(base, bytes)
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.admit(CallKind::Create, bytes)?;
        let h = self.inner.map(at, bytes)?;
        self.state.lock().used += bytes;
        Ok(h)
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.inner.unmap(at, bytes, handle)?;
        let mut s = self.state.lock();
        s.used = s.used.saturating_sub(bytes);
        Ok(())
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner.poison(ptr, bytes)
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.inner.synchronize_device()
    }
}
