//! A device opened on its first use.
//!
//! Opening a CUDA device creates its primary context, which takes device memory (about
//! 500 MiB on an H100) and stays for the life of the process. A process that sees several GPUs
//! but works on one, as each rank of `torchrun` does, must not pay that on every GPU: libcupool
//! wraps each device in a [`LazyDriver`], which opens it when a pool first needs it (its first
//! allocation) and answers what needs no device without opening it (a synchronize of a device
//! never opened has nothing to wait for).

use super::{
    DevicePtr, DeviceShared, Driver, DriverError, HostBuffer, MemInfo, PhysHandle, WaitWord,
};
use parking_lot::Mutex;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Opens device `ordinal`.
pub type Opener = Box<dyn Fn(usize) -> Result<Arc<dyn Driver>, DriverError> + Send + Sync>;

/// See the module docs.
pub struct LazyDriver {
    ordinal: usize,
    open: Opener,
    opened: OnceLock<Arc<dyn Driver>>,
    /// Held while opening: a device is opened once (a second open that lost a race would be
    /// dropped, and dropping a CUDA context makes it current on the dropping thread).
    opening: Mutex<()>,
    /// The device's shared state, owned here so that pools and synchronizes share one epoch
    /// from before the device is opened.
    shared: DeviceShared,
}

impl fmt::Debug for LazyDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyDriver")
            .field("ordinal", &self.ordinal)
            .field("opened", &self.opened.get())
            .finish()
    }
}

impl LazyDriver {
    /// Device `ordinal`, opened by `open` on first use.
    pub fn new(ordinal: usize, open: Opener) -> Self {
        Self {
            ordinal,
            open,
            opened: OnceLock::new(),
            opening: Mutex::new(()),
            shared: DeviceShared::new(),
        }
    }

    /// CUDA device `ordinal`, opened on first use.
    pub fn cuda(ordinal: usize) -> Self {
        Self::new(
            ordinal,
            Box::new(|i| Ok(Arc::new(super::cuda::CudaDriver::new(i)?) as Arc<dyn Driver>)),
        )
    }

    /// Whether the device was opened.
    pub fn is_open(&self) -> bool {
        self.opened.get().is_some()
    }

    /// The opened device, opening it now if need be (once: threads racing here wait for the
    /// first). A failed open is tried again at the next use.
    fn dev(&self) -> Result<&Arc<dyn Driver>, DriverError> {
        if let Some(d) = self.opened.get() {
            return Ok(d);
        }
        let _one = self.opening.lock();
        if let Some(d) = self.opened.get() {
            return Ok(d);
        }
        let d = (self.open)(self.ordinal)?;
        tracing::debug!(device = self.ordinal, "device opened on first use");
        Ok(self.opened.get_or_init(|| d))
    }
}

impl Driver for LazyDriver {
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn name(&self) -> String {
        match self.dev() {
            Ok(d) => d.name(),
            Err(e) => format!("device {} (could not be opened: {e})", self.ordinal),
        }
    }

    fn shared(&self) -> &DeviceShared {
        &self.shared
    }

    fn open(&self) -> Result<(), DriverError> {
        self.dev().map(|_| ())
    }

    fn host_accessible(&self) -> bool {
        self.dev().is_ok_and(|d| d.host_accessible())
    }

    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.dev()?.mem_info()
    }

    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.dev()?.managed_headroom()
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.dev()?.malloc(bytes)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.dev()?.free(ptr)
    }

    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.dev()?.malloc_managed(bytes)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.dev()?.free_managed(ptr)
    }

    fn vmm_supported(&self) -> bool {
        self.dev().is_ok_and(|d| d.vmm_supported())
    }

    fn malloc_page(&self) -> usize {
        self.dev().map_or(0, |d| d.malloc_page())
    }

    fn granularity(&self) -> Result<usize, DriverError> {
        self.dev()?.granularity()
    }

    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.dev()?.reserve(bytes, hint)
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.dev()?.release_reservation(base, bytes)
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.dev()?.map(at, bytes)
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.dev()?.unmap(at, bytes, handle)
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.dev()?.alias(from, to, bytes, handle)
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.dev()?.unalias(at, bytes)
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.dev()?.poison(ptr, bytes)
    }

    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        self.dev()?.host_buffer(bytes)
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.dev()?.copy_to_host(src, dst)
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.dev()?.copy_from_host(dst, src)
    }

    fn wait_word(&self) -> Result<Option<WaitWord>, DriverError> {
        self.dev()?.wait_word()
    }

    fn stream_capturing(&self, stream: u64) -> Result<bool, DriverError> {
        self.dev()?.stream_capturing(stream)
    }

    fn stream_wait(&self, stream: u64, word: &WaitWord, value: u32) -> Result<(), DriverError> {
        self.dev()?.stream_wait(stream, word, value)
    }

    fn fence(&self, stream: u64) -> Result<(), DriverError> {
        match self.opened.get() {
            Some(d) => d.fence(stream),
            None => Ok(()),
        }
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        // A device this process never opened runs none of the pools' work.
        match self.opened.get() {
            Some(d) => d.synchronize_device(),
            None => Ok(()),
        }
    }
}
