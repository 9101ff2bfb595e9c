//! Typed RAII buffers, like ggml's `ggml_cuda_pool_alloc<T>`.

use crate::block::Block;
use crate::driver::DevicePtr;
use crate::error::PoolError;
use crate::pool::{Pool, MAX_REQUEST};
use cudarc::driver::{LaunchArgs, PushKernelArg};
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` from a pool, returned to it on drop.
///
/// Returning happens when the host drops the buffer, while kernels using it may still be
/// queued: reuse on the same stream is ordered after them, and memory only goes back to the
/// driver through a purge that proves a synchronize. Pass it to a kernel with
/// `launch_builder(..).arg(&buf)`.
#[derive(Debug)]
pub struct PoolBuffer<T> {
    // Kept in its own field so a kernel argument can point at it for the launch's lifetime.
    ptr: DevicePtr,
    len: usize,
    block: Option<Block>,
    pool: Arc<dyn Pool>,
    _elem: PhantomData<fn() -> T>,
}

impl<T> PoolBuffer<T> {
    /// Allocates `len` elements from `pool`.
    pub fn alloc(pool: &Arc<dyn Pool>, len: usize) -> Result<Self, PoolError> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(PoolError::InvalidSize {
                requested: usize::MAX,
                max: MAX_REQUEST,
            })?;
        let block = pool.alloc(bytes)?;
        Ok(Self {
            ptr: block.ptr(),
            len,
            block: Some(block),
            pool: pool.clone(),
            _elem: PhantomData,
        })
    }

    /// The device address.
    #[inline]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of `T` data (`len * size_of::<T>()`).
    #[inline]
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The underlying block.
    pub fn block(&self) -> &Block {
        // Present from construction until drop.
        self.block.as_ref().expect("block present until drop")
    }

    /// The pool it came from.
    pub fn pool(&self) -> &Arc<dyn Pool> {
        &self.pool
    }
}

impl<T> Drop for PoolBuffer<T> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            if let Err(e) = self.pool.free(block) {
                tracing::error!(error = %e, "returning a buffer to its pool failed");
            }
        }
    }
}

// SAFETY: pushes a pointer to the buffer's `ptr` field, a `u64` device address that lives as
// long as the borrow `'b`, which outlives the launch arguments `'a`.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b PoolBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b PoolBuffer<T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; a mutable borrow is the same pointer.
unsafe impl<'a, 'b: 'a, T> PushKernelArg<&'b mut PoolBuffer<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut PoolBuffer<T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}
