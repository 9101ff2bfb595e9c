//! Wrapping a driver: an adaptor implements [`Forward`], naming the driver it wraps, and
//! overrides only the calls it changes; every other call reaches the wrapped driver unchanged.
//! The list of calls is written once, here, for every adaptor (a memory limit, fault
//! injection, opening on first use, watching calls, libcupool's segment tracking).

use super::{
    DevicePtr, DeviceShared, Driver, DriverError, HostBuffer, MemInfo, PhysHandle, SyncEpoch,
    WaitWord,
};
use std::fmt::Debug;

/// A driver that wraps another: each call defaults to the wrapped driver's
/// ([`Forward::inner`]), and every `Forward` is a [`Driver`].
pub trait Forward: Debug + Send + Sync {
    /// The wrapped driver.
    fn inner(&self) -> &dyn Driver;

    /// [`Driver::ordinal`], by default the wrapped driver's.
    fn ordinal(&self) -> usize {
        self.inner().ordinal()
    }

    /// [`Driver::name`], by default the wrapped driver's.
    fn name(&self) -> String {
        self.inner().name()
    }

    /// [`Driver::shared`], by default the wrapped driver's.
    fn shared(&self) -> &DeviceShared {
        self.inner().shared()
    }

    /// [`Driver::epoch`], by default the wrapped driver's.
    fn epoch(&self) -> &SyncEpoch {
        self.inner().epoch()
    }

    /// [`Driver::host_accessible`], by default the wrapped driver's.
    fn host_accessible(&self) -> bool {
        self.inner().host_accessible()
    }

    /// [`Driver::simulated`], by default the wrapped driver's.
    fn simulated(&self) -> bool {
        self.inner().simulated()
    }

    /// [`Driver::mem_info`], by default the wrapped driver's.
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.inner().mem_info()
    }

    /// [`Driver::managed_headroom`], by default the wrapped driver's.
    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.inner().managed_headroom()
    }

    /// [`Driver::malloc`], by default the wrapped driver's.
    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.inner().malloc(bytes)
    }

    /// [`Driver::free`], by default the wrapped driver's.
    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner().free(ptr)
    }

    /// [`Driver::malloc_managed`], by default the wrapped driver's.
    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.inner().malloc_managed(bytes)
    }

    /// [`Driver::free_managed`], by default the wrapped driver's.
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner().free_managed(ptr)
    }

    /// [`Driver::open`], by default the wrapped driver's.
    fn open(&self) -> Result<(), DriverError> {
        self.inner().open()
    }

    /// [`Driver::vmm_supported`], by default the wrapped driver's.
    fn vmm_supported(&self) -> bool {
        self.inner().vmm_supported()
    }

    /// [`Driver::malloc_page`], by default the wrapped driver's.
    fn malloc_page(&self) -> usize {
        self.inner().malloc_page()
    }

    /// [`Driver::granularity`], by default the wrapped driver's.
    fn granularity(&self) -> Result<usize, DriverError> {
        self.inner().granularity()
    }

    /// [`Driver::reserve`], by default the wrapped driver's.
    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.inner().reserve(bytes, hint)
    }

    /// [`Driver::release_reservation`], by default the wrapped driver's.
    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner().release_reservation(base, bytes)
    }

    /// [`Driver::map`], by default the wrapped driver's.
    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.inner().map(at, bytes)
    }

    /// [`Driver::unmap`], by default the wrapped driver's.
    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.inner().unmap(at, bytes, handle)
    }

    /// [`Driver::alias`], by default the wrapped driver's.
    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.inner().alias(from, to, bytes, handle)
    }

    /// [`Driver::unalias`], by default the wrapped driver's.
    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner().unalias(at, bytes)
    }

    /// [`Driver::poison`], by default the wrapped driver's.
    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner().poison(ptr, bytes)
    }

    /// [`Driver::host_buffer`], by default the wrapped driver's.
    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        self.inner().host_buffer(bytes)
    }

    /// [`Driver::copy_to_host`], by default the wrapped driver's.
    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.inner().copy_to_host(src, dst)
    }

    /// [`Driver::copy_from_host`], by default the wrapped driver's.
    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.inner().copy_from_host(dst, src)
    }

    /// [`Driver::synchronize_device`], by default the wrapped driver's.
    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.inner().synchronize_device()
    }

    /// [`Driver::wait_word`], by default the wrapped driver's.
    fn wait_word(&self) -> Result<Option<WaitWord>, DriverError> {
        self.inner().wait_word()
    }

    /// [`Driver::stream_capturing`], by default the wrapped driver's.
    fn stream_capturing(&self, stream: u64) -> Result<bool, DriverError> {
        self.inner().stream_capturing(stream)
    }

    /// [`Driver::stream_wait`], by default the wrapped driver's.
    fn stream_wait(&self, stream: u64, word: &WaitWord, value: u32) -> Result<(), DriverError> {
        self.inner().stream_wait(stream, word, value)
    }

    /// [`Driver::fence`], by default the wrapped driver's.
    fn fence(&self, stream: u64) -> Result<(), DriverError> {
        self.inner().fence(stream)
    }
}

