//! The driver layer: the only code in cupool that talks to a device.
//!
//! [`Driver`] is the small set of primitives the pools need. Two implementations talk to a
//! device: [`sim::SimDevice`] (host memory behind the addresses, a capacity and a ledger) and
//! [`cuda::CudaDriver`] (cudarc with dynamic loading). Anything else that changes driver
//! behaviour wraps a driver, and works over either: a memory limit on a large card
//! ([`limit::LimitedDriver`]), fault injection ([`fault::FaultInjector`]), opening a device
//! on its first use ([`lazy::LazyDriver`]) and watching each call go by
//! ([`observed::Observed`]; timing each call is [`timed::TimedDriver`]) and moving page
//! mappings off the allocating thread ([`deferred::DeferredDriver`]). A wrapper implements
//! [`forward::Forward`] and overrides only the calls it changes.

pub mod cuda;
pub mod deferred;
mod error;
pub mod fault;
pub mod forward;
mod host;
pub mod lazy;
pub mod limit;
pub mod observed;
mod shared;
pub mod sim;
pub mod timed;
mod wait;
pub mod worker;

pub use error::{CallKind, DriverError, ErrorCode};
pub use host::{HostBuffer, HostMemory};
pub use shared::{DeviceShared, ManagedLedger, SyncEpoch};
pub use wait::WaitWord;

use std::fmt;

/// A device address. On the simulated device it is also a valid host address.
pub type DevicePtr = u64;

/// Free and total memory of a device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemInfo {
    /// Bytes the device can still hand out.
    pub free: usize,
    /// Bytes the device has in all.
    pub total: usize,
}

impl MemInfo {
    /// Bytes in use on the device, by anyone.
    pub fn used(&self) -> usize {
        self.total.saturating_sub(self.free)
    }
}

/// The physical memory behind one VMM mapping, as the driver identifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysHandle(pub u64);

/// The device primitives a pool is built on.
///
/// Implementations must be thread-safe: pools on several streams of one device share one
/// driver. Every failure is a [`DriverError`]; an implementation never panics on a bad
/// argument.
pub trait Driver: Send + Sync + fmt::Debug {
    /// Device ordinal, as CUDA numbers devices.
    fn ordinal(&self) -> usize;

    /// A short human-readable name ("sim 12.0 GiB", "NVIDIA H200").
    fn name(&self) -> String;

    /// The state every user of this device shares (synchronize epoch, managed ledger). A
    /// wrapping driver returns the wrapped driver's.
    fn shared(&self) -> &DeviceShared;

    /// The device's synchronize counter; see [`crate::sync`].
    fn epoch(&self) -> &SyncEpoch {
        &self.shared().epoch
    }

    /// Whether device addresses are host addresses this process can read and write (the
    /// simulated device with backing). CPU executors need it.
    fn host_accessible(&self) -> bool {
        false
    }

    /// Whether the device is simulated: only its pools keep snapshots (`crate::PoolSnapshot`),
    /// since a restore forgets memory the pool holds.
    fn simulated(&self) -> bool {
        false
    }

    /// Free and total device memory.
    fn mem_info(&self) -> Result<MemInfo, DriverError>;

    /// How much managed memory may be asked for without oversubscribing the physical card.
    ///
    /// Defaults to the free memory [`Driver::mem_info`] reports; a driver that only pretends
    /// to be a smaller card returns the real card's free memory here.
    fn managed_headroom(&self) -> Result<usize, DriverError> {
        self.mem_info().map(|m| m.free)
    }

    /// Allocates `bytes` of device memory (cuMemAlloc). Aligned to at least 256 bytes.
    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError>;

    /// Returns memory from [`Driver::malloc`] (cuMemFree).
    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError>;

    /// Allocates `bytes` of managed (unified) memory (cuMemAllocManaged, attach global).
    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError>;

    /// Returns memory from [`Driver::malloc_managed`].
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError>;

    /// Makes sure the device can be used, opening it if it is opened on first use
    /// ([`lazy::LazyDriver`]): the reason it cannot, before anything is asked of it. A pool is
    /// built only on a device that opened. The default: always usable.
    fn open(&self) -> Result<(), DriverError> {
        Ok(())
    }

    /// Whether the device supports virtual memory management (reserve and map).
    fn vmm_supported(&self) -> bool;

    /// The pages a device allocation ([`Driver::malloc`]) takes from the card: each costs its
    /// size rounded up to a multiple of this; 0: exactly its size. The planner counts them.
    fn malloc_page(&self) -> usize {
        0
    }

    /// The allocation granularity for physical VMM memory (recommended granularity).
    fn granularity(&self) -> Result<usize, DriverError>;

    /// Reserves `bytes` of device address space, aligned to the granularity
    /// (cuMemAddressReserve). `hint` is where the caller would like it (0: anywhere), such as
    /// right after a range it already holds; like CUDA's, it is only a wish, and the range may
    /// lie anywhere.
    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError>;

    /// Frees an address range from [`Driver::reserve`]; nothing may be mapped in it any more.
    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError>;

    /// Creates `bytes` of physical memory, maps it at `at` (inside a reservation) and makes it
    /// readable and writable by the device. A failure in any step undoes the earlier steps.
    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError>;

    /// Unmaps a range mapped by [`Driver::map`] and releases its physical memory. On error the
    /// range is still mapped and may be unmapped again later.
    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError>;

