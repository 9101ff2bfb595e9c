//! Table, JSON and CSV output. The JSON shape is the documented contract (docs/repro-prefill.md).

use crate::scenario::{static_bytes, Outcome, GIB};
use cupool::runtime::{Plan, RunConfig, RunReport};
use serde_json::{json, Value};

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / GIB)
}

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

pub fn run_json(o: &Outcome) -> Value {
    match &o.report {
        Ok(r) => json!({
            "label": o.label,
            "pool": r.pool.name(), "purge": r.purge.name(), "budget_mode": r.budget_mode.name(),
            "completed": r.completed, "oom_at_token": r.oom_at_token,
            "peak_live_bytes": r.peak_live_bytes, "peak_reserved_bytes": r.peak_reserved_bytes,
            "budget_bytes": r.budget_bytes, "budget_warnings": r.budget_warnings,
            "projected_oom_at_token": r.projected_oom_at_token,
            "driver_mallocs": r.driver_mallocs, "driver_frees": r.driver_frees, "fallbacks": r.fallbacks,
            "fallback_peak_bytes": r.fallback_peak_bytes,
            "seconds": r.seconds,
            "oom_report": r.oom.as_ref().map(|o| o.to_string()),
            "ubatches": r.ubatches.iter().map(|u| json!({
                "index": u.index, "n_tokens": u.n_tokens, "n_kv": u.n_kv,
                "live_peak_bytes": u.live_peak_bytes, "reserved_bytes": u.reserved_bytes,
                "cached_bytes": u.cached_bytes, "device_used_bytes": u.device_used_bytes, "seconds": u.seconds,
            })).collect::<Vec<_>>(),
        }),
        Err(e) => json!({
            "label": o.label,
            "pool": o.config.pool.kind.map(|k| k.name()), "purge": o.config.purge.name(), "budget_mode": o.config.budget.name(),
            "completed": false, "oom_at_token": null, "error": e, "ubatches": [],
        }),
    }
}

fn outcome_text(r: &RunReport) -> String {
    match r.oom_at_token {
        None => "completed".into(),
        Some(t) => format!("OOM at token {t}"),
    }
}

pub fn run_table(outcomes: &[Outcome], header: &str) -> String {
    let mut s = format!("{header}\n\n");
    s.push_str(&format!(
        "{:<22} {:<20} {:>13} {:>14} {:>9} {:>9} {:>9} {:>9}\n",
        "configuration",
        "outcome",
        "peak live",
        "peak reserved",
        "res/live",
        "mallocs",
        "warnings",
        "time"
    ));
    for o in outcomes {
        match &o.report {
            Ok(r) => s.push_str(&format!(
                "{:<22} {:<20} {:>13} {:>14} {:>9.2} {:>9} {:>9} {:>8.2}s\n",
                o.label,
                outcome_text(r),
                mib(r.peak_live_bytes),
                mib(r.peak_reserved_bytes),
                r.peak_reserved_bytes as f64 / r.peak_live_bytes.max(1) as f64,
                r.driver_mallocs,
                r.budget_warnings,
                r.seconds
            )),
            Err(e) => s.push_str(&format!("{:<22} did not start: {e}\n", o.label)),
        }
    }
    for o in outcomes {
        if let Ok(r) = &o.report {
            if r.fallbacks > 0 {
                s.push_str(&format!(
                    "\n{}: {} allocations served from managed memory (the device was full), at most {} at once, counted in peak live\n",
                    o.label,
                    r.fallbacks,
                    mib(r.fallback_peak_bytes).trim()
                ));
            }
        }
    }
    for o in outcomes {
        if let Ok(RunReport { oom: Some(oom), .. }) = &o.report {
            s.push_str(&format!("\n{}: {oom}\n", o.label));
        }
    }
    s
}

pub fn run_csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from("label,pool,purge,budget_mode,completed,oom_at_token,index,n_tokens,n_kv,live_peak_bytes,reserved_bytes,cached_bytes,device_used_bytes,budget_bytes,seconds\n");
    for o in outcomes {
        if let Ok(r) = &o.report {
            for u in &r.ubatches {
                s.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6}\n",
                    o.label,
                    r.pool.name(),
                    r.purge.name(),
                    r.budget_mode.name(),
                    r.completed,
                    r.oom_at_token.map_or(String::new(), |t| t.to_string()),
                    u.index,
                    u.n_tokens,
                    u.n_kv,
                    u.live_peak_bytes,
                    u.reserved_bytes,
                    u.cached_bytes,
                    u.device_used_bytes,
                    u.budget_bytes,
                    u.seconds
                ));
            }
        }
    }
    s
}

pub fn plan_json(p: &Plan, c: &RunConfig, scenario: Value) -> Value {
    json!({
        "scenario": scenario,
        "pool": c.pool.kind.map(|k| k.name()), "purge": c.purge.name(),
        "pool_peak_reserved_bytes": p.pool_peak_reserved_bytes, "pool_peak_live_bytes": p.pool_peak_live_bytes,
        "pool_driver_mallocs": p.pool_driver_mallocs,
        "kv_bytes": p.kv_bytes, "compute_bytes": p.compute_bytes, "weights_bytes": p.weights_bytes,
        "total_bytes": p.total_bytes, "device_bytes": p.device_bytes, "fits": p.fits, "max_ctx_that_fits": p.max_ctx_that_fits,
        "oom_at_token": p.oom_at_token,
    })
}

pub fn plan_table(p: &Plan, c: &RunConfig) -> String {
    let kind = c.pool.kind.map_or("auto", |k| k.name());
    let mut s = format!(
        "memory plan: {} prompt {} / ctx {}, {} KV, ubatch {}, pool {kind}, purge {}\n\n",
        c.model.name,
        p.n_prompt,
        c.n_ctx,
        c.kv_type.name(),
        c.n_ubatch,
        c.purge.name()
    );
    for (what, b) in [
        ("weights", p.weights_bytes),
        ("KV cache", p.kv_bytes),
        ("compute buffer", p.compute_bytes),
        ("pool reserve (whole prefill)", p.pool_peak_reserved_bytes),
    ] {
        s.push_str(&format!("  {what:<30} {:>12}  ({b} bytes)\n", gib(b)));
    }
    s.push_str(&format!(
        "  {:<30} {:>12}  ({} bytes)\n",
        "total",
        gib(p.total_bytes),
        p.total_bytes
    ));
    s.push_str(&format!(
        "  {:<30} {:>12}\n\n",
        "device free",
        gib(p.device_bytes)
    ));
    s.push_str(&format!("fits: {}\n", if p.fits { "yes" } else { "NO" }));
    match p.oom_at_token {
        Some(0) => s.push_str("the run cannot start: the startup buffers alone do not fit\n"),
        Some(t) => s.push_str(&format!(
            "the run dies at token {t} (simulated under this pool and purge policy)\n"
        )),
        None if !p.fits => s.push_str(
            "the run completes all the same (simulated under this pool and purge policy)\n",
        ),
        None => {}
    }
    s.push_str(&match p.max_ctx_that_fits {
        Some(c) => format!("largest context that fits (prompt filling it): {c} tokens\n"),
        None => "no context fits: the weights alone are too large\n".into(),
    });
    s
}
