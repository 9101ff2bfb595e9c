use std::fmt;

/// Which driver primitive a call or an error belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// cuMemGetInfo.
    MemInfo,
    /// cuMemAlloc.
    Malloc,
    /// cuMemFree.
    Free,
    /// cuMemAllocManaged.
    MallocManaged,
    /// cuMemFree of managed memory.
    FreeManaged,
    /// cuMemGetAllocationGranularity.
    Granularity,
    /// cuMemAddressReserve.
    Reserve,
    /// cuMemAddressFree.
    ReleaseReservation,
    /// cuMemCreate.
    Create,
    /// cuMemMap.
    Map,
    /// cuMemSetAccess.
    SetAccess,
    /// cuMemUnmap.
    Unmap,
    /// cuMemRelease.
    Release,
    /// cuCtxSynchronize.
    Synchronize,
    /// Loading the driver library or creating a context.
    Init,
    /// cuMemAllocHost: page-locked host memory.
    HostAlloc,
    /// cuMemcpyDtoH / cuMemcpyHtoD.
    Copy,
    /// cuStreamWaitValue32, and what it needs (a word the device reads, the capture state).
    StreamWait,
}

impl CallKind {
    /// Every kind, in declaration order.
    pub const ALL: [CallKind; 18] = [
        CallKind::MemInfo,
        CallKind::Malloc,
        CallKind::Free,
        CallKind::MallocManaged,
        CallKind::FreeManaged,
        CallKind::Granularity,
        CallKind::Reserve,
        CallKind::ReleaseReservation,
        CallKind::Create,
        CallKind::Map,
        CallKind::SetAccess,
        CallKind::Unmap,
        CallKind::Release,
        CallKind::Synchronize,
        CallKind::Init,
        CallKind::HostAlloc,
        CallKind::Copy,
        CallKind::StreamWait,
    ];

    /// The CUDA driver function this kind stands for.
    pub fn cuda_name(self) -> &'static str {
        match self {
            CallKind::MemInfo => "cuMemGetInfo",
            CallKind::Malloc => "cuMemAlloc",
            CallKind::Free => "cuMemFree",
            CallKind::MallocManaged => "cuMemAllocManaged",
            CallKind::FreeManaged => "cuMemFree(managed)",
            CallKind::Granularity => "cuMemGetAllocationGranularity",
            CallKind::Reserve => "cuMemAddressReserve",
            CallKind::ReleaseReservation => "cuMemAddressFree",
            CallKind::Create => "cuMemCreate",
            CallKind::Map => "cuMemMap",
            CallKind::SetAccess => "cuMemSetAccess",
            CallKind::Unmap => "cuMemUnmap",
            CallKind::Release => "cuMemRelease",
            CallKind::Synchronize => "cuCtxSynchronize",
            CallKind::Init => "driver initialisation",
            CallKind::HostAlloc => "cuMemAllocHost",
            CallKind::Copy => "cuMemcpy",
            CallKind::StreamWait => "cuStreamWaitValue32",
        }
    }
}

/// What went wrong in a driver call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The device has no memory left for this request.
    OutOfMemory,
    /// The device or driver does not support the operation (e.g. VMM).
    NotSupported,
    /// An argument was rejected (unknown pointer, misaligned range, ...).
    InvalidValue,
    /// The CUDA driver library could not be loaded.
    LibraryMissing,
    /// A fault injected on the simulated device.
    Injected,
    /// Any other CUDA error, by its numeric code.
    Cuda(u32),
}

/// A failed driver call: which call, what code, and a sentence of detail.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverError {
    /// The primitive that failed.
    pub call: CallKind,
    /// The reason.
    pub code: ErrorCode,
    /// Human-readable detail: sizes, addresses, the driver's own error name.
    pub detail: String,
}

impl DriverError {
    /// Builds an error.
    pub fn new(call: CallKind, code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            call,
            code,
            detail: detail.into(),
        }
    }

    /// Whether this is an out-of-memory condition.
    pub fn is_oom(&self) -> bool {
        self.code == ErrorCode::OutOfMemory
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.code {
            ErrorCode::OutOfMemory => "out of memory".to_string(),
            ErrorCode::NotSupported => "not supported".to_string(),
            ErrorCode::InvalidValue => "invalid value".to_string(),
            ErrorCode::LibraryMissing => "CUDA driver library not found".to_string(),
            ErrorCode::Injected => "injected fault".to_string(),
            ErrorCode::Cuda(c) => format!("CUDA error {c}"),
        };
        write!(f, "{} failed: {code}", self.call.cuda_name())?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for DriverError {}
