//! The memory history behind `cupool_memory_history`: the last N allocator events of each device
//! in a ring, with the meaning of PyTorch's `torch.cuda.memory._record_memory_history` (its
//! `TraceEntry`: alloc, free requested and completed, segments allocated, freed, mapped and
//! unmapped, out of memory), for `cupool_memory_snapshot_json` to hand to PyTorch's viewers.
//!
//! While the history is off, the hot path pays one relaxed atomic load. While it is on, each
//! event takes one process-wide lock: a debugging aid, as PyTorch's own (which runs under its
//! allocator's lock).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// What an event did, with PyTorch's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// One event. Its frames, where the caller gave any: the name of `cupool_alloc_named` and the
/// tag in force (libcupool sees no Python or C++ stack).
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub action: Action,
    /// The address; for `Oom`, the bytes the device had free.
    pub addr: u64,
    pub size: usize,
    pub stream: u64,
    pub time_us: u64,
    pub name: Option<Arc<str>>,
    pub tag: u32,
}

struct Rings {
    max: usize,
    /// Per device, oldest first.
    devices: Vec<VecDeque<Entry>>,
}

static ON: AtomicBool = AtomicBool::new(false);
static RINGS: Mutex<Option<Rings>> = Mutex::new(None);

/// What a ring reserves up front at most: `max_entries` may be huge (PyTorch's default is no
/// bound), and a ring grows as events come.
const INITIAL: usize = 4096;

/// Starts keeping the last `max` events of each device, or, when on already, keeps the history
/// and bounds it to the last `max` from now on (PyTorch's meaning). `max` is at least 1.
pub(crate) fn start(max: usize) {
    let mut r = RINGS.lock();
    match r.as_mut() {
        Some(rings) => {
            rings.max = max;
            for ring in &mut rings.devices {
                let over = ring.len().saturating_sub(max);
                ring.drain(..over);
            }
        }
        None => {
            *r = Some(Rings {
                max,
                devices: Vec::new(),
            })
        }
    }
    ON.store(true, Ordering::Release);
    tracing::info!(max_entries = max, "memory history on");
}

/// Stops and forgets the history, as PyTorch does when it is turned off.
pub(crate) fn stop() {
    let mut r = RINGS.lock();
    ON.store(false, Ordering::Release);
    if r.take().is_some() {
        tracing::info!("memory history off");
    }
}

#[inline]
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The events kept for `device`, oldest first (none while off).
pub(crate) fn entries(device: usize) -> Vec<Entry> {
    RINGS
        .lock()
        .as_ref()
        .and_then(|r| r.devices.get(device))
        .map(|ring| ring.iter().cloned().collect())
        .unwrap_or_default()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Adds `entries` to `device`'s ring in one step (a free's two events stay side by side, as
/// PyTorch's viewer expects).
fn push(device: usize, entries: &[Entry]) {
    let mut g = RINGS.lock();
    let Some(r) = g.as_mut() else { return };
    if r.devices.len() <= device {
        r.devices.resize_with(device + 1, VecDeque::new);
    }
    let max = r.max;
    let ring = &mut r.devices[device];
    if ring.capacity() == 0 {
        ring.reserve(max.min(INITIAL));
    }
    for e in entries {
        if ring.len() >= max {
            ring.pop_front();
        }
        ring.push_back(e.clone());
    }
}

fn entry(action: Action, addr: u64, size: usize, stream: u64) -> Entry {
    Entry {
        action,
        addr,
        size,
        stream,
        time_us: now_us(),
        name: None,
        tag: 0,
    }
}

/// An allocation of `size` bytes (the size asked for) at `ptr`, named `name` if the caller gave
/// one.
#[inline]
pub(crate) fn alloc(device: usize, stream: u64, ptr: u64, size: usize, name: Option<&str>) {
    if on() {
        alloc_slow(device, stream, ptr, size, name);
    }
}

#[cold]
fn alloc_slow(device: usize, stream: u64, ptr: u64, size: usize, name: Option<&str>) {
    let mut e = entry(Action::Alloc, ptr, size, stream);
    e.name = name.map(Arc::from);
    e.tag = crate::tags::current();
    push(device, &[e]);
}

/// A free of the block at `ptr`, allocated with `size` bytes: its memory is reusable at once
/// (in stream order), so the request and its completion are one moment.
#[inline]
pub(crate) fn free(device: usize, stream: u64, ptr: u64, size: usize) {
    if on() {
        free_slow(device, stream, ptr, size);
    }
}

#[cold]
fn free_slow(device: usize, stream: u64, ptr: u64, size: usize) {
    let requested = entry(Action::FreeRequested, ptr, size, stream);
    let completed = Entry {
        action: Action::FreeCompleted,
        ..requested.clone()
    };
    push(device, &[requested, completed]);
}

/// A driver call that gave memory to a pool or took it back (`segments.rs`).
pub(crate) fn segment(
    device: usize,
    action: Action,
    addr: u64,
    size: usize,
    stream: u64,
    tag: u32,
) {
    if on() {
        let mut e = entry(action, addr, size, stream);
        e.tag = tag;
        push(device, &[e]);
    }
}

/// An allocation of `size` bytes that failed for lack of memory; `device_free` is what the
/// device reported free.
pub(crate) fn oom(device: usize, stream: u64, size: usize, device_free: usize) {
    if on() {
        push(
            device,
            &[entry(Action::Oom, device_free as u64, size, stream)],
        );
    }
}
