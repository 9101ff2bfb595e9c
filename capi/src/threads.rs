//! Each thread's cache of its states in the stream pools it used (`local.rs`), and the gate that
//! lets `cupool_shutdown` run only while no allocation or free is in flight.
//!
//! The hot path takes no global lock and writes no shared line: a thread finds its state in a
//! cache only it touches (a thread local, no lock), and takes that state's own lock, which other
//! threads take only for a remote free, statistics, a purge or shutdown. That lock is the gate:
//! shutdown raises [`CLOSING`], then takes every state's lock in turn, so each call in flight
//! has ended and each later call sees the flag and goes the shared way (under the library's read
//! lock, which shutdown then takes for writing). When the library closes, every state gives its
//! blocks back and lets go of its pool, so an idle thread keeps no pool, and no memory, alive:
//! its cache holds only its states, which its next call finds stale by the generation.
//!
//! A call that comes after this thread's locals were destroyed (a free from another thread
//! local's destructor, or from a pthread key's, at thread or process exit) finds no cache and
//! goes the shared way too: nothing here touches a thread local with `with`, which panics then.
//! The thread's exit retires its states: their kept blocks go back to the pool, and each is
//! dropped once none of its blocks is live (frees of them find it through the pool's directory).

use crate::local::{Held, LocalState};
use crate::state::{self, StreamPool, ThreadState};
use crate::status::Failure;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Device (as the caller names it), stream, tag.
type Key = (i32, u64, u32);

/// One thread's states, by pool, of the library generation it saw; the last one apart (a
/// thread mostly uses one stream: no hashing then).
#[derive(Default)]
struct Cache {
    generation: u64,
    last: Option<(Key, Arc<ThreadState>)>,
    streams: HashMap<Key, Arc<ThreadState>, BuildHasherDefault<crate::hash::AddrHasher>>,
}

impl Cache {
    fn forget(&mut self, generation: u64) {
        self.generation = generation;
        self.last = None;
        self.streams.clear();
    }

    /// This thread's state in the pool `key` names, joined on first use; `None` when there is
    /// none to join (the shared way says why).
    #[inline]
    fn local(&mut self, key: Key, create: bool) -> Option<&Arc<ThreadState>> {
        let generation = state::generation();
        if self.generation != generation {
            // The library closed since: those states serve nothing any more.
            self.forget(generation);
        }
        if self.last.as_ref().is_some_and(|(k, _)| *k == key) {
            return self.last.as_ref().map(|(_, l)| l);
        }
        self.find(key, create)
    }

    #[cold]
    fn find(&mut self, key: Key, create: bool) -> Option<&Arc<ThreadState>> {
        let l = match self.streams.get(&key) {
            Some(l) => l.clone(),
            None => {
                let (l, generation) = state::join(key.0, key.1, key.2, create)?;
                if generation != self.generation {
                    self.forget(generation);
                }
                self.streams.insert(key, l.clone());
                l
            }
        };
        self.last = Some((key, l));
        self.last.as_ref().map(|(_, l)| l)
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // The thread is exiting: what it kept goes back now, not at the next purge.
        self.last = None;
        for (_, l) in self.streams.drain() {
            StreamPool::retire(&l);
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// Raised by shutdown while it counts the live blocks: calls go the shared way meanwhile.
static CLOSING: AtomicBool = AtomicBool::new(false);

/// Runs `f` on this thread's state in the pool of `device` × `stream` × `tag` (joined on first
/// use; the pool built on first use when `create`), under that state's lock. `None` when the
/// call must go the shared way: while shutdown runs, after this thread's locals are gone, when
/// no pool can be joined, or when `f` says so.
#[inline]
pub(crate) fn with_local<T>(
    device: i32,
    stream: u64,
    tag: u32,
    create: bool,
    f: impl FnOnce(&Arc<ThreadState>, &Arc<StreamPool>, &mut Held) -> Option<Result<T, Failure>>,
) -> Option<Result<T, Failure>> {
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let local = c.local((device, stream, tag), create)?;
            let mut st = local.lock();
            // Read under the state's lock: shutdown raises the flag before it takes each
            // state's lock, so this call either ends before shutdown goes on or sees the flag.
            if CLOSING.load(Ordering::Relaxed) {
                return None;
            }
            let LocalState { pool, held } = &mut *st;
            f(local, pool.as_ref()?, held)
        })
        .ok()
        .flatten()
}

/// Closes the library: refused while blocks are live. No allocation or free runs meanwhile
/// (see the module's text), and every thread's kept blocks go back, so the pools, and the
/// memory they cache, go back now, not at each thread's next call.
pub(crate) fn shutdown() -> Result<(), Failure> {
    let admin = state::admin();
    let Some(lib) = state::current() else {
        return Ok(());
    };
    CLOSING.store(true, Ordering::SeqCst);
    let _open = Reopen;
    // A state that joins after this snapshot does so under the library's read lock, after the
    // flag was raised: its calls see the flag.
    for s in lib.pools_of(None) {
        s.pool.wait_calls();
    }
    drop(lib);
    state::close(&admin)
}

/// Lowers the gate when shutdown ends, whether it closed the library or refused.
struct Reopen;

impl Drop for Reopen {
    fn drop(&mut self) {
        CLOSING.store(false, Ordering::SeqCst);
    }
}

/// Threads' states listed in the open library's pools.
#[cfg(test)]
pub(crate) fn threads_listed() -> usize {
    state::current().map_or(0, |l| {
        l.pools_of(None).iter().map(|s| s.pool.threads()).sum()
    })
}

/// Whether this thread's cache is gone (its locals are being destroyed).
#[cfg(test)]
pub(crate) fn cache_gone() -> bool {
    CACHE.try_with(|_| ()).is_err()
}
