//! `repro-prefill plan`: the memory budget without running, from the free memory before the
//! engine starts (`--free`): weights, KV cache, compute buffer, what lies outside them, the
//! pool's reserve over the prefill, whether it fits, where a run dies if not, the peak device
//! memory, the largest context that fits and what to do; and its table and JSON (the
//! documented contract, docs/repro-prefill.md).

use super::predict_free::{stop_name, stop_text};
use super::{fail, pool_choice, usage, EXIT_OOM};
use crate::cli::{DeviceArg, FormatArg, RunArgs};
use crate::output;
use crate::scenario::{self, Device, GIB};
use crate::stdout;
use cupool::runtime::planner::{self, Advice, Outside, PlanTarget, Stop};
use cupool::runtime::{BudgetMode, Plan, RunConfig};
use serde_json::{json, Value};
use std::process::ExitCode;

/// The free memory a plan assumes without `--free`: a 12 GiB card with nothing else on it.
const DEFAULT_FREE_GIB: f64 = 12.0;

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
    if a.vram.is_some() {
        return usage(
            "--vram is the simulated card's size in a run; a plan starts from the free memory before the engine starts: give --free GIB (nvidia-smi's free memory)",
        );
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
    let free = match scenario::gib_bytes(a.free.unwrap_or(DEFAULT_FREE_GIB)) {
        Ok(f) => f,
        Err(e) => return usage(format!("--free: {e}")),
    };
    match pool_choice(&a) {
        // Unchosen, the kind stays automatic (vmm where supported) with the environment's
        // other settings.
        Ok((p, _)) => cfg.pool = p,
        Err(e) => return usage(e),
    }
    let mut target = match device_target(&a, &mut cfg) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let cc = match cfg.engine {
        cupool::runtime::profile::EngineKind::Profile { cc, .. } => cc,
        _ => crate::values::cc(&a.cc).unwrap_or(900),
    };
    target.free_bytes = free;
    target.outside = Outside::of(
        cfg.engine,
        scenario::engine_model(&a, &cfg).as_ref(),
        cfg.weight_type,
        cc,
    )
    .after_warm_up(cfg.engine, cfg.warm_up);
    // Name the pool the plan models (automatic: vmm where the device supports it).
    match cfg.pool.resolve(target.vmm) {
        Ok(k) => cfg.pool.kind = Some(k),
        Err(e) => return usage(e),
    }
    // The plan and its advice at once: the advice's work that the plan's answer does not
    // decide runs beside its search (the same answers as `plan` then `advise`).
    let (p, advice) = match planner::plan_and_advise(&cfg, &target, prompt) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let line = advice.line(cfg.n_ctx, &p);
    let describe = format!("{:.2} GiB free before start", free as f64 / GIB);
    match a.format {
        FormatArg::Json => {
            let scen = output::scenario_json(&cfg, prompt, &describe, "dry-run", Some(free));
            let v = plan_json(&p, &cfg, scen, &advice, &line);
            outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        FormatArg::Csv => stdout::out(&plan_csv(&p, &cfg)),
        FormatArg::Table => stdout::out(&(plan_table(&p, &cfg) + &line + "\n")),
    }
    if p.fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_OOM)
    }
}

/// VMM support and granularity: the GPU's on cuda (with its multiprocessors and compute
/// capability taken into `cfg`), else the simulated device's.
fn device_target(a: &RunArgs, cfg: &mut RunConfig) -> Result<PlanTarget, String> {
    let sim = PlanTarget {
        free_bytes: 0,
        vmm: !cfg.pool.no_vmm,
        granularity: 2 << 20,
        malloc_page: planner::GPU_MALLOC_PAGE,
        outside: Outside::NONE,
    };
    if a.device == DeviceArg::Sim {
        return Ok(sim);
    }
    let mut probe = a.clone();
    probe.free = None;
    let dev = Device::from_args(&probe)?;
    if !matches!(dev, Device::Cuda { .. }) {
        return Ok(sim);
    }
    dev.apply_facts(cfg);
    dev.driver()
        .and_then(|d| PlanTarget::of(d.as_ref()))
        .map_err(|e| e.to_string())
}

fn gib(b: usize) -> String {
    format!("{:.2} GiB", b as f64 / GIB)
}

