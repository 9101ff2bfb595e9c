//! `repro-prefill plan`: the memory budget without running (weights, KV cache, compute buffer,
//! the pool's reserve over the whole prefill), whether it fits, where a run dies if not and
//! the largest context that fits; and its table and JSON (the documented contract,
//! docs/repro-prefill.md).

use super::{fail, pool_choice, usage, EXIT_OOM};
use crate::cli::{FormatArg, RunArgs};
use crate::output;
use crate::scenario::{self, Device, GIB};
use crate::stdout;
use cupool::runtime::planner::{self, PlanTarget};
use cupool::runtime::{BudgetMode, Plan, RunConfig};
use serde_json::{json, Value};
use std::process::ExitCode;

/// Prints the plan; exits 3 when it does not fit.
pub fn plan(a: RunArgs) -> ExitCode {
    crate::log::init(a.quiet, false);
    // Options of a run that a plan has no use for: refused, not silently ignored.
    for (given, name) in [(a.plot.is_some(), "--plot"), (a.trace.is_some(), "--trace")] {
        if given {
            return usage(format!(
                "{name} records a run; plan runs nothing: drop {name}, or run without plan"
            ));
        }
    }
    for (given, name, why) in [
        (a.compute.is_some(), "--compute", "plan computes nothing"),
        (
            a.budget != BudgetMode::Ggml,
            "--budget",
            "plan prints the planned budget itself",
        ),
        (
            a.fallback_managed,
            "--fallback-managed",
            "plan models the pool on a card it never fills",
        ),
        (a.yes, "--yes", "plan computes nothing to confirm"),
    ] {
        if given {
            return usage(format!("{name} is an option of a run; {why}: drop {name}"));
        }
    }
    let prompt = a.prompt_tokens(true);
    let model = match scenario::model_from_args(&a) {
        Ok(m) => m,
        Err(e) => return usage(e),
    };
    let mut cfg = match scenario::run_config(&a, &model, true) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    match pool_choice(&a) {
        // Unchosen, the kind stays automatic (vmm where supported) with the environment's
        // other settings.
        Ok((p, _)) => cfg.pool = p,
        Err(e) => return usage(e),
    }
    let dev = match Device::from_args(&a) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    dev.apply_facts(&mut cfg);
    let target = match dev.driver().and_then(|d| PlanTarget::of(d.as_ref())) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    // Name the pool the plan models (automatic: vmm where the device supports it).
    match cfg.pool.resolve(target.vmm) {
        Ok(k) => cfg.pool.kind = Some(k),
        Err(e) => return usage(e),
    }
    let p = match planner::plan(&cfg, &target, prompt) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match a.format {
        FormatArg::Json => {
            let scen =
                output::scenario_json(&cfg, prompt, &dev.describe(), "dry-run", dev.card_bytes());
            outln!(
                "{}",
                serde_json::to_string_pretty(&plan_json(&p, &cfg, scen)).unwrap_or_default()
            );
        }
        FormatArg::Csv => stdout::out(&plan_csv(&p, &cfg)),
        FormatArg::Table => stdout::out(&plan_table(&p, &cfg)),
    }
    if p.fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_OOM)
    }
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / GIB)
}

/// The plan in the JSON output, with the scenario.
fn plan_json(p: &Plan, c: &RunConfig, scenario: Value) -> Value {
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

/// The plan as CSV: a header line and one row (an empty field where there is no value: no
/// context fits, the run does not die).
fn plan_csv(p: &Plan, c: &RunConfig) -> String {
    let opt = |v: Option<usize>| v.map_or(String::new(), |v| v.to_string());
    let row = [
        output::csv_field(&c.model.name),
        p.n_prompt.to_string(),
        c.n_ctx.to_string(),
        c.kv_type.name().to_string(),
        c.n_ubatch.to_string(),
        c.pool.kind.map_or("auto", |k| k.name()).to_string(),
        c.purge.name().to_string(),
        p.weights_bytes.to_string(),
        p.kv_bytes.to_string(),
        p.compute_bytes.to_string(),
        p.pool_peak_reserved_bytes.to_string(),
        p.pool_peak_live_bytes.to_string(),
        p.pool_driver_mallocs.to_string(),
        p.total_bytes.to_string(),
        p.device_bytes.to_string(),
        p.fits.to_string(),
        opt(p.max_ctx_that_fits),
        opt(p.oom_at_token),
    ];
    format!(
        "model,prompt,ctx,kv_type,ubatch,pool,purge,weights_bytes,kv_bytes,compute_bytes,pool_peak_reserved_bytes,pool_peak_live_bytes,pool_driver_mallocs,total_bytes,device_bytes,fits,max_ctx_that_fits,oom_at_token\n{}\n",
        row.join(",")
    )
}

/// The plan as a table: each part of the budget, the total against the device, the verdict.
fn plan_table(p: &Plan, c: &RunConfig) -> String {
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
