//! Records every allocation, free and phase of a pool as a trace that can be replayed.
//!
//! The format is the module's (see [`super`]). Ids number allocations in order; failed
//! allocations are not recorded. An allocation made under a [`label`](crate::adaptors::label)
//! carries it as `"name"`.

use super::TraceEvent;
use crate::block::Block;
use crate::driver::DevicePtr;
use crate::error::{FreeError, PoolError};
use crate::pool::Pool;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Default)]
struct Log {
    events: Vec<TraceEvent>,
    ids: HashMap<DevicePtr, u64>,
    next: u64,
    open_phase: Option<String>,
}

/// A pool that records what passes through it.
#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn Pool>,
    stream: u64,
    log: Mutex<Log>,
}

impl Recorder {
    /// Records the traffic of `inner`, the pool of `stream`.
    pub fn new(inner: Arc<dyn Pool>, stream: u64) -> Self {
        Self {
            inner,
            stream,
            log: Mutex::new(Log::default()),
        }
    }

    /// The events so far.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.log.lock().events.clone()
    }

    /// Records a device synchronize.
    pub fn record_sync(&self) {
        self.log.lock().events.push(TraceEvent::Sync);
    }

    /// Records what an `auto` purge at the end of the open phase keeps cached buffers for
    /// (`None`: everything stays), so a replay purges as the run did.
    pub fn record_keep(&self, sizes: Option<Vec<usize>>) {
        let stream = self.stream;
        self.log
            .lock()
            .events
            .push(TraceEvent::Keep { stream, sizes });
    }

    /// Records that a phase named `name` opened.
    pub fn record_phase_begin(&self, name: &str) {
        let mut log = self.log.lock();
        log.open_phase = Some(name.to_owned());
        log.events.push(TraceEvent::PhaseBegin {
            name: name.to_owned(),
        });
    }

    /// Records that the open phase closed, marking whether it was a prefill ubatch.
    pub fn record_phase_end(&self, prefill: bool) {
        let mut log = self.log.lock();
        if let Some(name) = log.open_phase.take() {
            log.events.push(TraceEvent::PhaseEnd { name, prefill });
        }
    }

    /// The whole trace as JSON lines.
    pub fn to_jsonl(&self) -> String {
        let log = self.log.lock();
        let mut out = String::new();
        for e in &log.events {
            out.push_str(&e.to_json());
            out.push('\n');
        }
        out
    }
}

impl Pool for Recorder {
    forward_identity!(inner);
    forward_accounting!(inner);

    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let block = self.inner.alloc(bytes)?;
        let mut log = self.log.lock();
        let id = log.next;
        log.next += 1;
        log.ids.insert(block.ptr(), id);
        log.events.push(TraceEvent::Alloc {
            id,
            size: bytes,
            stream: self.stream,
            name: crate::adaptors::label::current().map(str::to_owned),
        });
        Ok(block)
    }

    fn free(&self, block: Block) -> Result<(), FreeError> {
        let ptr = block.ptr();
        self.inner.free(block)?;
        let mut log = self.log.lock();
        if let Some(id) = log.ids.remove(&ptr) {
            log.events.push(TraceEvent::Free { id });
        }
        Ok(())
    }
}
