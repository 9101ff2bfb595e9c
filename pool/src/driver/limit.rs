//! A driver that behaves like a smaller card.
//!
//! Wraps another driver and refuses device memory beyond `limit` bytes, counting everything
//! allocated through it. This reproduces a 12 GiB card's OOM safely on an 80 GiB one, without
//! filling the real card. Managed memory is not counted (it lives on the host until touched),
//! and the managed-headroom check still asks the real card.
//!
//! Admission is one step: a request's bytes are counted under the lock that checks them, before
//! the wrapped driver is called, and given back if that call fails. Concurrent requests can
//! therefore never pass the check together and overshoot the limit.

use super::forward::Forward;
use super::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, MemInfo, PhysHandle};
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

    /// Counts `bytes` against the limit, or refuses them; check and count are one step.
    fn admit(&self, kind: CallKind, bytes: usize) -> Result<(), DriverError> {
        let mut s = self.state.lock();
        let free = self.limit.saturating_sub(s.used);
        if bytes > free {
            return Err(DriverError::new(
                kind,
                ErrorCode::OutOfMemory,
                format!(
                    "asked for {bytes} bytes, {free} of the {}-byte limit free",
                    self.limit
                ),
            ));
        }
        s.used += bytes;
        Ok(())
    }

    /// Gives back bytes admitted for a call that then failed, or that were freed.
    fn give_back(&self, bytes: usize) {
        let mut s = self.state.lock();
        s.used = s.used.saturating_sub(bytes);
    }
}

impl Forward for LimitedDriver {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn name(&self) -> String {
        format!(
            "{} limited to {:.1} GiB",
            self.inner.name(),
            self.limit as f64 / (1u64 << 30) as f64
        )
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

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        // What the card gives up: whole pages where the driver hands out pages, as a card of
        // the limit's size would.
        let taken = super::in_pages(bytes, self.inner.malloc_page());
        self.admit(CallKind::Malloc, taken)?;
        match self.inner.malloc(bytes) {
            Ok(p) => {
                self.state.lock().mallocs.insert(p, taken);
                Ok(p)
            }
            Err(e) => {
                self.give_back(taken);
                Err(e)
            }
        }
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        // Forget the address before the driver can hand it out again (to another thread), and
        // count the bytes free only once they are.
        let bytes = self.state.lock().mallocs.remove(&ptr);
        if let Err(e) = self.inner.free(ptr) {
            if let Some(b) = bytes {
                self.state.lock().mallocs.insert(ptr, b);
            }
            return Err(e);
        }
        if let Some(b) = bytes {
            self.give_back(b);
        }
        Ok(())
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.admit(CallKind::Create, bytes)?;
        self.inner
            .map(at, bytes)
            .inspect_err(|_| self.give_back(bytes))
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.inner.unmap(at, bytes, handle)?;
        self.give_back(bytes);
        Ok(())
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        // The same memory at a second address: nothing to count.
        self.inner.alias(from, to, bytes, handle)
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        // The memory stays behind its other mapping.
        self.inner.unalias(at, bytes)
    }
}
