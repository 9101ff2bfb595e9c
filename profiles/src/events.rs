//! A profile's calls as allocation-trace events: what `predict` replays and what
//! `repro-prefill replay` reads.

use crate::op::{OpCall, Request};
use cupool_pool::trace::TraceEvent;

/// The calls as trace events (allocations numbered from `first_id`, stream 0), the format
/// libcupool records and `repro-prefill replay` reads; returns the next free id.
pub fn trace_events(calls: &[OpCall], first_id: u64, out: &mut Vec<TraceEvent>) -> u64 {
    let mut id = first_id;
    let alloc = |id: &mut u64, r: &Request, out: &mut Vec<TraceEvent>| {
        out.push(TraceEvent::Alloc {
            id: *id,
            size: r.bytes,
            stream: 0,
            // A fused group's requests have no name (see `Request::name`).
            name: (!r.name.is_empty()).then(|| r.name.to_string()),
        });
        *id += 1;
        *id - 1
    };
    for c in calls {
        for _ in 0..c.repeat {
            let held: Vec<u64> = c.held.iter().map(|r| alloc(&mut id, r, out)).collect();
            for r in &c.inner {
                let i = alloc(&mut id, r, out);
                out.push(TraceEvent::Free { id: i });
            }
            id = trace_events(&c.nested, id, out);
            for i in held.into_iter().rev() {
                out.push(TraceEvent::Free { id: i });
            }
        }
    }
    id
}
