//! Memory mapped ahead of need, off the allocating thread.
//!
//! A page created on the allocating thread costs it about 130 µs on an H100 (create, map and
//! grant access: data/h100-2026-11-27-vmm-contention), and a PyTorch prefill's allocating
//! thread is the Python thread that launches every kernel: Phi-3's lanes create a page for
//! almost every copy of its KV cache, 2,429 a prefill (data/h100-2026-11-27-phi3-speed). The
//! same calls on another thread cost the launching thread about a thirteenth of that.
//!
//! So where the placement can say what a block will need next ([`Placement::ahead`]: the
//! growth of the lanes whose blocks are replaced next), the pool asks for it early, and a
//! worker thread makes the pages. Until the pool takes a finished page in
//! ([`VmmReserve::take_ahead`]), its range is *in flight*: vacant to every check that hands
//! out memory ([`AddressSpace::backed`]), so nothing is handed out over it, and counted as
//! backed where the placement weighs where a block goes (`unbacked`), as it will be. Every
//! operation that unmaps, moves or releases pages waits for the worker first, and a block
//! that lands on a range in flight waits for it too: the pool's state is the one it would
//! have had with the pages made at once ([`Ahead::Inline`], what the replays and the
//! property tests use), whatever the timing. A page the worker could not make (out of
//! memory) is not retried: the range stays vacant and the block that lands there maps it, with
//! the error reported there.
//!
//! [`Placement::ahead`]: crate::placement::Placement::ahead
//! [`AddressSpace::backed`]: super::space::AddressSpace::backed

use super::VmmReserve;
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, PhysHandle};
use crate::stats::DriverCalls;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// Where pages asked for ahead of need are made (`CUPOOL_VMM_AHEAD`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ahead {
    /// Not ahead: a block's pages are made when it lands (the default).
    #[default]
    Off,
    /// On the thread that asks, at once: the same memory as [`Ahead::Worker`] with no thread
    /// (reproducible call order, for replays and tests).
    Inline,
    /// On a worker thread of the pool's, started at the first request.
    Worker,
}

impl Ahead {
    /// The variant a word names.
    pub fn from_word(word: &str) -> Option<Self> {
        match word.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Self::Off),
            "inline" => Some(Self::Inline),
            "worker" => Some(Self::Worker),
            _ => None,
        }
    }
}

/// A page the worker made, or could not.
struct Made {
    at: DevicePtr,
    len: usize,
    handle: Result<PhysHandle, DriverError>,
}

/// The worker's two ends.
struct Worker {
    jobs: Sender<(DevicePtr, usize)>,
    done: Receiver<Made>,
}

/// The pages asked for ahead that the pool has not taken in yet, and the worker making them.
#[derive(Default)]
pub(super) struct InFlight {
    worker: Option<Worker>,
    /// Ranges sent to the worker, not yet taken in: (start, length).
    ranges: Vec<(DevicePtr, usize)>,
    /// The worker could not start: pages are made inline from then on.
    no_thread: bool,
    /// The driver the worker uses; kept to give back what is left at the drop.
    driver: Option<Arc<dyn Driver>>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("ranges", &self.ranges)
            .field("worker", &self.worker.is_some())
            .finish()
    }
}

impl InFlight {
    /// Bytes of `[at, at+len)` in flight.
    pub(super) fn overlap(&self, at: DevicePtr, len: usize) -> usize {
        let end = at + len as u64;
        self.ranges
            .iter()
            .map(|&(s, l)| (end.min(s + l as u64).saturating_sub(at.max(s))) as usize)
            .sum()
    }

    /// Whether nothing is in flight.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether no worker runs and nothing is in flight: a copy of the reserve loses nothing.
    pub(super) fn is_idle(&self) -> bool {
        self.worker.is_none() && self.ranges.is_empty()
    }

    /// Sends a page to the worker (started here the first time); `false` if there is no
    /// worker to make it.
    fn send(&mut self, driver: &Arc<dyn Driver>, at: DevicePtr, len: usize) -> bool {
        if self.worker.is_none() && !self.no_thread {
            self.worker = spawn(driver.clone());
            self.no_thread = self.worker.is_none();
            self.driver = Some(driver.clone());
        }
        let Some(w) = &self.worker else {
            return false;
        };
        if w.jobs.send((at, len)).is_err() {
            // The worker is gone (it never exits by itself while the pool holds its end).
            self.worker = None;
            self.no_thread = true;
            return false;
        }
        self.ranges.push((at, len));
        true
    }

