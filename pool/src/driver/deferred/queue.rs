//! The queue of [`super::DeferredDriver`]: queuing a call, waiting for the calls queued so far,
//! and the worker that makes them in order.

use super::{Call, DeferredDriver, Shared, Worker};
use crate::driver::{CallKind, DevicePtr, DriverError, ErrorCode};
use std::sync::atomic::Ordering;

impl DeferredDriver {
    /// Queues `call`, starting the worker on first use; refused once a queued call failed.
    pub(super) fn enqueue(&self, call: Call) -> Result<(), DriverError> {
        let s = &self.shared;
        let mut q = s.queue.lock();
        if let Some(e) = &q.failed {
            return Err(e.clone());
        }
        let mut worker = self.worker.lock();
        if matches!(*worker, Worker::NotYet) {
            let shared = s.clone();
            let name = format!("cupool-map-{}", s.inner.ordinal());
            *worker = match std::thread::Builder::new()
                .name(name)
                .spawn(move || shared.run())
            {
                Ok(h) => Worker::Running(h),
                Err(e) => {
                    tracing::warn!(error = %e, "no worker thread for page mappings; they are made on the allocating thread");
                    Worker::None
                }
            };
        }
        if matches!(*worker, Worker::None) {
            // In order: nothing was ever queued.
            drop((worker, q));
            return s.call(call);
        }
        let n = s.queued.load(Ordering::Relaxed).wrapping_add(1);
        if let Call::Unalias { at, bytes } = call {
            q.dropping.entry(at).or_insert((bytes, 0)).1 += 1;
        }
        q.calls.push_back((n, call));
        s.queued.store(n, Ordering::Release);
        s.work.notify_one();
        Ok(())
    }

    /// The failure of a queued call, if one failed.
    pub(super) fn failure(&self) -> Result<(), DriverError> {
        let s = &self.shared;
        if !s.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        match &s.queue.lock().failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Waits until every call queued so far is done; the first queued failure, if any.
    pub(super) fn drain(&self) -> Result<(), DriverError> {
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
    pub(super) fn dropping_in(&self, at: DevicePtr, bytes: usize) -> bool {
        let q = self.shared.queue.lock();
        let end = at.saturating_add(bytes as u64);
        // The queue is short (drops wait for a synchronize, which drains it): all of them.
        q.dropping
            .range(..end)
            .any(|(&a, &(len, _))| a.saturating_add(len as u64) > at)
    }
}

impl Shared {
    pub(super) fn call(&self, call: Call) -> Result<(), DriverError> {
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
    pub(super) fn run(&self) {
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
            // A panic below is a failure like any other: callers waiting for `done` must not
            // wait for ever.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call(call)))
                .unwrap_or_else(|_| {
                    Err(DriverError::new(
                        CallKind::Map,
                        ErrorCode::InvalidValue,
                        format!("the driver panicked making a queued page mapping ({call:?})"),
                    ))
                });
            let mut q = self.queue.lock();
            if let Err(e) = r {
                tracing::error!(error = %e, ?call, "a queued page mapping failed; the device's pools refuse every call from now on, and kernels using that memory will fault");
                q.failed.get_or_insert(e);
                self.failed.store(true, Ordering::Release);
            }
            if let Call::Unalias { at, .. } = call {
                if let Some(d) = q.dropping.get_mut(&at) {
                    d.1 -= 1;
                    if d.1 == 0 {
                        q.dropping.remove(&at);
                    }
                }
            }
            self.done.store(n, Ordering::Release);
            if let Some(Some(w)) = self.word.get() {
                w.set(n);
            }
            self.idle.notify_all();
        }
    }
}
