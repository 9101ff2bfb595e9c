//! Recording every allocation and free that passes through the library as a trace
//! (`repro-prefill replay` reads it), process-wide: all devices and streams in one file.
//!
//! The trace is the JSON-lines format of the pool's `Recorder`. Each (device, stream) pair
//! becomes a stream number of its own, in the order they first allocate, so a replay builds one
//! pool per pair as the library did. While nothing records, the hot path pays one relaxed
//! atomic load.

use crate::status::{CupoolStatus, Failure};
use cupool_pool::trace::TraceEvent;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};

struct Recording {
    out: BufWriter<File>,
    path: String,
    next: u64,
    /// (device, address) → allocation id, for the blocks allocated while recording.
    ids: HashMap<(usize, u64), u64>,
    /// (device, stream) → stream number in the trace.
    streams: HashMap<(usize, u64), u64>,
    open_phase: Option<String>,
    /// The first write error; the recording stops writing and `stop` reports it.
    error: Option<std::io::Error>,
}

impl Recording {
    fn write(&mut self, e: &TraceEvent) {
        if self.error.is_none() {
            if let Err(err) = writeln!(self.out, "{}", e.to_json()) {
                tracing::error!(path = %self.path, error = %err, "writing the trace failed; it stops here");
                self.error = Some(err);
            }
        }
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static RECORDING: Mutex<Option<Recording>> = Mutex::new(None);

/// Starts writing a trace to `path` (created or truncated).
pub(crate) fn start(path: &str) -> Result<(), Failure> {
    let mut r = RECORDING.lock();
    if let Some(open) = r.as_ref() {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!(
                "a trace is already being recorded to {}: stop it first",
                open.path
            ),
        ));
    }
    let file = File::create(path).map_err(|e| {
        Failure::new(
            CupoolStatus::InvalidArgument,
            format!("cannot create the trace file {path}: {e}"),
        )
    })?;
    let mut rec = Recording {
        out: BufWriter::new(file),
        path: path.to_owned(),
        next: 0,
        ids: HashMap::new(),
        streams: HashMap::new(),
        open_phase: None,
        error: None,
    };
    if let Err(e) = writeln!(
        rec.out,
        "# cupool trace: one event a line; each (device, stream) pair is a stream of its own"
    ) {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("cannot write the trace file {path}: {e}"),
        ));
    }
    *r = Some(rec);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// Stops recording and flushes the file. Returns the number of allocations recorded.
pub(crate) fn stop() -> Result<u64, Failure> {
    let mut r = RECORDING.lock();
    ACTIVE.store(false, Ordering::Release);
    let Some(mut rec) = r.take() else {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            "no trace is being recorded: start one with cupool_record_start",
        ));
    };
    if let Some(name) = rec.open_phase.take() {
        rec.write(&TraceEvent::PhaseEnd {
            name,
            prefill: false,
        });
    }
    let flushed = rec.out.flush();
    match rec.error.take().map_or(flushed, Err) {
        Ok(()) => Ok(rec.next),
        Err(e) => Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("writing the trace {} failed: {e}", rec.path),
        )),
    }
}

#[inline]
fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Records an allocation named `name` if the caller gave one (no-op unless recording).
#[inline]
pub(crate) fn alloc(device: usize, stream: u64, ptr: u64, size: usize, name: Option<&str>) {
    if active() {
        alloc_slow(device, stream, ptr, size, name);
    }
}

impl Recording {
    /// The trace's number for `device` × `stream`.
    fn stream_number(&mut self, device: usize, stream: u64) -> u64 {
        let n = self.streams.len() as u64;
        *self.streams.entry((device, stream)).or_insert(n)
    }
}

#[cold]
fn alloc_slow(device: usize, stream: u64, ptr: u64, size: usize, name: Option<&str>) {
    let mut g = RECORDING.lock();
    let Some(r) = g.as_mut() else { return };
    let stream = r.stream_number(device, stream);
    let id = r.next;
    r.next += 1;
    r.ids.insert((device, ptr), id);
    r.write(&TraceEvent::Alloc {
        id,
        size,
        stream,
        name: name.map(str::to_owned),
    });
}

/// Records the requests an `auto` purge keeps buffers for on `device` × `stream` (`None`: it
/// kept everything).
pub(crate) fn keep(device: usize, stream: u64, sizes: Option<&[usize]>) {
    if active() {
        if let Some(r) = RECORDING.lock().as_mut() {
            let stream = r.stream_number(device, stream);
            r.write(&TraceEvent::Keep {
                stream,
                sizes: sizes.map(<[usize]>::to_vec),
            });
        }
    }
}

/// Records a free (no-op unless recording, or for a block allocated before it started).
#[inline]
pub(crate) fn free(device: usize, ptr: u64) {
    if active() {
        free_slow(device, ptr);
    }
}

#[cold]
fn free_slow(device: usize, ptr: u64) {
    let mut g = RECORDING.lock();
    let Some(r) = g.as_mut() else { return };
    if let Some(id) = r.ids.remove(&(device, ptr)) {
        r.write(&TraceEvent::Free { id });
    }
}

/// Records a device synchronize (a purge or trim ran).
pub(crate) fn sync() {
    if active() {
        if let Some(r) = RECORDING.lock().as_mut() {
            r.write(&TraceEvent::Sync);
        }
    }
}

/// Opens a phase named `name` in the trace, closing an open one first.
pub(crate) fn phase_begin(name: &str) {
    if !active() {
        return;
    }
    if let Some(r) = RECORDING.lock().as_mut() {
        if let Some(name) = r.open_phase.take() {
            r.write(&TraceEvent::PhaseEnd {
                name,
                prefill: false,
            });
        }
        r.open_phase = Some(name.to_owned());
        r.write(&TraceEvent::PhaseBegin {
            name: name.to_owned(),
        });
    }
}

/// Ends prefill ubatch `n` in the trace: closes the open phase as a purge boundary (one named
/// after the ubatch when none is open: the replay purges at every boundary the library did), and
/// opens the next ubatch's.
pub(crate) fn ubatch_boundary(n: u64) {
    if !active() {
        return;
    }
    if let Some(r) = RECORDING.lock().as_mut() {
        let name = r.open_phase.take().unwrap_or_else(|| format!("ubatch {n}"));
        r.write(&TraceEvent::PhaseEnd {
            name,
            prefill: true,
        });
        let next = format!("ubatch {}", n + 1);
        r.write(&TraceEvent::PhaseBegin { name: next.clone() });
        r.open_phase = Some(next);
    }
}

/// Closes the open phase; `prefill` marks it a purge boundary for the replay.
pub(crate) fn phase_end(prefill: bool) {
    if !active() {
        return;
    }
    if let Some(r) = RECORDING.lock().as_mut() {
        if let Some(name) = r.open_phase.take() {
            r.write(&TraceEvent::PhaseEnd { name, prefill });
        }
    }
}
