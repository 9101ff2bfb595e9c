//! A driver that passes every call to another one and lets an observer see each call go by.
//!
//! Timing calls ([`super::timed`]) and counting them (the planner's dry runs) need the same
//! thing: every driver call forwarded unchanged, with something done around it. This adaptor
//! does the forwarding once; an observer says what to do around a call, by the call's name.
//! Queries that never reach the device (the ordinal, the granularity, ...) pass straight
//! through and are not shown to the observer.

use super::forward::Forward;
use super::{DevicePtr, Driver, DriverError, HostBuffer, MemInfo, PhysHandle};
use std::fmt::Debug;
use std::sync::Arc;

/// What an [`Observed`] driver does around each call.
pub trait CallObserver: Debug + Send + Sync {
    /// Runs `call` (the forwarded driver call named `name`: `map`, `alias`, `synchronize`, ...)
    /// and returns its result unchanged.
    fn around<T>(&self, name: &'static str, call: impl FnOnce() -> T) -> T;
}

/// See the module docs.
#[derive(Debug)]
pub struct Observed<O> {
    inner: Arc<dyn Driver>,
    observer: O,
}

impl<O: CallObserver> Observed<O> {
    /// `inner`, with `observer` shown each call.
    pub fn new(inner: Arc<dyn Driver>, observer: O) -> Self {
        Self { inner, observer }
    }

    /// The observer, to read what it saw.
    pub fn observer(&self) -> &O {
        &self.observer
    }
}

impl<O: CallObserver> Forward for Observed<O> {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.observer.around("mem_info", || self.inner.mem_info())
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.observer.around("malloc", || self.inner.malloc(bytes))
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.observer.around("free", || self.inner.free(ptr))
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        let inner = &self.inner;
        self.observer
            .around("malloc_managed", || inner.malloc_managed(bytes))
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.observer
            .around("free_managed", || self.inner.free_managed(ptr))
    }

    fn open(&self) -> Result<(), DriverError> {
        self.observer.around("open", || self.inner.open())
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.observer
            .around("reserve", || self.inner.reserve(bytes, hint))
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        let inner = &self.inner;
        self.observer.around("release_reservation", || {
            inner.release_reservation(base, bytes)
        })
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.observer.around("map", || self.inner.map(at, bytes))
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.observer
            .around("unmap", || self.inner.unmap(at, bytes, handle))
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.observer
            .around("alias", || self.inner.alias(from, to, bytes, handle))
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.observer
            .around("unalias", || self.inner.unalias(at, bytes))
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.observer
            .around("poison", || self.inner.poison(ptr, bytes))
    }

    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        self.observer
            .around("host_buffer", || self.inner.host_buffer(bytes))
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.observer
            .around("copy_to_host", || self.inner.copy_to_host(src, dst))
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.observer
            .around("copy_from_host", || self.inner.copy_from_host(dst, src))
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.observer
            .around("synchronize", || self.inner.synchronize_device())
    }
}
