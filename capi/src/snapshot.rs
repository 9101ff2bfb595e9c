//! The memory snapshot as JSON, in the format of PyTorch's `torch.cuda.memory._snapshot()`
//! (`{"segments": [...], "device_traces": [[...] per device]}`), so that PyTorch's viewers
//! (pytorch.org/memory_viz, `torch.cuda._memory_viz`) read it once the Python package pickles it.
//!
//! A segment is a range the device's pools hold from the driver (`segments.rs`); its blocks
//! tile it exactly, as PyTorch's do: the live blocks (`active_allocated`, their usable size and
//! the size asked for) and the gaps between them (`inactive`: cached, or held in a thread's bins
//! for reuse). The traces are the memory history (`history.rs`), empty while it is off.
//!
//! The history is read first, then the segments, then the blocks: PyTorch's viewer replays the
//! history backwards from the segments and blocks, so what the state shows may be newer than
//! the history (it seems there from the start) but never older. A block outside every segment
//! (its memory released by a sleep) is left out: the viewer needs each block in a segment.

use crate::history::{self, Action, Entry};
use crate::state::Lib;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Above this a segment is PyTorch's `large` (its large pool serves requests above 1 MiB).
const SMALL_SEGMENT: usize = 1 << 20;

/// The snapshot of `device` (every device when `None`); `device_traces` has one list per device
/// either way, so that an index is a device number.
pub(crate) fn json(lib: &Lib, device: Option<usize>) -> String {
    let wanted = |d: usize| device.is_none_or(|w| w == d);
    let traces: Vec<Vec<Entry>> = (0..lib.devices)
        .map(|d| {
            if wanted(d) {
                history::entries(d)
            } else {
                Vec::new()
            }
        })
        .collect();
    let mut out = String::from("{\"segments\":[");
    let mut first = true;
    for d in (0..lib.devices).filter(|&d| wanted(d)) {
        let segments = lib.segments[d].segments();
        let mut live: Vec<(u64, usize, usize)> = lib
            .pools_of(Some(d))
            .iter()
            .flat_map(|s| s.pool.live())
            .collect();
        live.sort_unstable();
        let allocs = live_allocs(&traces[d]);
        for s in &segments {
            if !first {
                out.push(',');
            }
            first = false;
            segment(&mut out, d, s, &live, &allocs);
        }
    }
    out.push_str("],\"device_traces\":[");
    for (d, t) in traces.iter().enumerate() {
        if d > 0 {
            out.push(',');
        }
        out.push('[');
        for (i, e) in t.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            trace_entry(&mut out, e);
        }
        out.push(']');
    }
    out.push_str("]}");
    out
}

/// The latest allocation event of each block the history saw allocated and not freed: where a
/// live block's frames come from.
fn live_allocs(trace: &[Entry]) -> HashMap<u64, &Entry> {
    let mut m = HashMap::new();
    for e in trace {
        match e.action {
            Action::Alloc => {
                m.insert(e.addr, e);
            }
            Action::FreeCompleted => {
                m.remove(&e.addr);
            }
            _ => {}
        }
    }
    m
}

/// One segment with its blocks; `live` is every live block of the device, by address.
fn segment(
    out: &mut String,
    device: usize,
    s: &crate::segments::Segment,
    live: &[(u64, usize, usize)],
    allocs: &HashMap<u64, &Entry>,
) {
    let end = s.addr + s.size as u64;
    let mut blocks = String::new();
    let (mut allocated, mut requested) = (0usize, 0usize);
    let mut cursor = s.addr;
    let from = live.partition_point(|b| b.0 < s.addr);
    for &(ptr, asked, usable) in live[from..].iter().take_while(|b| b.0 < end) {
        if ptr < cursor {
            // Overlaps the block before it: never seen; drawn once rather than twice.
            tracing::debug!(
                ptr,
                "a live block overlaps the one before it; left out of the snapshot"
            );
            continue;
        }
        if ptr > cursor {
            block(&mut blocks, cursor, (ptr - cursor) as usize, 0, false, None);
        }
        let size = usable.min((end - ptr) as usize);
        let asked = asked.min(size);
        block(
            &mut blocks,
            ptr,
            size,
            asked,
            true,
            allocs.get(&ptr).copied(),
        );
        allocated += size;
        requested += asked;
        cursor = ptr + size as u64;
    }
    if cursor < end {
        block(&mut blocks, cursor, (end - cursor) as usize, 0, false, None);
    }
    let kind = if s.size > SMALL_SEGMENT {
        "large"
    } else {
        "small"
    };
    let _ = write!(
        out,
        "{{\"device\":{device},\"address\":{},\"total_size\":{},\"allocated_size\":{allocated},\
         \"active_size\":{allocated},\"requested_size\":{requested},\"stream\":{},\
         \"segment_type\":\"{kind}\",\"segment_pool_id\":[0,{}],\"is_expandable\":{},\
         \"frames\":[],\"blocks\":[{blocks}]}}",
        s.addr, s.size, s.stream, s.tag, s.expandable
    );
}

fn block(out: &mut String, addr: u64, size: usize, asked: usize, active: bool, e: Option<&Entry>) {
    if !out.is_empty() {
        out.push(',');
    }
    let state = if active {
        "active_allocated"
    } else {
        "inactive"
    };
    let _ = write!(
        out,
        "{{\"address\":{addr},\"size\":{size},\"requested_size\":{asked},\"state\":\"{state}\",\"frames\":"
    );
    frames(out, e);
    out.push('}');
}

fn trace_entry(out: &mut String, e: &Entry) {
    // PyTorch's out-of-memory entry has the device's free bytes where others have an address.
    let addr_key = if e.action == Action::Oom {
        "device_free"
    } else {
        "addr"
    };
    let _ = write!(
        out,
        "{{\"action\":\"{}\",\"{addr_key}\":{},\"size\":{},\"stream\":{},\"time_us\":{},\"frames\":",
        e.action.name(),
        e.addr,
        e.size,
        e.stream,
        e.time_us
    );
    frames(out, Some(e));
    out.push('}');
}

/// An event's frames: the name it was allocated under and the tag in force, as
/// `{"filename", "line", "name"}` like PyTorch's stack frames.
fn frames(out: &mut String, e: Option<&Entry>) {
    out.push('[');
    if let Some(e) = e {
        let mut names = Vec::new();
        if let Some(n) = &e.name {
            names.push(n.to_string());
        }
        if e.tag != 0 {
            names.push(format!("tag {}", crate::tags::name(e.tag)));
        }
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"filename\":\"cupool\",\"line\":0,\"name\":");
            json_str(out, n);
            out.push('}');
        }
    }
    out.push(']');
}

fn json_str(out: &mut String, s: &str) {
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
}