    /// The next page the worker finished: waiting for it with `wait`; `None` when nothing is
    /// in flight (or, without `wait`, nothing has finished).
    fn next(&mut self, wait: bool) -> Option<Made> {
        if self.ranges.is_empty() {
            return None;
        }
        let w = self.worker.as_ref()?;
        let made = if wait {
            w.done.recv().ok()
        } else {
            match w.done.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => None,
            }
        };
        match made {
            Some(m) => {
                if let Some(i) = self.ranges.iter().position(|&(s, _)| s == m.at) {
                    self.ranges.swap_remove(i);
                }
                Some(m)
            }
            None => {
                // The worker died mid-page (a panic in the driver): what it made is unknown,
                // so its ranges are left to the blocks that land there, whose map fails with
                // the driver's own error if memory is there after all.
                tracing::error!(
                    pages = self.ranges.len(),
                    "the vmm worker thread stopped; pages are made inline from now on"
                );
                self.ranges.clear();
                self.worker = None;
                self.no_thread = true;
                None
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Pages made for a pool that is gone were never placed: give them back.
        while let Some(m) = self.next(true) {
            if let (Ok(h), Some(d)) = (m.handle, &self.driver) {
                if let Err(e) = d.unmap(m.at, m.len, h) {
                    tracing::warn!(error = %e, "could not give back a page made ahead for a closed pool");
                }
            }
        }
    }
}

/// Starts the worker; `None` (logged) if the system has no thread for it.
fn spawn(driver: Arc<dyn Driver>) -> Option<Worker> {
    let (jobs, inbox) = mpsc::channel::<(DevicePtr, usize)>();
    let (outbox, done) = mpsc::channel::<Made>();
    let started = std::thread::Builder::new()
        .name("cupool-vmm-ahead".into())
        .spawn(move || {
            crate::driver::worker::mark_worker();
            // Ends when the pool drops its sender.
            while let Ok((at, len)) = inbox.recv() {
                let handle = driver.map(at, len);
                if let Err(back) = outbox.send(Made { at, len, handle }) {
                    // The pool is gone: nobody will place this page.
                    if let Ok(h) = back.0.handle {
                        let _ = driver.unmap(at, len, h);
                    }
                }
            }
        });
    match started {
        Ok(_) => Some(Worker { jobs, done }),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the vmm worker thread; pages asked for ahead are made inline");
            None
        }
    }
}

impl VmmReserve {
    /// Puts memory behind the vacant parts of `[addr, addr+len)` ahead of need (see the module
    /// docs): parts in flight already, or with old mappings of moved pages, are left as they
    /// are.
    pub(super) fn map_ahead(&mut self, addr: u64, len: usize, calls: &mut DriverCalls) {
        if self.config.ahead == Ahead::Off || !self.granular || self.granularity == 0 || len == 0 {
            return;
        }
        let gran = self.granularity as u64;
        let (from, to) = (
            addr / gran * gran,
            (addr + len as u64).next_multiple_of(gran),
        );
        let len = (to - from) as usize;
        // Most asks find their range backed or in flight already: answered in O(log n).
        if self.space.unbacked(from, len) == 0
            || self.in_flight.overlap(from, len) > 0
            || self.space.has_stale_in(from, to)
        {
            return;
        }
        for (s, e) in self.space.vacant_in(from, to) {
            let mut at = s;
            while at < e {
                let len = (self.page.max(self.granularity) as u64).min(e - at) as usize;
                let sent = self.config.ahead == Ahead::Worker
                    && self.in_flight.send(&self.driver, at, len);
                if !sent {
                    match self.driver.map(at, len) {
                        Ok(h) => {
                            calls.record(CallKind::Map);
                            self.space.place(at, len, h);
                        }
                        // As the worker does: the next pages are tried all the same.
                        Err(e) => tracing::debug!(error = %e, "could not map memory ahead of need"),
                    }
                }
                at += len as u64;
            }
        }
    }

    /// Takes in the pages the worker finished (all of them, waiting, with `wait`); whether any
    /// was placed.
    pub(super) fn take_ahead(&mut self, wait: bool, calls: &mut DriverCalls) -> bool {
        let mut placed = false;
        while let Some(m) = self.in_flight.next(wait) {
            match m.handle {
                Ok(h) => {
                    calls.record(CallKind::Map);
                    self.space.place(m.at, m.len, h);
                    placed = true;
                }
                Err(e) => {
                    tracing::debug!(error = %e, at = m.at, bytes = m.len, "the worker could not map memory ahead of need; the block that lands there will");
                }
            }
        }
        placed
    }

    /// Waits for every page in flight and takes it in: before anything unmaps, moves or
    /// releases pages.
    pub(super) fn settle_ahead(&mut self, calls: &mut DriverCalls) {
        if !self.in_flight.is_empty() {
            self.take_ahead(true, calls);
        }
    }
}
