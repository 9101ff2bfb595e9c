//! A word in host memory that the host writes and a device's streams wait on: how work queued
//! on a stream is held back until the host has done something, without the host waiting for
//! the device ([`crate::driver::Driver::stream_wait`]; [`crate::driver::deferred`] uses it so
//! that kernels queued after an allocation run only once its memory is mapped).

use super::{DevicePtr, HostBuffer};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// Four bytes of host memory the device can read ([`crate::driver::Driver::wait_word`]), zero
/// at first.
pub struct WaitWord {
    /// Keeps the memory alive; its first four bytes are the word, reached through `word` only.
    _memory: HostBuffer,
    /// The word: taken from `memory` once, mutably, so every later access is through it.
    word: *const AtomicU32,
    /// The address the device reads it at.
    device: DevicePtr,
}

impl WaitWord {
    /// The word in the first four bytes of `memory` (at least four, aligned to four: host
    /// allocations are), which the device reads at `device`. `None` if `memory` cannot hold it.
    ///
    /// # Safety
    /// `device` must be the address at which the device reads `memory` (page-locked and mapped
    /// for it): a stream told to wait on the word reads whatever lies there.
    pub unsafe fn new(mut memory: HostBuffer, device: DevicePtr) -> Option<Self> {
        let b = memory.bytes_mut();
        if b.len() < 4 || b.as_ptr() as usize % 4 != 0 {
            return None;
        }
        b[..4].fill(0);
        let word = b.as_mut_ptr().cast::<AtomicU32>().cast_const();
        Some(Self {
            _memory: memory,
            word,
            device,
        })
    }

    fn atomic(&self) -> &AtomicU32 {
        // SAFETY: `new` checked the four bytes exist and are aligned, and took the pointer from
        // a mutable borrow; the buffer's memory does not move with it (heap or page-locked) and
        // lives as long as `self`. The host reaches the word only through this atomic.
        unsafe { &*self.word }
    }

    /// Writes `value`; everything this thread did before is done when the device sees it.
    pub fn set(&self, value: u32) {
        self.atomic().store(value, Ordering::Release);
    }

    /// The value last written.
    pub fn get(&self) -> u32 {
        self.atomic().load(Ordering::Acquire)
    }

    /// The address the device reads the word at.
    pub fn device_ptr(&self) -> DevicePtr {
        self.device
    }
}

// SAFETY: the word is an atomic any thread may use; the buffer is Send and Sync itself.
unsafe impl Send for WaitWord {}
// SAFETY: as above.
unsafe impl Sync for WaitWord {}

impl fmt::Debug for WaitWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitWord")
            .field("value", &self.get())
            .field("device", &format_args!("{:#x}", self.device))
            .finish()
    }
}
