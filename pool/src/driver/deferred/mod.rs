//! Moving page mappings off the allocating thread.
//!
//! Page recycling ([`crate::upstream::vmm`]) maps a free page's memory a second time where a
//! block lands ([`Driver::alias`]) and later drops the old mapping ([`Driver::unalias`]).
//! Each call costs the calling thread 35-57 µs inside a prefill (data/h100-2026-11-27-*); a
//! framework that launches its kernels from one Python thread waits that long each time, with
//! the GPU draining its queue meanwhile. Measured beside kernel launches, the same calls made
//! by another thread cost the launching thread about a tenth of that
//! (data/h100-2026-11-27-vmm-contention).
//!
//! So this driver queues those two calls to one worker thread per device, in order, and
//! returns at once. What the pool's bookkeeping says is then ahead of the device's mappings by
//! the queue, and two things keep that safe:
//!
//! - **The device waits, not the host.** A block whose memory may still be in the queue is
//!   handed out with a wait queued on the allocating stream ([`Driver::fence`]: cuStreamWaitValue32
//!   on a word in host memory that the worker advances after each call): kernels queued after
//!   the allocation run once its memory is mapped. That is cudaMallocAsync's contract: the
//!   memory is usable in the allocating stream's order, and another stream uses it after
//!   waiting for that one (an event), which orders it after the wait too. A stream being
//!   captured into a graph, or a device whose streams cannot wait on memory, makes the host
//!   wait for the queue instead.
//! - **The queue keeps the device a prefix of the bookkeeping.** Calls that depend on a queued
//!   one (mapping new memory where an old mapping is still to be dropped, releasing a page,
//!   a synchronize, copies, freeing address space) wait for the queue first, so the device
//!   sees every call in the order the pool made them.
//!
//! A queued call that fails (or panics) is logged and remembered: every later fence, map and
//! queued call on the device returns that error, so allocations fail instead of handing out
//! memory behind which nothing is mapped (without this driver a refused move makes the pool
//! create memory instead; here the device's pools are done with). Kernels already queued behind
//! a wait for it would fault.
//!
//! The `stream` a fence is given must be a `CUstream` of the device (or 0): libcupool's C
//! callers pass theirs; its ggml shim, whose streams are indices, turns this driver off.

mod queue;

use super::forward::Forward;
use super::{DevicePtr, Driver, DriverError, PhysHandle, WaitWord};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// See the module docs: `DeferredDriver::new(inner)` wraps `inner`, whose alias and unalias
/// calls must work (a CUDA device, the simulated one).
#[derive(Debug)]
pub struct DeferredDriver {
    shared: Arc<Shared>,
    worker: Mutex<Worker>,
    /// Fences that queued a wait on their stream, those that waited on the host, and the
    /// nanoseconds the latter waited.
    stream_waits: AtomicU64,
    host_waits: AtomicU64,
    host_wait_ns: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    inner: Arc<dyn Driver>,
    queue: Mutex<Queue>,
    /// The worker waits here for calls.
    work: Condvar,
    /// Callers that wait for the queue wait here.
    idle: Condvar,
    /// Number of the last call queued and of the last done, wrapping: read without the lock by
    /// [`Driver::fence`]'s common case, written under it.
    queued: AtomicU32,
    done: AtomicU32,
    /// Set, before `done` moves past it, when a queued call failed (`Queue::failed` says how):
    /// read without the lock by every call that could hand out memory.
    failed: AtomicBool,
    /// The word streams wait on (`None`: they cannot), made at the first fence that needs it
    /// on a stream not being captured.
    word: OnceLock<Option<WaitWord>>,
}

#[derive(Debug, Default)]
struct Queue {
    calls: VecDeque<(u32, Call)>,
    /// Old mappings whose drop is queued, address → (bytes, drops queued there): memory
    /// mapped there must wait.
    dropping: BTreeMap<DevicePtr, (usize, u32)>,
    /// The first queued call that failed.
    failed: Option<DriverError>,
    stop: bool,
}

/// The worker thread, started by the first call queued.
#[derive(Debug)]
enum Worker {
    NotYet,
    Running(JoinHandle<()>),
    /// No thread could be had: every call is made on the calling thread.
    None,
}

#[derive(Clone, Copy, Debug)]
enum Call {
    Alias {
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    },
    Unalias {
        at: DevicePtr,
        bytes: usize,
    },
}