/// The plan in the JSON output, with the scenario.
fn plan_json(p: &Plan, c: &RunConfig, scenario: Value, advice: &Advice, line: &str) -> Value {
    let o = &p.outside;
    let (change, lower) = match advice {
        Advice::Change { settings, .. } => (Some(settings.as_str()), None),
        Advice::Lower { max_ctx, .. } => (None, *max_ctx),
        Advice::Fits { .. } => (None, None),
    };
    json!({
        "scenario": scenario,
        "engine": c.engine.name(), "pool": c.pool.kind.map(|k| k.name()), "purge": c.purge.name(),
        "pool_peak_reserved_bytes": p.pool_peak_reserved_bytes, "pool_peak_live_bytes": p.pool_peak_live_bytes,
        "pool_driver_mallocs": p.pool_driver_mallocs,
        "kv_bytes": p.kv_bytes, "compute_bytes": p.compute_bytes, "weights_bytes": p.weights_bytes,
        "outside": {
            "cuda_context_bytes": o.cuda_context, "cublas_workspace_bytes": o.cublas_workspace,
            "kernel_modules_bytes": o.kernel_modules, "shim_hold_bytes": o.shim_hold,
            "output_buffer_bytes": o.output_buffer, "warm_up_graph_workspace_bytes": o.given_back,
        },
        "total_bytes": p.total_bytes, "peak_device_bytes": p.peak_device_bytes,
        "page_rounding_bytes": p.page_rounding_bytes,
        "device_bytes": p.device_bytes, "fits": p.fits, "stop": p.stop.map(stop_name),
        "max_ctx_that_fits": p.max_ctx_that_fits, "oom_at_token": p.oom_at_token,
        "advice": line, "advice_settings": change, "advice_ctx": lower,
    })
}

/// The plan as CSV: a header line and one row (an empty field where there is no value: no
/// context fits, the run does not die).
fn plan_csv(p: &Plan, c: &RunConfig) -> String {
    let opt = |v: Option<usize>| v.map_or(String::new(), |v| v.to_string());
    let row = [
        output::csv_field(&c.model.name),
        c.engine.name().to_string(),
        p.n_prompt.to_string(),
        c.n_ctx.to_string(),
        c.kv_type.name().to_string(),
        c.n_ubatch.to_string(),
        c.pool.kind.map_or("auto", |k| k.name()).to_string(),
        c.purge.name().to_string(),
        p.weights_bytes.to_string(),
        p.kv_bytes.to_string(),
        p.compute_bytes.to_string(),
        p.outside.at_compute().to_string(),
        p.outside.shim_hold.to_string(),
        p.pool_peak_reserved_bytes.to_string(),
        p.pool_peak_live_bytes.to_string(),
        p.pool_driver_mallocs.to_string(),
        p.total_bytes.to_string(),
        p.peak_device_bytes.to_string(),
        p.page_rounding_bytes.to_string(),
        p.device_bytes.to_string(),
        p.fits.to_string(),
        opt(p.max_ctx_that_fits),
        opt(p.oom_at_token),
    ];
    format!(
        "model,engine,prompt,ctx,kv_type,ubatch,pool,purge,weights_bytes,kv_bytes,compute_bytes,outside_bytes,hold_bytes,pool_peak_reserved_bytes,pool_peak_live_bytes,pool_driver_mallocs,total_bytes,peak_device_bytes,page_rounding_bytes,device_bytes,fits,max_ctx_that_fits,oom_at_token\n{}\n",
        row.join(",")
    )
}

/// The plan as a table: each part of the budget, the peak against the free memory, the
/// verdict (the advice line follows).
fn plan_table(p: &Plan, c: &RunConfig) -> String {
    let kind = c.pool.kind.map_or("auto", |k| k.name());
    let mut s = format!(
        "memory plan: {} ({} weights) prompt {} / ctx {}, {} KV, ubatch {}, engine {}, pool {kind}, purge {}\n\n",
        c.model.name,
        c.weight_type.name(),
        p.n_prompt,
        c.n_ctx,
        c.kv_type.name(),
        c.n_ubatch,
        c.engine.name(),
        c.purge.name()
    );
    let row = |what: &str, b: usize| format!("  {what:<34} {:>10}  ({b} bytes)\n", gib(b));
    for (what, b) in [
        ("weights", p.weights_bytes),
        ("KV cache", p.kv_bytes),
        ("compute buffer", p.compute_bytes),
    ] {
        s += &row(what, b);
    }
    for (what, b) in p.outside.terms() {
        if b > 0 {
            s += &row(what, b);
        }
    }
    let pool = if p.fits {
        "pool reserve (whole prefill)"
    } else {
        "pool reserve (until it runs out)"
    };
    s += &row(pool, p.pool_peak_reserved_bytes);
    if p.page_rounding_bytes > 0 {
        s += &row("whole driver pages, beyond sizes", p.page_rounding_bytes);
    }
    s += &row("peak device memory", p.peak_device_bytes);
    s += &format!(
        "  {:<34} {:>10}\n\n",
        "free before start",
        gib(p.device_bytes)
    );
    s += &format!("fits: {}\n", if p.fits { "yes" } else { "NO" });
    match (p.stop, p.oom_at_token) {
        (Some(Stop::Prefill), Some(t)) => {
            s +=
                &format!("the run dies at token {t} (simulated under this pool and purge policy)\n")
        }
        (Some(stop), _) => s += &format!("{}\n", stop_text(stop)),
        (None, _) => {}
    }
    s += &match p.max_ctx_that_fits {
        Some(c) => format!("largest context that fits (prompt filling it): {c} tokens\n"),
        None => {
            "no context fits: the weights and what lies outside them alone are too large\n".into()
        }
    };
    s
}