impl<T: Forward> Driver for T {
    #[inline]
    fn wait_word(&self) -> Result<Option<WaitWord>, DriverError> {
        Forward::wait_word(self)
    }

    #[inline]
    fn stream_capturing(&self, stream: u64) -> Result<bool, DriverError> {
        Forward::stream_capturing(self, stream)
    }

    #[inline]
    fn stream_wait(&self, stream: u64, word: &WaitWord, value: u32) -> Result<(), DriverError> {
        Forward::stream_wait(self, stream, word, value)
    }

    #[inline]
    fn fence(&self, stream: u64) -> Result<(), DriverError> {
        Forward::fence(self, stream)
    }

    #[inline]
    fn ordinal(&self) -> usize {
        Forward::ordinal(self)
    }

    #[inline]
    fn name(&self) -> String {
        Forward::name(self)
    }

    #[inline]
    fn shared(&self) -> &DeviceShared {
        Forward::shared(self)
    }

    #[inline]
    fn epoch(&self) -> &SyncEpoch {
        Forward::epoch(self)
    }

    #[inline]
    fn host_accessible(&self) -> bool {
        Forward::host_accessible(self)
    }

    fn simulated(&self) -> bool {
        Forward::simulated(self)
    }

    #[inline]
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        Forward::mem_info(self)
    }

    #[inline]
    fn managed_headroom(&self) -> Result<usize, DriverError> {
        Forward::managed_headroom(self)
    }

    #[inline]
    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        Forward::malloc(self, bytes)
    }

    #[inline]
    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        Forward::free(self, ptr)
    }

    #[inline]
    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        Forward::malloc_managed(self, bytes)
    }

    #[inline]
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        Forward::free_managed(self, ptr)
    }

    #[inline]
    fn open(&self) -> Result<(), DriverError> {
        Forward::open(self)
    }

    #[inline]
    fn vmm_supported(&self) -> bool {
        Forward::vmm_supported(self)
    }

    #[inline]
    fn malloc_page(&self) -> usize {
        Forward::malloc_page(self)
    }

    #[inline]
    fn granularity(&self) -> Result<usize, DriverError> {
        Forward::granularity(self)
    }

    #[inline]
    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        Forward::reserve(self, bytes, hint)
    }

    #[inline]
    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        Forward::release_reservation(self, base, bytes)
    }

    #[inline]
    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        Forward::map(self, at, bytes)
    }

    #[inline]
    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        Forward::unmap(self, at, bytes, handle)
    }

    #[inline]
    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        Forward::alias(self, from, to, bytes, handle)
    }

    #[inline]
    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        Forward::unalias(self, at, bytes)
    }

    #[inline]
    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        Forward::poison(self, ptr, bytes)
    }

    #[inline]
    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        Forward::host_buffer(self, bytes)
    }

    #[inline]
    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        Forward::copy_to_host(self, src, dst)
    }

    #[inline]
    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        Forward::copy_from_host(self, dst, src)
    }

    #[inline]
    fn synchronize_device(&self) -> Result<(), DriverError> {
        Forward::synchronize_device(self)
    }
}
