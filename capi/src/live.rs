//! The blocks a stream pool handed out, by address: what a free is checked against.
//!
//! Threads that share a stream (a framework's threads on its default stream) all write here at
//! every allocation and free, so the map is split in shards by address, each behind its own
//! lock on its own cache lines: two threads contend only when their blocks hash to one shard.
//! Addresses are multiples of 128 or more, and spread well under a multiplicative hash.

use crate::hash::AddrHasher;
use crate::usage::ThreadUsage;
use cupool_pool::Block;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

const SHARDS: usize = 64;

/// Address → (size asked for, block, the counts of the thread that allocated it).
type Map = HashMap<u64, (usize, Block, ThreadUsage), BuildHasherDefault<AddrHasher>>;

#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Map>);

/// The blocks a stream pool handed out, in shards by address.
pub(crate) struct Live {
    shards: Box<[Shard]>,
}

impl Default for Live {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl Live {
    /// The shard of `ptr`, locked.
    #[inline]
    pub(crate) fn shard(&self, ptr: u64) -> MutexGuard<'_, Map> {
        let i = (ptr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        self.shards[i].0.lock()
    }

    /// Blocks live now.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }
}
