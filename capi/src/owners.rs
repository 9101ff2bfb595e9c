//! Which thread holds a block of a stream pool, by address: how a free from another thread than
//! the one that allocated finds the block.
//!
//! A thread's own frees find their block in its own state (`local.rs`), so this map is written
//! only when a block moves between a thread and the pool: when a thread takes a block from the
//! pool, and when it gives one back (its bins overflow or are flushed). A block a thread reuses
//! from its bins stays listed under it, so the steady state of a hot loop writes nothing here.
//! The map is split in shards by address, each behind its own lock on its own cache lines.

use crate::hash::AddrHasher;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

const SHARDS: usize = 64;

type Map<T> = HashMap<u64, Arc<T>, BuildHasherDefault<AddrHasher>>;

#[repr(align(128))]
struct Shard<T>(Mutex<Map<T>>);

/// Address → the thread state (`T`) that holds the block (live or kept for reuse).
pub(crate) struct Owners<T> {
    shards: Box<[Shard<T>]>,
}

impl<T> Default for Owners<T> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard(Mutex::new(Map::default())))
                .collect(),
        }
    }
}

impl<T> Owners<T> {
    #[inline]
    fn shard(&self, ptr: u64) -> &Mutex<Map<T>> {
        // Addresses are multiples of 128 or more, and spread well under a multiplicative hash.
        let i = (ptr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        &self.shards[i].0
    }

    /// `owner` took the block at `ptr` from the pool. Called after the pool handed it out.
    pub(crate) fn insert(&self, ptr: u64, owner: Arc<T>) {
        self.shard(ptr).lock().insert(ptr, owner);
    }

    /// The block at `ptr` goes back to the pool. Called before the pool takes it, so another
    /// thread that gets the address next lists itself after this.
    pub(crate) fn remove(&self, ptr: u64) {
        self.shard(ptr).lock().remove(&ptr);
    }

    /// The thread state holding the block at `ptr`, if any.
    pub(crate) fn get(&self, ptr: u64) -> Option<Arc<T>> {
        self.shard(ptr).lock().get(&ptr).cloned()
    }

    /// Drops every entry (the library is closing: no block is held any more).
    pub(crate) fn clear(&self) {
        for s in self.shards.iter() {
            s.0.lock().clear();
        }
    }
}
