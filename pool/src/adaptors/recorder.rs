//! Records every allocation, free and phase of a pool as a trace that can be replayed.
//!
//! The trace is the JSON-lines format `repro-prefill replay` reads, one event a line:
//! `{"op":"alloc","id":7,"size":1048576,"stream":0}`, `{"op":"free","id":7}`,
//! `{"op":"phase_begin","name":"ubatch 3"}`, `{"op":"phase_end","name":"ubatch 3","prefill":true}`,
//! `{"op":"sync"}`. Ids number allocations in order; failed allocations are not recorded. An
//! allocation made under a [`label`](super::label) carries it as `"name"`. libcupool adds
//! `{"op":"keep","stream":0,"sizes":[...]}` before a prefill phase ends: the requests its `auto`
//! purge kept buffers for, or `{"op":"keep","stream":0,"all":true}` where it kept everything (the
//! device had room), so that a replay purges as the run did.

use crate::block::Block;
use crate::driver::DevicePtr;
use crate::error::{FreeError, PoolError};
use crate::pool::Pool;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// One traced event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A successful allocation.
    Alloc {
        /// Sequence number of the allocation.
        id: u64,
        /// Bytes asked for.
        size: usize,
        /// The stream whose pool served it.
        stream: u64,
        /// What was allocated, where the caller said ([`label`](super::label)).
        name: Option<String>,
    },
    /// The requests a purge at the end of the open phase keeps cached buffers for, on one
    /// stream's pool (libcupool's `auto` purge decides them from the phase that ends).
    Keep {
        /// The stream.
        stream: u64,
        /// Request sizes, as `Purge::KeepFor` takes them; `None`: everything stays (no purge).
        sizes: Option<Vec<usize>>,
    },
    /// A free of allocation `id`.
    Free {
        /// The allocation's id.
        id: u64,
    },
    /// A phase opened.
    PhaseBegin {
        /// Its name.
        name: String,
    },
    /// A phase closed.
    PhaseEnd {
        /// Its name.
        name: String,
        /// Whether it was a prefill ubatch (a purge boundary).
        prefill: bool,
    },
    /// The device was synchronized.
    Sync,
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl TraceEvent {
    /// The event as one JSON line (no newline).
    pub fn to_json(&self) -> String {
        match self {
            TraceEvent::Alloc {
                id,
                size,
                stream,
                name: None,
            } => format!(r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream}}}"#),
            TraceEvent::Alloc {
                id,
                size,
                stream,
                name: Some(name),
            } => format!(
                r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream},"name":{}}}"#,
                json_str(name)
            ),
            TraceEvent::Keep {
                stream,
                sizes: Some(sizes),
            } => {
                let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
                format!(
                    r#"{{"op":"keep","stream":{stream},"sizes":[{}]}}"#,
                    list.join(",")
                )
            }
            TraceEvent::Keep {
                stream,
                sizes: None,
            } => format!(r#"{{"op":"keep","stream":{stream},"all":true}}"#),
            TraceEvent::Free { id } => format!(r#"{{"op":"free","id":{id}}}"#),
            TraceEvent::PhaseBegin { name } => {
                format!(r#"{{"op":"phase_begin","name":{}}}"#, json_str(name))
            }
            TraceEvent::PhaseEnd { name, prefill } => {
                format!(
                    r#"{{"op":"phase_end","name":{},"prefill":{prefill}}}"#,
                    json_str(name)
                )
            }
            TraceEvent::Sync => r#"{"op":"sync"}"#.to_string(),
        }
    }
}

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
            name: super::label::current().map(str::to_owned),
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
