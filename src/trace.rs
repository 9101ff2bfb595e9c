//! Allocation traces: parsing the JSON-lines format and replaying it through a pool on the
//! simulated device.
//!
//! The format is the one [`cupool_pool::adaptors::Recorder`] writes, one JSON object per line
//! (docs/repro-prefill.md). Blank lines and lines starting with `#` are skipped. Parsing never
//! panics: a malformed line is an error that names the line and what was expected.

use cupool_pool::driver::sim::{SimConfig, SimDevice, MAX_CAPACITY};
use cupool_pool::driver::Driver;
use cupool_pool::{synchronize, Block, Pool, PoolConfig, PoolError, Purge};
use cupool_runtime::PurgePolicy;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// One parsed event: the recorder's own type, so recording and replaying cannot drift apart.
pub use cupool_pool::adaptors::TraceEvent as Op;

/// Why a trace could not be parsed or replayed.
#[derive(Debug)]
pub enum TraceError {
    /// A line is not an event; the message says what was expected.
    Parse {
        /// The line, from 1.
        line: usize,
        /// What was wrong and what is accepted.
        message: String,
    },
    /// An event contradicts the ones before it (a double alloc, a free of nothing).
    Inconsistent {
        /// The event, from 1.
        event: usize,
        /// What was wrong.
        message: String,
    },
    /// The pool failed in a way other than running out of memory.
    Pool(PoolError),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Parse { line, message } => write!(f, "line {line}: {message}"),
            TraceError::Inconsistent { event, message } => write!(f, "event {event}: {message}"),
            TraceError::Pool(e) => write!(f, "replay failed: {e}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Pool(e) => Some(e),
            _ => None,
        }
    }
}

impl From<PoolError> for TraceError {
    fn from(e: PoolError) -> Self {
        TraceError::Pool(e)
    }
}

fn bad(line: usize, message: String) -> TraceError {
    TraceError::Parse { line, message }
}

fn field_u64(o: &Map<String, Value>, key: &str, line: usize, op: &str) -> Result<u64, TraceError> {
    o.get(key).and_then(Value::as_u64).ok_or_else(|| {
        bad(
            line,
            format!("\"{op}\" needs a non-negative integer \"{key}\""),
        )
    })
}

fn field_str(
    o: &Map<String, Value>,
    key: &str,
    line: usize,
    op: &str,
) -> Result<String, TraceError> {
    o.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| bad(line, format!("\"{op}\" needs a string \"{key}\"")))
}

/// The optional `"stream"` of an event (0 when absent).
fn stream_field(o: &Map<String, Value>, line: usize) -> Result<u64, TraceError> {
    match o.get("stream") {
        None => Ok(0),
        Some(s) => s
            .as_u64()
            .ok_or_else(|| bad(line, "\"stream\" must be a non-negative integer".into())),
    }
}

