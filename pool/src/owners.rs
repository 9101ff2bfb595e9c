//! Pool identities, and which pool core owns each, so a dropped block finds its way back.
//!
//! Blocks carry only their pool's id (an allocation pays no reference count). The table maps
//! ids to inboxes: a block dropped while its pool is alive waits there for the pool's next slow
//! path; once a pool is dropped with live blocks, its inbox holds the retired core, so the
//! memory behind those blocks stays until they come back. Only cold paths touch it: building
//! and dropping a pool, its slow paths, and dropping a block instead of freeing it.

use crate::driver::DevicePtr;
use crate::rate_limit::Doubling;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

/// A retired pool core: it takes dropped blocks back and releases their memory.
pub(crate) trait Reclaim: Send + Sync {
    /// Takes a block back. Returns `true` when the core now holds nothing.
    fn reclaim(&self, parts: Parts) -> bool;
}

#[derive(Default)]
struct InboxState {
    /// Blocks dropped while the pool was alive, waiting for its next slow path.
    dropped: Vec<Parts>,
    /// The pool's state once it was dropped with live blocks.
    retired: Option<Box<dyn Reclaim>>,
}

/// Where a pool's dropped blocks go.
pub(crate) struct Inbox {
    id: PoolId,
    state: Mutex<InboxState>,
}

impl Inbox {
    /// The blocks dropped since the last call.
    pub fn take(&self) -> Vec<Parts> {
        std::mem::take(&mut self.state.lock().dropped)
    }

    /// The pool's handle is going: `f` gets the blocks dropped so far and returns the retired
    /// core to keep, if blocks are still live. Blocks dropped later go to that core.
    pub fn retire(&self, f: impl FnOnce(Vec<Parts>) -> Option<Box<dyn Reclaim>>) {
        let mut s = self.state.lock();
        let dropped = std::mem::take(&mut s.dropped);
        s.retired = f(dropped);
        if s.retired.is_none() {
            drop(s);
            OWNERS.lock().remove(&self.id);
        }
    }

    fn receive(&self, parts: Parts) {
        let mut s = self.state.lock();
        let done = match &s.retired {
            Some(core) => core.reclaim(parts),
            None => {
                s.dropped.push(parts);
                false
            }
        };
        if done {
            s.retired = None;
            drop(s);
            OWNERS.lock().remove(&self.id);
        }
    }
}

static OWNERS: Mutex<BTreeMap<PoolId, Arc<Inbox>>> = Mutex::new(BTreeMap::new());

/// A new pool's inbox, registered under its id.
pub(crate) fn register(id: PoolId) -> Arc<Inbox> {
    let inbox = Arc::new(Inbox {
        id,
        state: Mutex::new(InboxState::default()),
    });
    OWNERS.lock().insert(id, inbox.clone());
    inbox
}

/// Returns a dropped block to its pool (alive or retired).
pub(crate) fn reclaim(parts: Parts) {
    let inbox = OWNERS.lock().get(&parts.pool).cloned();
    let Some(inbox) = inbox else {
        tracing::error!(pool = ?parts.pool, bytes = parts.size, "a block of a pool that no longer exists was dropped; its memory is lost");
        return;
    };
    warn_rate_limited(parts);
    inbox.receive(parts);
}

/// Warns on the 1st, 2nd, 4th, 8th, … dropped block, so a loop that drops blocks does not
/// flood the log.
fn warn_rate_limited(parts: Parts) {
    static DROPPED: Doubling = Doubling::new();
    if let Some(n) = DROPPED.due() {
        tracing::warn!(pool = ?parts.pool, bytes = parts.size, dropped_so_far = n, "a block was dropped instead of freed; it goes back to its pool core, bypassing the pool's adaptors");
    }
}
