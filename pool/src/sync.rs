//! Proof of synchronization.
//!
//! Pools hand memory back to their users while kernels that use it may still be queued (as
//! ggml does: a temporary is "freed" when the host function returns). Reusing that memory on
//! the same stream is safe; returning it to the driver is not, until the device has finished
//! the queued work. So every operation that returns memory to the driver takes a
//! [`SyncToken`], and the only way to get one is [`synchronize`].
//!
//! A token is also only as good as the moment it was made: a buffer freed into the pool
//! *after* the synchronize began may belong to a kernel queued after it. Each device keeps an
//! epoch counter; `synchronize` advances it before waiting, pools stamp every cached buffer
//! with the epoch of its free, and a purge only releases buffers stamped before the token.

use crate::driver::{Driver, DriverError, SyncEpoch};

/// Proof that the device finished all work queued before [`synchronize`] was called.
///
/// It cannot be built any other way. A stale token is harmless: pools release only what was
/// freed before it. A purge without a synchronize does not compile:
/// ```compile_fail,E0451
/// # use std::sync::Arc;
/// # use cupool_pool::{driver::sim::{SimConfig, SimDevice}, pools::VmmPool, Pool, Purge, SyncToken};
/// let pool = VmmPool::new(Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap()));
/// let token = SyncToken { epoch_id: 1, epoch: u64::MAX }; // private fields
/// pool.purge(&token, Purge::All).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncToken {
    epoch_id: u64,
    epoch: u64,
}

impl SyncToken {
    /// Whether this token was made by synchronizing the device that owns `epoch`.
    pub(crate) fn is_for(&self, epoch: &SyncEpoch) -> bool {
        self.epoch_id == epoch.id()
    }

    /// Whether a buffer freed at `freed_at` is certainly idle under this token.
    #[inline]
    pub(crate) fn covers(&self, freed_at: u64) -> bool {
        freed_at < self.epoch
    }
}

/// Synchronizes the device and returns the token that purges need.
pub fn synchronize(driver: &dyn Driver) -> Result<SyncToken, DriverError> {
    // Advance first: anything freed from here on is stamped with the new epoch and so is not
    // covered by this token, even if it is freed while the synchronize is still waiting.
    let epoch = driver.epoch().advance();
    driver.synchronize_device()?;
    driver.epoch().finished(epoch);
    Ok(SyncToken {
        epoch_id: driver.epoch().id(),
        epoch,
    })
}
