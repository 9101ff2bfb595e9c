//! A word in page-locked host memory that streams wait on ([`crate::driver::Driver::wait_word`],
//! [`crate::driver::Driver::stream_wait`]): cuStreamWaitValue32 on its device address.

use super::{cuda_err, CudaDriver};
use crate::driver::{CallKind, DriverError, ErrorCode, WaitWord};
use cudarc::driver::sys;

impl CudaDriver {
    /// Four page-locked bytes the device reads. (Whether streams can wait on memory is not
    /// asked of the device: CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 reads 0 where the v2
    /// calls used here work, measured on an H100 with CUDA 13; a refused wait falls back to
    /// the host.)
    pub(super) fn host_word(&self) -> Result<Option<WaitWord>, DriverError> {
        let _restore = self.bind(CallKind::StreamWait)?;
        let mut memory = self.pinned(4)?;
        let mut device: sys::CUdeviceptr = 0;
        let host = memory.bytes_mut().as_mut_ptr();
        // SAFETY: `host` is page-locked memory from cuMemAllocHost in this context; writes the
        // address the device reaches it at.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }
            .result()
            .map_err(|e| cuda_err(CallKind::StreamWait, e, "the device address of a wait word"))?;
        // SAFETY: `device` is where this device reads the first bytes of `memory`.
        unsafe { WaitWord::new(memory, device) }
            .map(Some)
            .ok_or_else(|| {
                DriverError::new(
                    CallKind::StreamWait,
                    ErrorCode::InvalidValue,
                    "page-locked memory for a wait word was not aligned to four bytes",
                )
            })
    }

    /// cuStreamIsCapturing.
    pub(super) fn capturing(&self, stream: u64) -> Result<bool, DriverError> {
        let _restore = self.bind(CallKind::StreamWait)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the caller passes a stream of this context, or 0 (Driver::stream_capturing's
        // contract); writes one enum.
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }
            .result()
            .map_err(|e| {
                cuda_err(
                    CallKind::StreamWait,
                    e,
                    format!("the capture state of stream {stream:#x}"),
                )
            })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// cuStreamWaitValue32(stream, word, value, GEQ).
    pub(super) fn wait_on_stream(
        &self,
        stream: u64,
        word: &WaitWord,
        value: u32,
    ) -> Result<(), DriverError> {
        let _restore = self.bind(CallKind::StreamWait)?;
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: the caller passes a stream of this context, or 0, and keeps the word alive
        // until the stream is past the wait (Driver::stream_wait's contract; DeferredDriver
        // synchronizes the device before its word is freed).
        unsafe {
            sys::cuStreamWaitValue32_v2(stream as sys::CUstream, word.device_ptr(), value, geq)
        }
        .result()
        .map_err(|e| {
            cuda_err(
                CallKind::StreamWait,
                e,
                format!("waiting on stream {stream:#x} for the mappings up to {value}"),
            )
        })
    }
}
