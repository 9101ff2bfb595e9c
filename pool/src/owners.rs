//! Pool identities, and which pool core owns each, so a dropped block finds its way back.
//!
//! Blocks carry only their pool's id (an allocation pays no reference count). The table maps
//! ids to cores: weakly while the pool is alive, strongly once a pool dropped with live blocks
//! has retired, so the memory behind those blocks stays until they come back. Only the cold
//! paths touch it: building and dropping a pool, and dropping a block instead of freeing it.

use crate::driver::DevicePtr;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// Identifies one pool instance, so a block can't be freed into the wrong pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(u64);

impl PoolId {
    pub(crate) fn fresh() -> Self {
        Self(NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// A block's fields, taken out of it: whoever holds them returns the memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts {
    pub ptr: DevicePtr,
    pub size: usize,
    pub capacity: usize,
    pub pool: PoolId,
}

/// A pool core that takes blocks back outside the [`crate::Pool`] interface.
pub(crate) trait Reclaim: Send + Sync {
    /// Takes a block back. Returns `true` when the core is retired and now holds nothing.
    fn reclaim(&self, parts: Parts) -> bool;
}

enum Owner {
    Live(Weak<dyn Reclaim>),
    Retired(Arc<dyn Reclaim>),
}

static OWNERS: Mutex<BTreeMap<PoolId, Owner>> = Mutex::new(BTreeMap::new());

pub(crate) fn register(id: PoolId, core: Weak<dyn Reclaim>) {
    OWNERS.lock().insert(id, Owner::Live(core));
}

/// The pool's handle is gone: keep the core alive for its live blocks, or forget it.
pub(crate) fn retire(id: PoolId, core: Option<Arc<dyn Reclaim>>) {
    let mut t = OWNERS.lock();
    match core {
        Some(c) => {
            t.insert(id, Owner::Retired(c));
        }
        None => {
            t.remove(&id);
        }
    }
}

/// Returns a dropped block to its core.
pub(crate) fn reclaim(parts: Parts) {
    let core = match OWNERS.lock().get(&parts.pool) {
        Some(Owner::Live(w)) => w.upgrade(),
        Some(Owner::Retired(a)) => Some(a.clone()),
        None => None,
    };
    let Some(core) = core else {
        tracing::error!(pool = ?parts.pool, bytes = parts.size, "a block of a pool that no longer exists was dropped; its memory is lost");
        return;
    };
    warn_rate_limited(parts);
    if core.reclaim(parts) {
        OWNERS.lock().remove(&parts.pool);
    }
}

/// Warns on the 1st, 2nd, 4th, 8th, … dropped block, so a loop that drops blocks does not
/// flood the log.
fn warn_rate_limited(parts: Parts) {
    static DROPPED: AtomicU64 = AtomicU64::new(0);
    let n = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() {
        tracing::warn!(pool = ?parts.pool, bytes = parts.size, dropped_so_far = n, "a block was dropped instead of freed; it went back to its pool core, bypassing the pool's adaptors");
    }
}
