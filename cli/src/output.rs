//! Output that more than one subcommand prints: the scenario in the JSON of `run` and `plan`
//! (the documented contract, docs/repro-prefill.md) and a replay's driver calls in the tables of
//! `replay` and `predict`, the MiB of `run`'s table and its plot, and CSV fields. What one
//! subcommand alone prints is in its file under `cmd/`.

use crate::scenario::static_bytes;
use cupool::runtime::RunConfig;
use cupool::trace::ReplayReport;
use serde_json::{json, Value};

/// The scenario: the model's shape, the run's sizes, the startup bytes and the device.
pub fn scenario_json(
    c: &RunConfig,
    prompt: usize,
    device: &str,
    executor: &str,
    card: Option<usize>,
) -> Value {
    let m = &c.model;
    let (w, kv, compute) = static_bytes(c);
    json!({
        "model": m.name, "n_layer": m.n_layer, "n_embd": m.n_embd, "n_head": m.n_head, "n_head_kv": m.n_head_kv,
        "head_dim_k": m.head_dim_k, "head_dim_v": m.head_dim_v, "v_is_k": m.v_is_k, "n_ff": m.n_ff,
        "kv_type": c.kv_type.name(), "ctx": c.n_ctx, "prompt": prompt, "batch": c.n_batch, "ubatch": c.n_ubatch,
        "weights_bytes": w, "kv_bytes": kv, "compute_bytes": compute, "vram_bytes": card,
        "device": device, "executor": executor,
    })
}

/// A replay's driver traffic, for the tables.
pub fn driver_calls(r: &ReplayReport) -> String {
    format!(
        "{} mallocs, {} frees, {} maps, {} unmaps",
        r.driver_mallocs, r.driver_frees, r.driver_maps, r.driver_unmaps
    )
}

/// Bytes in MiB as the tables and the plot's legend print them (`840.0 MiB`): one function,
/// so that the two cannot disagree.
pub fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// A CSV field: as it is, or quoted (with its quotes doubled) when it holds a comma, a quote
/// or a line break, so that a model's or a configuration's name cannot shift the columns.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn a_csv_field_is_quoted_only_when_it_must_be() {
        assert_eq!(csv_field("legacy/never"), "legacy/never");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }
}