/// Parses a whole trace; the error names the line and what was expected.
pub fn parse(text: &str) -> Result<Vec<Op>, TraceError> {
    let mut ops = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let v: Value = serde_json::from_str(t).map_err(|e| {
            // serde's text ends with its own position in the one-line document: give the
            // column alone, the line is ours.
            let what = e.to_string();
            let what = what.split(" at line ").next().unwrap_or_default();
            bad(line, format!("not JSON at column {} ({what}); expected one object per line such as {{\"op\":\"alloc\",\"id\":1,\"size\":4096}}", e.column()))
        })?;
        let o = v
            .as_object()
            .ok_or_else(|| bad(line, format!("expected a JSON object, found {v}")))?;
        let op = o.get("op").and_then(Value::as_str).ok_or_else(|| {
            bad(
                line,
                "missing string \"op\" (alloc, free, keep, phase_begin, phase_end or sync)".into(),
            )
        })?;
        ops.push(match op {
            "alloc" => Op::Alloc {
                id: field_u64(o, "id", line, op)?,
                size: usize::try_from(field_u64(o, "size", line, op)?)
                    .map_err(|_| bad(line, "size too large".into()))?,
                stream: stream_field(o, line)?,
                name: match o.get("name") {
                    None => None,
                    Some(n) => Some(n.as_str().map(str::to_owned).ok_or_else(|| {
                        bad(line, "\"name\" must be a string".into())
                    })?),
                },
            },
            "keep" => Op::Keep {
                stream: stream_field(o, line)?,
                sizes: if o.get("all") == Some(&Value::Bool(true)) {
                    None
                } else {
                    Some(
                        o.get("sizes")
                            .and_then(Value::as_array)
                            .and_then(|a| {
                                a.iter()
                                    .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                                    .collect::<Option<Vec<usize>>>()
                            })
                            .ok_or_else(|| {
                                bad(
                                    line,
                                    "\"keep\" needs \"sizes\", an array of non-negative integers, or \"all\":true".into(),
                                )
                            })?,
                    )
                },
            },
            "free" => Op::Free {
                id: field_u64(o, "id", line, op)?,
            },
            "phase_begin" => Op::PhaseBegin {
                name: field_str(o, "name", line, op)?,
            },
            "phase_end" => Op::PhaseEnd {
                name: field_str(o, "name", line, op)?,
                prefill: match o.get("prefill") {
                    None => false,
                    Some(b) => b
                        .as_bool()
                        .ok_or_else(|| bad(line, "\"prefill\" must be true or false".into()))?,
                },
            },
            "sync" => Op::Sync,
            other => {
                return Err(bad(
                    line,
                    format!(
                    "unknown op {other:?}: expected alloc, free, keep, phase_begin, phase_end or sync"
                ),
                ))
            }
        });
    }
    Ok(ops)
}

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplayReport {
    /// Pool kind.
    pub pool: String,
    /// Purge policy.
    pub purge: String,
    /// Events replayed.
    pub events: usize,
    /// Highest live bytes.
    pub peak_live_bytes: usize,
    /// Highest reserve, all streams' pools together.
    pub peak_reserved_bytes: usize,
    /// Reserve at the end.
    pub end_reserved_bytes: usize,
    /// Device and managed mallocs.
    pub driver_mallocs: u64,
    /// Device and managed frees.
    pub driver_frees: u64,
    /// VMM maps.
    pub driver_maps: u64,
    /// VMM unmaps.
    pub driver_unmaps: u64,
    /// Allocations that ran out of memory.
    pub ooms: u64,
    /// The event (1-based) of the first allocation that ran out of memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_oom_event: Option<usize>,
}

/// The reserve of every stream's pool and their sum, updated one pool at a time (summing all
/// pools at every event made replays quadratic in the number of streams).
#[derive(Default)]
struct Reserved {
    of: HashMap<u64, usize>,
    total: usize,
}

impl Reserved {
    fn update(&mut self, stream: u64, now: usize) {
        let was = self.of.insert(stream, now).unwrap_or(0);
        self.total = self.total - was + now;
    }
}

/// For each stream, the allocations of the phase after `from` that are live together at its
/// start (until the first free after the stream's first allocation): the requests a purge
/// should keep buffers for. One pass over that phase for all streams, so replays stay linear.
fn next_requests(ops: &[Op], from: usize) -> HashMap<u64, Vec<usize>> {
    let mut out: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut done: std::collections::HashSet<u64> = Default::default();
    // Streams with requests and no free since: a free closes all of them.
    let mut open: Vec<u64> = Vec::new();
    let mut started = false;
    for op in &ops[from..] {
        match op {
            Op::PhaseBegin { .. } => started = true,
            Op::Alloc { size, stream, .. } if started && !done.contains(stream) => {
                let v = out.entry(*stream).or_default();
                if v.is_empty() {
                    open.push(*stream);
                }
                v.push(*size);
            }
            Op::Free { .. } if started => done.extend(open.drain(..)),
            // The phase ended, or another ended before one began: nothing further belongs to it.
            Op::PhaseEnd { .. } => break,
            _ => {}
        }
    }
    out
}

