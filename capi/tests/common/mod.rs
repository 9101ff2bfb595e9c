//! What the replays of the recorded PyTorch prefills share: the traces and libcupool's
//! statistics.
#![allow(dead_code)]

use cupool_pool::trace::{parse, TraceEvent};
use std::io::Read;

pub const MIB: f64 = (1u64 << 20) as f64;

/// The events of the prefill recorded on the H200 for `name` (phi3, llama3, qwen3moe):
/// data/h200-2026-11-28-bins/call1/trace-NAME.jsonl.gz.
pub fn events(name: &str) -> Vec<TraceEvent> {
    let path = format!(
        "{}/../data/h200-2026-11-28-bins/call1/trace-{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&raw[..])
        .read_to_string(&mut text)
        .expect("the trace is gzip");
    parse(&text).expect("the trace parses")
}

/// The number `key` names in libcupool's statistics `json`.
pub fn stat(json: &str, key: &str) -> f64 {
    let at = json.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
    let digits: String = json[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a number")
}
