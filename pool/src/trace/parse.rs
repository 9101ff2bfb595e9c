//! Parsing the JSON-lines format. Blank lines and lines starting with `#` are skipped. Parsing
//! never panics: a malformed line is an error that names the line and what was expected.

use super::{TraceError, TraceEvent as Op};
use serde_json::{Map, Value};

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
