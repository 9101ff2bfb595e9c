//! Moving page mappings off the allocating thread.
//!
//! Page recycling ([`crate::upstream::vmm`]) maps a free page's memory a second time where a
//! block lands ([`Driver::alias`]) and later drops the old mapping ([`Driver::unalias`]).
//! Each call costs the calling thread 35-60 µs inside a prefill (data/h100-2026-11-27-*); a
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
//! A queued call that fails is logged and remembered: every later call on the device returns
//! that error, so allocations fail instead of handing out memory behind which nothing is
//! mapped. Kernels already queued behind it would fault; the driver refuses a second mapping
//! of memory it holds only when out of resources, which the pool's own creates hit first.

use super::forward::Forward;
use super::{DevicePtr, Driver, DriverError, PhysHandle, WaitWord};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// See the module docs: `DeferredDriver::new(inner)` wraps `inner`, whose alias and unalias
/// calls must work (a CUDA device, the simulated one).
#[derive(Debug)]
pub struct DeferredDriver {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Fences that queued a wait on their stream, and those that waited on the host.
    stream_waits: AtomicU64,
    host_waits: AtomicU64,
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
    /// The word streams wait on (`None`: they cannot), made at the first fence that needs it.
    word: OnceLock<Option<WaitWord>>,
}

#[derive(Debug, Default)]
struct Queue {
    calls: VecDeque<(u32, Call)>,
    /// Old mappings whose drop is queued, address → bytes: memory mapped there must wait.
    dropping: BTreeMap<DevicePtr, usize>,
    /// The first queued call that failed.
    failed: Option<DriverError>,
    stop: bool,
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
                word: OnceLock::new(),
            }),
            worker: Mutex::new(None),
            stream_waits: AtomicU64::new(0),
            host_waits: AtomicU64::new(0),
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

    /// Calls queued and not yet done.
    pub fn pending(&self) -> u32 {
        let s = &self.shared;
        s.queued
            .load(Ordering::Acquire)
            .wrapping_sub(s.done.load(Ordering::Acquire))
    }

    /// Queues `call`, starting the worker on first use; refused once a queued call failed.
    fn enqueue(&self, call: Call) -> Result<(), DriverError> {
        let s = &self.shared;
        let mut q = s.queue.lock();
        if let Some(e) = &q.failed {
            return Err(e.clone());
        }
        let mut worker = self.worker.lock();
        if worker.is_none() {
            let shared = s.clone();
            let name = format!("cupool-map-{}", s.inner.ordinal());
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || shared.run())
            {
                Ok(h) => *worker = Some(h),
                // No thread to be had: make the call here, as without this driver.
                Err(e) => {
                    tracing::debug!(error = %e, "no worker thread for page mappings; mapping on the calling thread");
                    drop(q);
                    return s.call(call);
                }
            }
        }
        let n = s.queued.load(Ordering::Relaxed).wrapping_add(1);
        if let Call::Unalias { at, bytes } = call {
            q.dropping.insert(at, bytes);
        }
        q.calls.push_back((n, call));
        s.queued.store(n, Ordering::Release);
        s.work.notify_one();
        Ok(())
    }

    /// Waits until every call queued so far is done; the first queued failure, if any.
    fn drain(&self) -> Result<(), DriverError> {
        let s = &self.shared;
        let mut q = s.queue.lock();
        let target = s.queued.load(Ordering::Acquire);
        // Cyclic: calls queued after ours may be done too.
        while (s.done.load(Ordering::Acquire).wrapping_sub(target) as i32) < 0 {
            s.idle.wait(&mut q);
        }
        match &q.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether an old mapping whose drop is queued overlaps `[at, at + bytes)`.
    fn dropping_in(&self, at: DevicePtr, bytes: usize) -> bool {
        let q = self.shared.queue.lock();
        let end = at + bytes as u64;
        q.dropping
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &len)| a + len as u64 > at)
    }
}

impl Shared {
    fn call(&self, call: Call) -> Result<(), DriverError> {
        match call {
            Call::Alias {
                from,
                to,
                bytes,
                handle,
            } => self.inner.alias(from, to, bytes, handle),
            Call::Unalias { at, bytes } => self.inner.unalias(at, bytes),
        }
    }

    /// The worker: makes the queued calls in order until told to stop with none left.
    fn run(&self) {
        loop {
            let (n, call) = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(next) = q.calls.pop_front() {
                        break next;
                    }
                    if q.stop {
                        return;
                    }
                    self.work.wait(&mut q);
                }
            };
            // One retry: a refusal for want of resources may pass once earlier calls are done.
            let r = self.call(call).or_else(|_| self.call(call));
            let mut q = self.queue.lock();
            if let Err(e) = r {
                tracing::error!(error = %e, ?call, "a queued page mapping failed; the device's pools refuse every call from now on, and kernels using that memory will fault");
                q.failed.get_or_insert(e);
            }
            if let Call::Unalias { at, .. } = call {
                q.dropping.remove(&at);
            }
            self.done.store(n, Ordering::Release);
            if let Some(Some(w)) = self.word.get() {
                w.set(n);
            }
            self.idle.notify_all();
        }
    }
}

impl Drop for DeferredDriver {
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.work.notify_all();
        if let Some(h) = self.worker.lock().take() {
            // The worker makes the calls left, then returns.
            let _ = h.join();
        }
    }
}

impl Forward for DeferredDriver {
    fn inner(&self) -> &dyn Driver {
        self.shared.inner.as_ref()
    }

    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
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
        let target = s.queued.load(Ordering::Acquire);
        if s.done.load(Ordering::Acquire) == target {
            return s.inner.fence(stream);
        }
        let word = {
            let q = s.queue.lock();
            if let Some(e) = &q.failed {
                return Err(e.clone());
            }
            // Made under the queue's lock, so the worker's next write follows this one.
            s.word
                .get_or_init(|| {
                    let w = s.inner.wait_word().unwrap_or_else(|e| {
                        tracing::debug!(error = %e, "no word for streams to wait on; the host waits for page mappings instead");
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
            Some(Ok(queued)) => queued,
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
            self.drain()?;
        }
        s.inner.fence(stream)
    }
}
