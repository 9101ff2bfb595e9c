//! A driver that measures the time spent in each of its calls.
//!
//! Wraps another driver and adds up, per primitive, how often it was called and the wall time
//! it took (failed calls included). A replay of a recorded allocation stream on a GPU through
//! it says where a pool's time goes (creating, moving and releasing memory, synchronizing)
//! without the kernels of the run that recorded it: `repro-prefill replay --device cuda`.

use super::{DevicePtr, DeviceShared, Driver, DriverError, HostBuffer, MemInfo, PhysHandle};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls and time of one primitive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CallTime {
    /// Times it was called.
    pub calls: u64,
    /// Wall time inside it, in nanoseconds.
    pub nanos: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct TimedDriver {
    inner: Arc<dyn Driver>,
    times: Mutex<BTreeMap<&'static str, CallTime>>,
}

impl TimedDriver {
    /// `inner`, timed.
    pub fn new(inner: Arc<dyn Driver>) -> Self {
        Self {
            inner,
            times: Mutex::new(BTreeMap::new()),
        }
    }

    /// Calls and time per primitive so far, by the primitive's name (`map`, `alias`, ...).
    pub fn times(&self) -> BTreeMap<&'static str, CallTime> {
        self.times.lock().clone()
    }

    /// Time inside every call so far.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.times.lock().values().map(|t| t.nanos).sum())
    }

    fn timed<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut t = self.times.lock();
        let e = t.entry(name).or_default();
        e.calls += 1;
        e.nanos = e.nanos.saturating_add(nanos);
        out
    }
}

impl Driver for TimedDriver {
    fn ordinal(&self) -> usize {
        self.inner.ordinal()
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn shared(&self) -> &DeviceShared {
        self.inner.shared()
    }

    fn host_accessible(&self) -> bool {
        self.inner.host_accessible()
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.timed("mem_info", || self.inner.mem_info())
    }

    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.inner.managed_headroom()
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.timed("malloc", || self.inner.malloc(bytes))
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.timed("free", || self.inner.free(ptr))
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.timed("malloc_managed", || self.inner.malloc_managed(bytes))
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.timed("free_managed", || self.inner.free_managed(ptr))
    }

    fn open(&self) -> Result<(), DriverError> {
        self.inner.open()
    }

    fn vmm_supported(&self) -> bool {
        self.inner.vmm_supported()
    }

    fn malloc_page(&self) -> usize {
        self.inner.malloc_page()
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        self.inner.granularity()
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.timed("reserve", || self.inner.reserve(bytes, hint))
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.timed("release_reservation", || {
            self.inner.release_reservation(base, bytes)
        })
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.timed("map", || self.inner.map(at, bytes))
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.timed("unmap", || self.inner.unmap(at, bytes, handle))
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.timed("alias", || self.inner.alias(from, to, bytes, handle))
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.timed("unalias", || self.inner.unalias(at, bytes))
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.timed("poison", || self.inner.poison(ptr, bytes))
    }

    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        self.inner.host_buffer(bytes)
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.timed("copy_to_host", || self.inner.copy_to_host(src, dst))
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.timed("copy_from_host", || self.inner.copy_from_host(dst, src))
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.timed("synchronize", || self.inner.synchronize_device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::{SimConfig, SimDevice};

    #[test]
    fn counts_each_primitive_and_passes_results_through() {
        let sim = Arc::new(SimDevice::new(SimConfig::gib(0.25)).unwrap());
        let d = TimedDriver::new(sim.clone());
        let p = d.malloc(1 << 20).unwrap();
        d.free(p).unwrap();
        // A refused call is timed too, and its error comes back unchanged.
        let refused = d.malloc(1 << 40).unwrap_err();
        assert!(refused.is_oom(), "{refused}");
        d.synchronize_device().unwrap();
        let t = d.times();
        assert_eq!(t["malloc"].calls, 2);
        assert_eq!(t["free"].calls, 1);
        assert_eq!(t["synchronize"].calls, 1);
        assert!(!t.contains_key("map"));
        assert_eq!(
            d.total(),
            Duration::from_nanos(t.values().map(|c| c.nanos).sum())
        );
        assert_eq!(sim.mem_info().unwrap().free, d.mem_info().unwrap().free);
    }
}