/// Replays `ops` through pools that `config` builds (one per stream) on a simulated card of `vram` bytes
/// (unlimited when `None`), purging at prefill phase ends by `purge`. Allocations that run out
/// of memory are counted, not fatal.
pub fn replay(
    ops: &[Op],
    config: &PoolConfig,
    purge: PurgePolicy,
    vram: Option<usize>,
) -> Result<ReplayReport, TraceError> {
    let mut sim = SimConfig::gib(0.0).backed(false).record_calls(false);
    sim.capacity = vram.map_or(MAX_CAPACITY, |v| v.min(MAX_CAPACITY));
    let driver: Arc<dyn Driver> = Arc::new(SimDevice::new(sim).map_err(PoolError::from)?);
    let kind = config.resolve(true)?;
    let mut pools: HashMap<u64, Arc<dyn Pool>> = HashMap::new();
    let mut live: HashMap<u64, (u64, Block)> = HashMap::new();
    let mut failed: std::collections::HashSet<u64> = Default::default();
    let mut r = ReplayReport {
        pool: kind.name().into(),
        purge: purge.name().into(),
        events: ops.len(),
        ..Default::default()
    };
    let mut live_bytes = 0usize;
    let mut reserved = Reserved::default();
    let mut ooms = 0u64;
    // The keep lists recorded for the open phase, by stream (`None`: the run kept everything).
    let mut kept: HashMap<u64, Option<Vec<usize>>> = HashMap::new();
    let inconsistent = |i: usize, message: String| TraceError::Inconsistent {
        event: i + 1,
        message,
    };
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc {
                id, size, stream, ..
            } => {
                if live.contains_key(id) {
                    return Err(inconsistent(
                        i,
                        format!("alloc of id {id}, which is already live"),
                    ));
                }
                let pool = match pools.get(stream) {
                    Some(p) => p.clone(),
                    None => {
                        let p = config.build(driver.clone())?;
                        pools.insert(*stream, p.clone());
                        p
                    }
                };
                match pool.alloc(*size) {
                    Ok(b) => {
                        live_bytes += b.size();
                        live.insert(*id, (*stream, b));
                        reserved.update(*stream, pool.reserved_bytes());
                    }
                    Err(PoolError::OutOfMemory(_)) => {
                        ooms += 1;
                        r.first_oom_event.get_or_insert(i + 1);
                        failed.insert(*id);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Op::Free { id } => match live.remove(id) {
                Some((stream, b)) => {
                    live_bytes -= b.size();
                    let p = &pools[&stream];
                    p.free(b).map_err(|e| e.error)?;
                    reserved.update(stream, p.reserved_bytes());
                }
                None if failed.remove(id) => {}
                None => {
                    return Err(inconsistent(
                        i,
                        format!("free of id {id}, which is not live"),
                    ))
                }
            },
            Op::Keep { stream, sizes } => {
                kept.insert(*stream, sizes.clone());
            }
            Op::PhaseEnd { prefill: true, .. } if purge != PurgePolicy::Never => {
                let mut token = None;
                // A trace that says what its run's auto purge kept is purged the same way;
                // otherwise auto keeps what the next phase asks for first.
                let recorded = std::mem::take(&mut kept);
                let from_trace = purge == PurgePolicy::Auto && !recorded.is_empty();
                let mut next: HashMap<u64, Option<Vec<usize>>> = match purge {
                    PurgePolicy::Always => HashMap::new(),
                    _ if !recorded.is_empty() => recorded,
                    _ => next_requests(ops, i + 1)
                        .into_iter()
                        .map(|(s, sizes)| (s, Some(sizes)))
                        .collect(),
                };
                for (&stream, p) in &pools {
                    let what = match purge {
                        PurgePolicy::Always => Purge::All,
                        _ => match next.remove(&stream) {
                            Some(Some(sizes)) => Purge::KeepFor(sizes),
                            // The run kept everything there: the device had room.
                            Some(None) => continue,
                            // The run purged only the pools it named.
                            None if from_trace => continue,
                            None => Purge::KeepFor(Vec::new()),
                        },
                    };
                    if purge == PurgePolicy::Auto && p.releasable(&what) == 0 {
                        continue;
                    }
                    let t = match token {
                        Some(t) => t,
                        None => {
                            *token.insert(synchronize(driver.as_ref()).map_err(PoolError::from)?)
                        }
                    };
                    p.purge(&t, what)?;
                    reserved.update(stream, p.reserved_bytes());
                }
            }
            Op::PhaseBegin { .. } | Op::PhaseEnd { .. } | Op::Sync => {}
        }
        r.peak_reserved_bytes = r.peak_reserved_bytes.max(reserved.total);
        r.peak_live_bytes = r.peak_live_bytes.max(live_bytes);
    }
    r.end_reserved_bytes = pools.values().map(|p| p.reserved_bytes()).sum();
    for p in pools.values() {
        let c = p.stats().calls;
        r.driver_mallocs += c.mallocs + c.managed_mallocs;
        r.driver_frees += c.frees + c.managed_frees;
        r.driver_maps += c.maps;
        r.driver_unmaps += c.unmaps;
    }
    r.ooms = ooms;
    for (_, (stream, b)) in live.drain() {
        if let Err(e) = pools[&stream].free(b) {
            tracing::error!(error = %e, "freeing a block at the end of a replay failed");
        }
    }
    Ok(r)
}

#[cfg(test)]
mod next_requests_tests {
    use super::*;

    fn alloc(id: u64, size: usize, stream: u64) -> Op {
        Op::Alloc {
            id,
            size,
            stream,
            name: None,
        }
    }

    #[test]
    fn each_stream_keeps_what_is_live_together_at_the_next_phase_start() {
        let begin = || Op::PhaseBegin { name: "p".into() };
        let end = || Op::PhaseEnd {
            name: "p".into(),
            prefill: true,
        };
        let ops = vec![
            end(),
            alloc(9, 1, 0), // between phases: not part of the next one
            begin(),
            alloc(1, 10, 0),
            alloc(2, 20, 0),
            Op::Free { id: 1 }, // closes stream 0; stream 1 has not started
            alloc(3, 30, 1),
            alloc(4, 40, 0),
            alloc(5, 50, 1),
            end(),
            begin(),
            alloc(6, 60, 2),
        ];
        let next = next_requests(&ops, 1);
        assert_eq!(next.get(&0), Some(&vec![10, 20]));
        assert_eq!(next.get(&1), Some(&vec![30, 50]));
        assert_eq!(next.get(&2), None, "the phase after that is not the next");
        // Phase ends with no phase between them: nothing to keep, and the scan stops at once.
        let ends: Vec<Op> = std::iter::repeat_with(end).take(3).collect();
        assert!(next_requests(&ends, 1).is_empty());
    }
}

#[cfg(test)]
mod recorded_purge_tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn names_and_keep_lists_parse_and_print_back() {
        let text = r#"{"op":"alloc","id":0,"size":4096,"stream":1,"name":"K_f16"}
{"op":"keep","stream":1,"sizes":[4096,512]}
{"op":"alloc","id":1,"size":8,"stream":0}
{"op":"keep","stream":0,"all":true}"#;
        let ops = parse(text).unwrap();
        assert_eq!(
            ops[0],
            Op::Alloc {
                id: 0,
                size: 4096,
                stream: 1,
                name: Some("K_f16".into())
            }
        );
        assert_eq!(
            ops[1],
            Op::Keep {
                stream: 1,
                sizes: Some(vec![4096, 512])
            }
        );
        assert_eq!(
            ops[3],
            Op::Keep {
                stream: 0,
                sizes: None
            }
        );
        let printed: Vec<String> = ops.iter().map(Op::to_json).collect();
        assert_eq!(printed.join("\n"), text);
        for bad in [
            r#"{"op":"keep","stream":0}"#,
            r#"{"op":"keep","sizes":[1,-2]}"#,
            r#"{"op":"keep","stream":0,"all":false}"#,
            r#"{"op":"alloc","id":0,"size":1,"name":7}"#,
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("line 1:"), "{e}");
        }
    }

    /// A legacy pool holding an outgrown 4 MiB buffer and a reused 1 MiB one at a boundary.
    fn trace(keep: Option<Option<Vec<usize>>>) -> Vec<Op> {
        let alloc = |id, size| Op::Alloc {
            id,
            size,
            stream: 0,
            name: None,
        };
        let mut ops = vec![
            Op::PhaseBegin { name: "u0".into() },
            alloc(0, 4 * MIB),
            alloc(1, MIB),
            Op::Free { id: 0 },
            Op::Free { id: 1 },
        ];
        if let Some(sizes) = keep {
            ops.push(Op::Keep { stream: 0, sizes });
        }
        ops.push(Op::PhaseEnd {
            name: "u0".into(),
            prefill: true,
        });
        ops.push(Op::PhaseBegin { name: "u1".into() });
        ops.push(alloc(2, 8 * MIB));
        ops.push(alloc(3, MIB));
        ops
    }

    fn run(ops: &[Op]) -> ReplayReport {
        let config = PoolConfig::default().kind(cupool_pool::PoolKind::Legacy);
        replay(ops, &config, PurgePolicy::Auto, None).unwrap()
    }

    #[test]
    fn a_recorded_keep_list_decides_what_the_auto_purge_keeps() {
        // Without a keep list, auto keeps what the next phase asks for first (8 MiB and 1 MiB,
        // live together): the 1 MiB buffer stays, the outgrown 4 MiB one goes.
        let oracle = run(&trace(None));
        assert_eq!((oracle.driver_mallocs, oracle.driver_frees), (3, 1));
        // The run's own list is followed even where the oracle would differ: [4 MiB] keeps the
        // outgrown buffer (which then serves the 1 MiB request), [] keeps nothing.
        let kept = run(&trace(Some(Some(vec![4 * MIB]))));
        assert_eq!((kept.driver_mallocs, kept.driver_frees), (3, 1));
        assert!(kept.end_reserved_bytes > oracle.end_reserved_bytes + 2 * MIB);
        let none = run(&trace(Some(Some(vec![]))));
        assert_eq!((none.driver_mallocs, none.driver_frees), (4, 2));
        // "all": the run kept everything (its device had room), and so does the replay: the
        // outgrown 4 MiB buffer stays, nothing goes back.
        let all = run(&trace(Some(None)));
        assert_eq!((all.driver_mallocs, all.driver_frees), (3, 0));
    }
}
