//! `repro-prefill run` (the default): a prefill of one configuration, or with no pool chosen
//! the comparison of every fix; and its table, CSV and JSON (the JSON shape is the documented
//! contract, docs/repro-prefill.md).

use super::{fail, output_path, pool_choice, usage, EXIT_ERROR, EXIT_OOM};
use crate::cli::{ComputeArg, DeviceArg};
use crate::cli::{FormatArg, RunArgs};
use crate::estimate::Estimate;
use crate::output::mib;
use crate::scenario::{self, Device, Outcome};
use crate::{output, plot, stdout};
use cupool::runtime::RunReport;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::process::ExitCode;

/// Runs the prefill (or the comparison), prints it, and exits 0, 1 or 3 as documented in `--help`.
pub fn run(a: RunArgs) -> ExitCode {
    // A comparison runs when no pool is chosen; the choice is checked again below.
    let comparison = pool_choice(&a).is_ok_and(|(_, chosen)| !chosen);
    let user_log = crate::log::init(a.quiet, comparison);
    let prompt = a.prompt_tokens(false);
    // Every argument is checked before any work: a bad one costs no run and exits 2.
    if let Err(e) = check_outputs(&a) {
        return usage(e);
    }
    let model = match scenario::model_from_args(&a) {
        Ok(m) => m,
        Err(e) => return usage(e),
    };
    let mut base = match scenario::run_config(&a, &model, false) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let choice = match pool_choice(&a) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    if let Err(e) = check_executor(&a) {
        return usage(e);
    }
    let mut dev = match Device::from_args(&a) {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    dev.apply_facts(&mut base);
    let cc = match base.engine {
        cupool::runtime::profile::EngineKind::Profile { cc, .. } => cc,
        _ => crate::values::cc(&a.cc).unwrap_or(900),
    };
    // What the engine takes outside its buffers and pool comes out of the free memory first.
    dev.set_outside(&base, scenario::engine_model(&a, &base).as_ref(), cc);
    let (pool, single) = choice;
    let configs = if single {
        let mut c = base.clone();
        c.pool = pool;
        vec![c]
    } else {
        scenario::comparison(&base, &pool)
    };
    if matches!(dev, Device::Sim { backed: true, .. }) {
        let e = Estimate::measure(&base.model, prompt, configs.len());
        if let Err(refused) = e.allows(a.yes) {
            return usage(refused);
        }
        if !a.quiet {
            stdout::err(&e.note());
        }
    }
    let progress = (std::io::stderr().is_terminal() && !a.quiet).then(|| {
        let pb = indicatif::ProgressBar::new(prompt as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>22} [{bar:40}] {pos}/{len} tokens {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let mut outcomes: Vec<Outcome> = Vec::new();
    for mut c in configs {
        c.record_trace = a.trace.is_some();
        let o = scenario::run_one(&dev, c, prompt, progress.as_ref());
        if let (Some(path), Some(trace)) = (&a.trace, &o.trace) {
            let path = if single {
                path.clone()
            } else {
                path.with_extension(format!("{}.jsonl", o.label.replace(['/', '+'], "-")))
            };
            if let Err(e) = std::fs::write(&path, trace) {
                return fail(format!("writing the trace {}: {e}", path.display()));
            }
            if !a.quiet {
                stdout::err(&format!("wrote {}", path.display()));
            }
        }
        outcomes.push(o);
    }
    if let Some(pb) = &progress {
        pb.finish_and_clear();
    }
    let header = format!(
        "{} on {}: prompt {} / ctx {}, {} KV, -b {} -ub {}",
        base.model.name,
        dev.describe(),
        prompt,
        base.n_ctx,
        base.kv_type.name(),
        base.n_batch,
        base.n_ubatch
    );
    match a.format {
        FormatArg::Table => stdout::out(&run_table(&outcomes, &header)),
        FormatArg::Csv => stdout::out(&run_csv(&outcomes)),
        FormatArg::Json => {
            let v = serde_json::json!({
                "scenario": output::scenario_json(&base, prompt, &dev.describe(), dev.executor_name(), dev.card_bytes()),
                "runs": outcomes.iter().map(run_json).collect::<Vec<_>>(),
            });
            outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
    }
    if comparison && !a.quiet && !user_log {
        if let Some(line) = budget_summary(&outcomes) {
            stdout::err(&line);
        }
    }
    if let Some(path) = &a.plot {
        if let Err(e) = plot::write(path, &outcomes, dev.card_bytes(), &header) {
            return fail(e);
        }
        if !a.quiet {
            stdout::err(&format!("wrote {}", path.display()));
        }
    }
    if single {
        match &outcomes[0].report {
            Ok(r) if r.completed => ExitCode::SUCCESS,
            Ok(_) => ExitCode::from(EXIT_OOM),
            Err(_) => ExitCode::from(EXIT_ERROR),
        }
    } else if outcomes.iter().all(|o| o.report.is_err()) {
        // Nothing started: a script must not read this as a comparison that ran.
        let no_room = outcomes.iter().all(|o| o.did_not_fit);
        ExitCode::from(if no_room { EXIT_OOM } else { EXIT_ERROR })
    } else {
        ExitCode::SUCCESS
    }
}

/// The files the run is asked to write: a plot's format, and folders that exist.
fn check_outputs(a: &RunArgs) -> Result<(), String> {
    if let Some(p) = &a.plot {
        crate::canvas::format_of(p)?;
        output_path("--plot", p)?;
    }
    if let Some(t) = &a.trace {
        output_path("--trace", t)?;
    }
    Ok(())
}

/// What runs the maths: `--compute` is the simulated device's, and an engine profile's
/// requests are modelled without maths (the dry-run executor).
fn check_executor(a: &RunArgs) -> Result<(), String> {
    if a.compute.is_some() && a.device == DeviceArg::Cuda {
        return Err(
            "--compute applies to the simulated device; on cuda the kernels run on the GPU: drop --compute, or use --device sim"
                .into(),
        );
    }
    if let (Some(p), Some(ComputeArg::Cpu)) = (a.engine.profile(), a.compute) {
        return Err(format!(
            "--engine {}: an engine profile's requests are modelled on the dry-run executor, without maths: drop --compute cpu, or use --engine cupool for cupool's own kernels",
            crate::values::engine_name(p)
        ));
    }
    Ok(())
}

/// One line for the budget warnings a comparison kept out of the log.
fn budget_summary(outcomes: &[Outcome]) -> Option<String> {
    let ran: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o.report.as_ref().ok().map(|r| (o, r)))
        .collect();
    let over: Vec<_> = ran.iter().filter(|(_, r)| r.budget_warnings > 0).collect();
    if over.is_empty() {
        return None;
    }
    let dies: Vec<String> = over
        .iter()
        .filter_map(|(o, r)| {
            r.projected_oom_at_token
                .map(|t| format!("{} dies at token {t}", o.label))
        })
        .collect();
    let ends = match dies.len() {
        0 => "each completes".to_string(),
        n if n == over.len() => dies.join(", "),
        _ => format!("{}; the others complete", dies.join(", ")),
    };
    Some(format!(
        "warning: {} of {} configurations exceeded the compute budget reserved at startup (the compute buffer, as llama.cpp reserves it, without the pool's scratch); simulated at the first crossing, {ends} (RUST_LOG=warn shows each warning)",
        over.len(),
        ran.len()
    ))
}

/// One configuration's run in the JSON output.
fn run_json(o: &Outcome) -> Value {
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

/// The table: a row per configuration, then the managed fallback's and the OOM's notes.
fn run_table(outcomes: &[Outcome], header: &str) -> String {
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

/// The CSV: a row per ubatch of each configuration that ran.
fn run_csv(outcomes: &[Outcome]) -> String {
    let mut s = String::from("label,pool,purge,budget_mode,completed,oom_at_token,index,n_tokens,n_kv,live_peak_bytes,reserved_bytes,cached_bytes,device_used_bytes,budget_bytes,seconds\n");
    for o in outcomes {
        if let Ok(r) = &o.report {
            for u in &r.ubatches {
                s.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6}\n",
                    output::csv_field(&o.label),
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
