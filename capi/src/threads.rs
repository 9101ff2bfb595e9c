//! Each thread's cache of the stream pools it used, and the gate that lets `cupool_shutdown`
//! run only while no allocation or free is in flight.
//!
//! The hot path takes no global lock and changes no shared counter: a thread finds its pool in
//! a cache of its own, behind a lock of its own that only `shutdown` ever contends for. That
//! lock is the gate: shutdown raises [`CLOSING`], then takes every thread's lock in turn, so each
//! call in flight has ended, each later call sees the flag and goes the shared way (under the
//! library's read lock, which shutdown then takes for writing), and each thread's cache is
//! emptied by shutdown itself, so an idle thread keeps no pool, and no memory, alive.
//!
//! A call that comes after this thread's locals were destroyed (a free from another thread
//! local's destructor, or from a pthread key's, at thread or process exit) finds no cache and
//! goes the shared way too: nothing here touches a thread local with `with`, which panics then.

use crate::state::{self, Lib, StreamPool};
use crate::status::{CupoolStatus, Failure};
use crate::usage::ThreadUsage;
use parking_lot::Mutex;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Key = (usize, u64, u32);
/// A stream pool and this thread's counts in it.
type Entry = (Arc<StreamPool>, ThreadUsage);

/// One thread's cache: the library it saw (by generation) and the stream pools it used, the
/// last one apart (a thread mostly uses one stream: no hashing then).
#[derive(Default)]
struct Cache {
    generation: u64,
    lib: Option<Arc<Lib>>,
    last: Option<(Key, Entry)>,
    streams: HashMap<Key, Entry, BuildHasherDefault<crate::hash::AddrHasher>>,
}

impl Cache {
    fn clear(&mut self) {
        self.generation = 0;
        self.lib = None;
        self.last = None;
        self.streams.clear();
    }

    fn run<T>(
        &mut self,
        device: i32,
        stream: u64,
        tag: u32,
        create: bool,
        f: impl FnOnce(&StreamPool, &ThreadUsage) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let generation = state::generation();
        if self.generation != generation {
            self.streams.clear();
            self.last = None;
            self.lib = state::current();
            self.generation = generation;
        }
        // No reference count changes here: threads would contend on the shared counters.
        let lib = self.lib.as_ref().ok_or_else(state::not_initialized)?;
        let d = lib.check_device(device)?;
        let key = (d, stream, tag);
        if let Some((k, (s, u))) = &self.last {
            if *k == key {
                return f(s, u);
            }
        }
        let e = match self.streams.entry(key) {
            MapEntry::Occupied(e) => e.into_mut(),
            MapEntry::Vacant(e) => {
                let s = lib.stream(d, stream, tag, create)?;
                let u = s.usage.join();
                e.insert((s, u))
            }
        };
        self.last = Some((key, e.clone()));
        f(&e.0, &e.1)
    }
}

/// A thread's cache behind its own lock; the list below holds it too, for shutdown.
#[derive(Default)]
struct Slot {
    cache: Mutex<Cache>,
}

/// Every live thread's slot.
static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
/// Raised by shutdown while it empties the caches: calls go the shared way meanwhile.
static CLOSING: AtomicBool = AtomicBool::new(false);

/// This thread's slot, listed while the thread lives.
struct Handle(Arc<Slot>);

impl Handle {
    fn register() -> Self {
        let slot = Arc::new(Slot::default());
        SLOTS.lock().push(slot.clone());
        Self(slot)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The thread is exiting: what it cached is let go now, not at the next shutdown.
        self.0.cache.lock().clear();
        SLOTS.lock().retain(|s| !Arc::ptr_eq(s, &self.0));
    }
}

thread_local! {
    static SLOT: Handle = Handle::register();
}

/// Runs `f` on the pool of `device` × `stream` × `tag` (built on first use when `create`),
/// through this thread's cache, or the shared way while shutdown runs or after this thread's
/// locals are gone.
#[inline]
pub(crate) fn with_stream<T>(
    device: i32,
    stream: u64,
    tag: u32,
    create: bool,
    f: impl FnOnce(&StreamPool, &ThreadUsage) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut f = Some(f);
    let cached = SLOT.try_with(|h| {
        let mut cache = h.0.cache.lock();
        // Read under the slot's lock: shutdown raises the flag before it takes each slot's
        // lock, so this call either ends before shutdown goes on or sees the flag.
        if CLOSING.load(Ordering::Relaxed) {
            return None;
        }
        f.take().map(|f| cache.run(device, stream, tag, create, f))
    });
    if let Ok(Some(r)) = cached {
        return r;
    }
    match f {
        Some(f) => state::with_shared(device, stream, tag, create, f),
        None => Err(Failure::new(
            CupoolStatus::Internal,
            "a call was neither run through the thread's cache nor the shared way",
        )),
    }
}

/// Closes the library: refused while blocks are live. No allocation or free runs meanwhile
/// (see the module's text), and every thread's cache is emptied, so the pools, and the memory
/// they cache, go back now, not at each thread's next call.
pub(crate) fn shutdown() -> Result<(), Failure> {
    let admin = state::admin();
    if state::current().is_none() {
        return Ok(());
    }
    let _quiet = quiesce();
    state::close(&admin)
}

/// Holds every cached call off until dropped (see the module's text).
struct Quiet(());

/// Raises the gate, waits for every call in flight through a thread's cache, and empties every
/// cache. Calls that start meanwhile go the shared way until the returned value is dropped.
fn quiesce() -> Quiet {
    CLOSING.store(true, Ordering::SeqCst);
    // A thread that registers after this snapshot took `SLOTS`' lock after the flag was
    // raised, so it sees the flag; its cache is empty anyway.
    let slots: Vec<Arc<Slot>> = SLOTS.lock().clone();
    for s in slots {
        // Taken after the call in flight, if any, ended; dropped at once.
        let old = std::mem::take(&mut *s.cache.lock());
        drop(old);
    }
    Quiet(())
}

impl Drop for Quiet {
    fn drop(&mut self) {
        CLOSING.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
pub(crate) fn threads_listed() -> usize {
    SLOTS.lock().len()
}

/// Whether this thread's cache is gone (its locals are being destroyed).
#[cfg(test)]
pub(crate) fn cache_gone() -> bool {
    SLOT.try_with(|_| ()).is_err()
}
