//! A pool's state at a point where it holds no live block, to go back to: a simulation tries
//! several continuations from one point without running what led there again (the planner's
//! prompts of one context share every ubatch but their last one or two:
//! `runtime/src/planner/tail.rs`).
//!
//! Only what a pool decides from is kept: its placement's cached memory, its upstream's address
//! space and pages, its counters; the simulated device keeps its own ledger
//! (`SimDevice::snapshot`). A pool with live blocks has none to take (their owners would
//! outlive the state they were placed in), and only pools whose parts can copy their state
//! offer one, on a simulated device only (a restore forgets memory the pool holds: on a GPU
//! that would leak it and hand out addresses released since): the legacy and vmm pool cores
//! (the vmm one with no worker started to make pages ahead and nothing offloaded by a sleep),
//! size classes over them, and the adaptors that keep nothing of their own. The others answer
//! [`PoolError::Snapshot`]. The caller restores the device with the pool
//! (`SimDevice::restore`).

use crate::error::PoolError;
use crate::kind::PoolKind;
use std::any::Any;

/// A pool's state, taken by [`crate::Pool::snapshot`], for [`crate::Pool::restore`] of the same
/// pool.
pub struct PoolSnapshot(pub(crate) Box<dyn Any + Send>);

impl std::fmt::Debug for PoolSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolSnapshot")
    }
}

impl PoolSnapshot {
    /// Wraps the state of a pool outside this crate (an adaptor of its own).
    pub fn new<T: Any + Send>(state: T) -> Self {
        Self(Box::new(state))
    }

    /// The state as `T`, if it is one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

/// The answer of a pool that keeps no snapshot, or refuses one now: `why` says what it lacks.
pub fn unsupported(kind: PoolKind, why: &'static str) -> PoolError {
    PoolError::Snapshot { kind, why }
}
