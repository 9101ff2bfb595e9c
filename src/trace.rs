//! Allocation traces: parsing the JSON-lines format and replaying it through a pool on the
//! simulated device.
//!
//! The format is the one [`cupool_pool::adaptors::Recorder`] writes, one JSON object per line
//! (docs/repro-prefill.md). Blank lines and lines starting with `#` are skipped. Parsing never
//! panics: a malformed line is an error that names the line and what was expected.

use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::{synchronize, Block, Pool, PoolConfig, PoolError, PoolKind, Purge};
use cupool_runtime::PurgePolicy;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// One parsed event: the recorder's own type, so recording and replaying cannot drift apart.
pub use cupool_pool::adaptors::TraceEvent as Op;

fn field_u64(o: &Map<String, Value>, key: &str, line: usize, op: &str) -> Result<u64, String> {
    o.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("line {line}: \"{op}\" needs a non-negative integer \"{key}\""))
}

fn field_str(o: &Map<String, Value>, key: &str, line: usize, op: &str) -> Result<String, String> {
    o.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("line {line}: \"{op}\" needs a string \"{key}\""))
}

/// Parses a whole trace; the error names the line and what was expected.
pub fn parse(text: &str) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let v: Value = serde_json::from_str(t).map_err(|e| format!("line {line}: not JSON ({e}); expected one object per line such as {{\"op\":\"alloc\",\"id\":1,\"size\":4096}}"))?;
        let o = v
            .as_object()
            .ok_or_else(|| format!("line {line}: expected a JSON object, found {v}"))?;
        let op = o.get("op").and_then(Value::as_str).ok_or_else(|| {
            format!(
                "line {line}: missing string \"op\" (alloc, free, phase_begin, phase_end or sync)"
            )
        })?;
        ops.push(match op {
            "alloc" => Op::Alloc {
                id: field_u64(o, "id", line, op)?,
                size: usize::try_from(field_u64(o, "size", line, op)?).map_err(|_| format!("line {line}: size too large"))?,
                stream: match o.get("stream") {
                    None => 0,
                    Some(s) => s.as_u64().ok_or_else(|| format!("line {line}: \"stream\" must be a non-negative integer"))?,
                },
            },
            "free" => Op::Free { id: field_u64(o, "id", line, op)? },
            "phase_begin" => Op::PhaseBegin { name: field_str(o, "name", line, op)? },
            "phase_end" => Op::PhaseEnd {
                name: field_str(o, "name", line, op)?,
                prefill: match o.get("prefill") {
                    None => false,
                    Some(b) => b.as_bool().ok_or_else(|| format!("line {line}: \"prefill\" must be true or false"))?,
                },
            },
            "sync" => Op::Sync,
            other => return Err(format!("line {line}: unknown op {other:?}: expected alloc, free, phase_begin, phase_end or sync")),
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
}

/// The allocations of the phase after `from` that are live together at its start: the
/// requests a purge should keep buffers for.
fn next_requests(ops: &[Op], from: usize, stream: u64) -> Vec<usize> {
    let mut out = Vec::new();
    let mut started = false;
    for op in &ops[from..] {
        match op {
            Op::PhaseBegin { .. } => started = true,
            Op::Alloc {
                size, stream: s, ..
            } if started && *s == stream => out.push(*size),
            Op::Free { .. } if started && !out.is_empty() => break,
            Op::PhaseEnd { .. } if started => break,
            _ => {}
        }
    }
    out
}

pub fn replay(
    ops: &[Op],
    kind: PoolKind,
    purge: PurgePolicy,
    vram: Option<usize>,
) -> Result<ReplayReport, String> {
    let capacity = vram.map_or((1u64 << 50) as f64, |v| v as f64) / (1u64 << 30) as f64;
    let device = Arc::new(SimDevice::new(
        SimConfig::gib(capacity).backed(false).record_calls(false),
    ));
    let driver: Arc<dyn Driver> = device.clone();
    let config = PoolConfig::default().kind(kind);
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
    let mut ooms = 0u64;
    let measure = |pools: &HashMap<u64, Arc<dyn Pool>>, r: &mut ReplayReport, live_bytes: usize| {
        let reserved: usize = pools.values().map(|p| p.stats().reserved_bytes).sum();
        r.peak_reserved_bytes = r.peak_reserved_bytes.max(reserved);
        r.peak_live_bytes = r.peak_live_bytes.max(live_bytes);
    };
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc { id, size, stream } => {
                if live.contains_key(id) {
                    return Err(format!(
                        "event {}: alloc of id {id}, which is already live",
                        i + 1
                    ));
                }
                let pool = match pools.get(stream) {
                    Some(p) => p.clone(),
                    None => {
                        let p = config.build(driver.clone()).map_err(|e| e.to_string())?;
                        pools.insert(*stream, p.clone());
                        p
                    }
                };
                match pool.alloc(*size) {
                    Ok(b) => {
                        live_bytes += b.size();
                        live.insert(*id, (*stream, b));
                    }
                    Err(PoolError::OutOfMemory(_)) => {
                        ooms += 1;
                        failed.insert(*id);
                    }
                    Err(e) => return Err(format!("event {}: {e}", i + 1)),
                }
            }
            Op::Free { id } => match live.remove(id) {
                Some((stream, b)) => {
                    live_bytes -= b.size();
                    pools[&stream].free(b).map_err(|e| e.to_string())?;
                }
                None if failed.remove(id) => {}
                None => {
                    return Err(format!(
                        "event {}: free of id {id}, which is not live",
                        i + 1
                    ))
                }
            },
            Op::PhaseBegin { name } => pools.values().for_each(|p| p.begin_phase(name)),
            Op::PhaseEnd { prefill, .. } => {
                pools.values().for_each(|p| {
                    p.end_phase();
                });
                if *prefill && purge != PurgePolicy::Never {
                    let mut token = None;
                    for (&stream, p) in &pools {
                        let what = match purge {
                            PurgePolicy::Always => Purge::All,
                            _ => Purge::KeepFor(next_requests(ops, i + 1, stream)),
                        };
                        if purge == PurgePolicy::Auto && p.releasable(&what) == 0 {
                            continue;
                        }
                        if token.is_none() {
                            token = Some(synchronize(driver.as_ref()).map_err(|e| e.to_string())?);
                        }
                        p.purge(token.as_ref().unwrap(), what)
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Op::Sync => {}
        }
        measure(&pools, &mut r, live_bytes);
    }
    r.end_reserved_bytes = pools.values().map(|p| p.stats().reserved_bytes).sum();
    for p in pools.values() {
        let c = p.stats().calls;
        r.driver_mallocs += c.mallocs + c.managed_mallocs;
        r.driver_frees += c.frees + c.managed_frees;
        r.driver_maps += c.maps;
        r.driver_unmaps += c.unmaps;
    }
    r.ooms = ooms;
    for (_, (stream, b)) in live.drain() {
        let _ = pools[&stream].free(b);
    }
    Ok(r)
}