    /// Maps the physical memory of the mapping made by [`Driver::map`] at `from` at `to` as
    /// well (cuMemMap of the same handle and cuMemSetAccess), leaving `from` mapped: a pool
    /// recycles a free page where it needs one instead of creating another, without waiting for
    /// kernels still queued on `from` (unmapping it under them would fault). `to` must lie
    /// inside a reservation, aligned, with nothing mapped; both addresses reach the same bytes
    /// until [`Driver::unalias`] unmaps one. On error nothing changed. The default refuses, so a
    /// driver that cannot alias memory makes the pool create new memory instead.
    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        let _ = (to, handle);
        Err(DriverError::new(
            CallKind::Map,
            ErrorCode::NotSupported,
            format!("this driver cannot map the {bytes} bytes mapped at {from:#x} a second time"),
        ))
    }

    /// Unmaps the mapping of `bytes` at `at` (cuMemUnmap alone) whose physical memory is also
    /// mapped elsewhere by [`Driver::alias`]: the memory stays where the other mapping is.
    /// Nothing may use `at` any more: the caller has synchronized since its last use. On error
    /// the range is still mapped. The default refuses, as [`Driver::alias`].
    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        Err(DriverError::new(
            CallKind::Unmap,
            ErrorCode::NotSupported,
            format!("this driver has no second mapping of the {bytes} bytes at {at:#x}"),
        ))
    }

    /// Fills `bytes` at `ptr` with 0xFF (NaN as f32, f16 and bf16), ordered after the work
    /// already queued on the default stream. Used by the `poison` feature on every free, so a
    /// kernel that reads freed scratch produces NaN instead of stale, plausible numbers.
    /// The default does nothing.
    fn poison(&self, _ptr: DevicePtr, _bytes: usize) -> Result<(), DriverError> {
        Ok(())
    }

    /// Host memory of `bytes` to copy device memory into while a pool sleeps (page-locked
    /// on a GPU: cuMemAllocHost). The default is heap memory.
    fn host_buffer(&self, bytes: usize) -> Result<HostBuffer, DriverError> {
        Ok(HostBuffer::heap(bytes))
    }

    /// Copies `dst.len()` bytes of device memory at `src` into `dst` and waits for the copy
    /// (cuMemcpyDtoH). The range must be mapped. The default refuses: only a driver that can
    /// reach device memory can copy it.
    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        let _ = dst;
        Err(no_copy(src))
    }

    /// Copies `src` into device memory at `dst` and waits for the copy (cuMemcpyHtoD). The
    /// range must be mapped. The default refuses, as [`Driver::copy_to_host`].
    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        let _ = src;
        Err(no_copy(dst))
    }

    /// A word in host memory this device's streams can wait on ([`Driver::stream_wait`]);
    /// `None` where they cannot (the default: the simulated device has no streams).
    fn wait_word(&self) -> Result<Option<WaitWord>, DriverError> {
        Ok(None)
    }

    /// Whether `stream` is being captured into a graph. `stream` is a `CUstream` of this
    /// device's context, or 0 (the legacy default stream); CUDA cannot check a handle, and
    /// anything else is undefined behaviour in the driver. The default: never.
    fn stream_capturing(&self, stream: u64) -> Result<bool, DriverError> {
        let _ = stream;
        Ok(false)
    }

    /// Queues on `stream` (as in [`Driver::stream_capturing`]) a wait until `word` reaches
    /// `value` (cyclic, so the count may wrap: `(int32_t)(word - value) >= 0`); work queued on
    /// the stream after it runs only then. The word must stay alive until the stream is past
    /// the wait. The default refuses: a driver without streams cannot wait on them.
    fn stream_wait(&self, stream: u64, word: &WaitWord, value: u32) -> Result<(), DriverError> {
        let _ = (word, value);
        Err(DriverError::new(
            CallKind::StreamWait,
            ErrorCode::NotSupported,
            format!("this driver has no stream {stream:#x} to queue a wait on"),
        ))
    }

    /// Makes sure work queued on `stream` after this call sees every mapping the calls so far
    /// made; `stream` as in [`Driver::stream_capturing`], the one the caller's memory is used
    /// on. Drivers whose calls are done when they return (the default) do nothing; one that
    /// maps memory behind the caller's back ([`deferred::DeferredDriver`]) queues a wait on the
    /// stream, or waits.
    fn fence(&self, stream: u64) -> Result<(), DriverError> {
        let _ = stream;
        Ok(())
    }

    /// Waits until all work queued on the device has finished (cuCtxSynchronize).
    ///
    /// Use [`crate::sync::synchronize`] instead: it hands out the [`crate::SyncToken`] that
    /// purges require.
    fn synchronize_device(&self) -> Result<(), DriverError>;
}

/// What a device allocation of `bytes` takes from a card that hands out pages of `page` bytes
/// ([`Driver::malloc_page`]; 0: exactly `bytes`).
pub fn in_pages(bytes: usize, page: usize) -> usize {
    match page {
        0 | 1 => bytes,
        p => bytes.div_ceil(p).saturating_mul(p),
    }
}

fn no_copy(at: DevicePtr) -> DriverError {
    DriverError::new(
        CallKind::Copy,
        ErrorCode::NotSupported,
        format!("this driver cannot copy device memory (at {at:#x}) to or from the host"),
    )
}
