//! What a pool hands out.

use crate::driver::DevicePtr;
use crate::owners::{self, Parts};

pub use crate::owners::PoolId;

/// One allocation from a pool.
///
/// Only pools create blocks, and a block is not `Clone`: freeing one twice does not compile,
/// and a foreign pointer cannot be freed at all. Free it with [`crate::Pool::free`], or use
/// [`crate::PoolBuffer`], which does that on drop.
///
/// A block that is dropped instead goes back to the pool core that made it (with a warning:
/// adaptors wrapped around that pool do not see it return). That is also the contract for
/// dropping a pool while blocks are live: the pool releases its idle memory at once and keeps
/// the memory behind live blocks, never unmapping or freeing what a block still points at; as
/// the blocks are dropped their memory is released too, and once the last is back nothing of
/// the pool remains.
///
/// A double free is a compile error:
/// ```compile_fail,E0382
/// # use std::sync::Arc;
/// # use cupool_pool::{driver::sim::{SimConfig, SimDevice}, pools::VmmPool, Pool};
/// let pool = VmmPool::new(Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap()));
/// let b = pool.alloc(4096).unwrap();
/// pool.free(b).unwrap();
/// pool.free(b).unwrap(); // use of moved value
/// ```
/// and so is making a block out of a pointer:
/// ```compile_fail,E0451
/// # fn forge(pool: cupool_pool::PoolId) -> cupool_pool::Block {
/// cupool_pool::Block { ptr: 0x1000, size: 64, capacity: 64, pool, managed_fallback: false }
/// # }
/// ```
#[must_use = "a block that is dropped instead of freed bypasses the adaptors of its pool"]
#[derive(Debug, PartialEq, Eq)]
pub struct Block {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
    pub(crate) capacity: usize,
    pub(crate) pool: PoolId,
    pub(crate) managed_fallback: bool,
}

impl Block {
    /// The device address.
    #[inline]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes asked for (at least 1).
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The bytes usable at [`Block::ptr`]: the whole cached buffer for the legacy pool, the
    /// size rounded to the alignment for the VMM pool.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The pool that owns this block.
    #[inline]
    pub fn pool_id(&self) -> PoolId {
        self.pool
    }

    /// Whether this block was served from managed memory because the device was full.
    #[inline]
    pub fn is_managed_fallback(&self) -> bool {
        self.managed_fallback
    }
}

impl Block {
    /// Takes the block apart; its drop no longer returns the memory.
    #[inline]
    pub(crate) fn into_parts(self) -> Parts {
        let parts = Parts {
            ptr: self.ptr,
            size: self.size,
            capacity: self.capacity,
            pool: self.pool,
        };
        std::mem::forget(self);
        parts
    }
}

impl Drop for Block {
    #[cold]
    fn drop(&mut self) {
        owners::reclaim(Parts {
            ptr: self.ptr,
            size: self.size,
            capacity: self.capacity,
            pool: self.pool,
        });
    }
}