impl DeferredDriver {
    /// `inner`, with its alias and unalias calls made by a worker thread.
    pub fn new(inner: Arc<dyn Driver>) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                queue: Mutex::new(Queue::default()),
                work: Condvar::new(),
                idle: Condvar::new(),
                queued: AtomicU32::new(0),
                done: AtomicU32::new(0),
                failed: AtomicBool::new(false),
                word: OnceLock::new(),
            }),
            worker: Mutex::new(Worker::NotYet),
            stream_waits: AtomicU64::new(0),
            host_waits: AtomicU64::new(0),
            host_wait_ns: AtomicU64::new(0),
        }
    }

    /// Fences so far that had calls to wait for: (those whose stream waits on the device,
    /// those that waited on the host).
    pub fn waits(&self) -> (u64, u64) {
        (
            self.stream_waits.load(Ordering::Relaxed),
            self.host_waits.load(Ordering::Relaxed),
        )
    }

    /// Nanoseconds fences waited on the host so far.
    pub fn host_wait_nanos(&self) -> u64 {
        self.host_wait_ns.load(Ordering::Relaxed)
    }

    /// Calls queued and not yet done.
    pub fn pending(&self) -> u32 {
        let s = &self.shared;
        s.queued
            .load(Ordering::Acquire)
            .wrapping_sub(s.done.load(Ordering::Acquire))
    }
}

impl Drop for DeferredDriver {
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.work.notify_all();
        if let Worker::Running(h) = std::mem::replace(&mut *self.worker.lock(), Worker::None) {
            // The worker makes the calls left, then returns.
            let _ = h.join();
        }
        // A stream may still be waiting on the word: let it pass before the word is freed.
        if let Some(Some(_)) = self.shared.word.get() {
            if let Err(e) = self.shared.inner.synchronize_device() {
                tracing::warn!(error = %e, "could not synchronize before freeing the word streams wait on");
            }
        }
    }
}

impl Forward for DeferredDriver {
    fn inner(&self) -> &dyn Driver {
        self.shared.inner.as_ref()
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.failure()?;
        if self.dropping_in(at, bytes) {
            self.drain()?;
        }
        self.shared.inner.map(at, bytes)
    }

    fn unmap(&self, at: DevicePtr, bytes: usize, handle: PhysHandle) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.unmap(at, bytes, handle)
    }

    fn alias(
        &self,
        from: DevicePtr,
        to: DevicePtr,
        bytes: usize,
        handle: PhysHandle,
    ) -> Result<(), DriverError> {
        self.enqueue(Call::Alias {
            from,
            to,
            bytes,
            handle,
        })
    }

    fn unalias(&self, at: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.enqueue(Call::Unalias { at, bytes })
    }

    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.release_reservation(base, bytes)
    }

    fn poison(&self, ptr: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.poison(ptr, bytes)
    }

    fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.copy_to_host(src, dst)
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.copy_from_host(dst, src)
    }

    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.drain()?;
        self.shared.inner.synchronize_device()
    }

    fn fence(&self, stream: u64) -> Result<(), DriverError> {
        let s = &self.shared;
        // A failed call counts even once it is done: its memory is not mapped.
        self.failure()?;
        let target = s.queued.load(Ordering::Acquire);
        if s.done.load(Ordering::Acquire) == target {
            return s.inner.fence(stream);
        }
        // A wait queued on a stream being captured would be part of every replay (and making
        // the word may be refused there): the host waits instead.
        let capturing = s.inner.stream_capturing(stream).unwrap_or_else(|e| {
            tracing::debug!(error = %e, stream, "could not ask whether the stream is being captured; the host waits for page mappings");
            true
        });
        let word = if capturing {
            None
        } else {
            let _q = s.queue.lock();
            // Made under the queue's lock, so the worker's next write follows this one.
            s.word
                .get_or_init(|| {
                    let w = s.inner.wait_word().unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "no word for streams to wait on; allocations wait on the host for page mappings");
                        None
                    });
                    if let Some(w) = &w {
                        w.set(s.done.load(Ordering::Acquire));
                    }
                    w
                })
                .as_ref()
        };
        let waited = match word.map(|w| s.inner.stream_wait(stream, w, target)) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                tracing::debug!(error = %e, stream, "could not queue a wait for page mappings on the stream; the host waits instead");
                false
            }
            None => false,
        };
        if waited {
            self.stream_waits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.host_waits.fetch_add(1, Ordering::Relaxed);
            let t = std::time::Instant::now();
            let drained = self.drain();
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.host_wait_ns.fetch_add(ns, Ordering::Relaxed);
            drained?;
        }
        self.failure()?;
        s.inner.fence(stream)
    }
}
