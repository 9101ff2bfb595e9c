//! One thread's state in one stream pool, behind one lock that only this thread takes on its
//! hot path: the blocks it keeps for reuse (by request size), what it asked for (`usage.rs`),
//! and the blocks it handed out that are live, by address.
//!
//! An allocation served from the thread's bins and a free of a block the thread allocated touch
//! nothing but this state: no lock or cache line another thread writes. A free from another
//! thread (a remote free) finds the holder through the stream pool's directory (`owners.rs`)
//! and takes this lock; the block goes back into the holder's bins, as if the holder freed it.
//! The library's other paths (statistics, purges, sleep, shutdown) take it too, one thread's
//! state at a time (`cached.rs`).

use crate::front::Front;
use crate::hash::AddrHasher;
use crate::owned_lock::{OwnedGuard, OwnedLock};
use crate::peaks::Peaks;
use crate::status::{CupoolStatus, Failure};
use crate::usage::Usage;
use cupool_pool::adaptors::ThreadBins;
use cupool_pool::Block;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

/// Address → (size asked for, block).
type LiveMap = HashMap<u64, (usize, Block), BuildHasherDefault<AddrHasher>>;

/// A thread's state in one stream pool (of type `P`), on cache lines of its own.
#[repr(align(128))]
pub(crate) struct Local<P> {
    state: OwnedLock<LocalState<P>>,
}

/// What the lock guards.
pub(crate) struct LocalState<P> {
    /// The stream pool the thread serves from: `None` once the library closed, or the thread
    /// exited, and always for the shared way's state. A call through the thread's cache goes
    /// the shared way then (`threads.rs`).
    pub pool: Option<Arc<P>>,
    pub held: Held,
}

/// The blocks and counts of one thread in one stream pool.
#[derive(Default)]
pub(crate) struct Held {
    /// Whether freed blocks may stay in the bins: not for the shared way's state, nor once the
    /// thread exited.
    pub keeps: bool,
    /// The thread exited: once nothing it allocated is live, its state is dropped.
    pub retired: bool,
    pub bins: ThreadBins,
    pub usage: Usage,
    pub live: LiveMap,
}

impl<P> Local<P> {
    /// A thread's state, serving from `pool`.
    pub(crate) fn serving(pool: Arc<P>) -> Self {
        Self::new(Some(pool), true)
    }

    /// The state of the calls that go the shared way: it keeps nothing for reuse.
    pub(crate) fn shared() -> Self {
        Self::new(None, false)
    }

    fn new(pool: Option<Arc<P>>, keeps: bool) -> Self {
        Self {
            state: OwnedLock::new(LocalState {
                pool,
                held: Held {
                    keeps,
                    ..Held::default()
                },
            }),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> OwnedGuard<'_, LocalState<P>> {
        self.state.lock()
    }

    /// The thread exited: its bins go back to the pool (`front` gives the pool of `P`), later
    /// frees of its blocks too. Returns the pool it served from, if the library is open, for
    /// the caller to unlist this state once none of its blocks is live.
    pub(crate) fn retire<T>(&self, front: impl Fn(&P) -> &Front<T>) -> Option<Arc<P>> {
        let mut st = self.lock();
        st.held.keeps = false;
        st.held.retired = true;
        let pool = st.pool.take();
        if let Some(p) = &pool {
            st.held.flush(front(p));
        }
        pool
    }
}

impl Held {
    /// Allocates `size` bytes for the thread whose state this is (`me`): from its bins when
    /// one of that request size is kept, else from the pool.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn alloc<T>(
        &mut self,
        me: &Arc<T>,
        front: &Front<T>,
        peaks: &Peaks,
        (device, stream): (usize, u64),
        size: usize,
        name: Option<&str>,
    ) -> Result<(u64, usize), Failure> {
        let kept = if self.keeps && !front.asleep() {
            self.bins.take(size.max(1))
        } else {
            None
        };
        let b = match kept {
            Some(b) => b,
            None => self.miss(me, front, peaks, size)?,
        };
        let (ptr, capacity) = (b.ptr(), b.capacity());
        self.usage.alloc(size);
        self.live.insert(ptr, (size, b));
        crate::record::alloc(device, stream, ptr, size, name);
        crate::history::alloc(device, stream, ptr, size, name);
        Ok((ptr, capacity))
    }

    /// A request the bins do not hold, from the pool. Blocks the bins keep are live to the
    /// pool, so it would grow for a request their memory could serve: where it cannot serve
    /// this one from what it holds, the bins go back first (on the MoE prefill the bins'
    /// bound, 8 MiB, was the pool's growth above what it needed: data/h200-2026-11-28-bins).
    /// A larger request than the bins keep is served by memory they do not hold.
    #[inline]
    fn miss<T>(
        &mut self,
        me: &Arc<T>,
        front: &Front<T>,
        peaks: &Peaks,
        size: usize,
    ) -> Result<Block, Failure> {
        if self.bins.blocks() > 0 && size <= front.config().max_block {
            if let Some(b) = front.take_held(me, size, peaks)? {
                return Ok(b);
            }
            self.flush(front);
        }
        front.take_from_pool(me, size, peaks)
    }

    /// Frees `ptr` if it is live here (`None` if not: another thread's, or unknown). `size` is
    /// the size asked for or the usable size (ggml frees with the one, PyTorch with the other).
    #[inline]
    pub(crate) fn free<T>(
        &mut self,
        front: &Front<T>,
        device: usize,
        ptr: u64,
        size: usize,
    ) -> Option<Result<(), Failure>> {
        let Entry::Occupied(e) = self.live.entry(ptr) else {
            return None;
        };
        let (asked, usable) = (e.get().0, e.get().1.capacity());
        if asked != size && usable != size {
            return Some(Err(Failure::new(
                CupoolStatus::SizeMismatch,
                format!("{ptr:#x} was allocated with {asked} bytes ({usable} usable) but freed with {size}: pass the size it was allocated with, or the usable size cupool reported"),
            )));
        }
        let (asked, b) = e.remove();
        self.usage.free(asked);
        crate::record::free(device, ptr);
        crate::history::free(device, front.at.0, ptr, asked);
        Some(self.put_back(front, b))
    }

    /// Keeps a freed block for reuse if this state keeps and the bounds allow; else the pool
    /// takes it back.
    #[inline]
    fn put_back<T>(&mut self, c: &Front<T>, b: Block) -> Result<(), Failure> {
        let b = if self.keeps && !c.asleep() {
            match self.bins.keep(b, c.config()) {
                Ok(()) => return Ok(()),
                Err(b) => b,
            }
        } else {
            b
        };
        c.give_to_pool(b)
    }

    /// Gives every kept block back to the pool; returns how many.
    pub(crate) fn flush<T>(&mut self, c: &Front<T>) -> usize {
        let blocks = self.bins.drain();
        let n = blocks.len();
        for b in blocks {
            if let Err(f) = c.give_to_pool(b) {
                // Only blocks this pool handed out are kept: this is a bug, and the block
                // goes back to its pool through its drop.
                tracing::error!("a thread-kept block was refused by its pool: {}", f.text);
            }
        }
        n
    }

    /// The kept blocks, which the pool counts as live: their request bytes, capacity bytes and
    /// count, for the statistics to move from live to cached.
    pub(crate) fn kept(&self) -> (usize, usize, usize) {
        (self.bins.asked(), self.bins.bytes(), self.bins.blocks())
    }
}
