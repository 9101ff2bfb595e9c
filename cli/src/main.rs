//! `repro-prefill`: reproduces the long-context prefill OOM and shows each fix.

#[macro_use]
mod stdout;
mod cli;
mod estimate;
mod llama_args;
mod output;
mod plot;
mod scenario;

use cupool::trace as replay;

use clap::Parser;
use cli::{Cli, Command, FormatArg, PredictArgs, ReplayArgs, RunArgs};
use cupool::pool::PoolConfig;
use cupool::runtime::planner::{plan, PlanTarget};
use scenario::{Device, Outcome};
use std::io::IsTerminal;
use std::process::ExitCode;

const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_OOM: u8 = 3;

/// Installs the log; returns whether `RUST_LOG` chose its filter. A comparison (`summarize`)
/// keeps each configuration's budget warning out of the default log and says it once after
/// the table (`budget_summary`).
fn init_logging(quiet: bool, summarize: bool) -> bool {
    let default = match (quiet, summarize) {
        (true, _) => "error",
        (false, true) => "warn,cupool_runtime::budget=error",
        (false, false) => "warn",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let user = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    user
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

fn main() -> ExitCode {
    let args = match llama_args::rewrite(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    let cli = Cli::parse_from(args);
    match cli.command {
        Some(Command::Run(a)) => run(a),
        None => run(cli.run),
        Some(Command::Plan(a)) => plan_cmd(a),
        Some(Command::Replay(a)) => replay_cmd(a),
        Some(Command::Predict(a)) => predict_cmd(a),
    }
}

fn usage(msg: impl std::fmt::Display) -> ExitCode {
    stdout::err(&format!("error: {msg}"));
    ExitCode::from(EXIT_USAGE)
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    stdout::err(&format!("error: {msg}"));
    ExitCode::from(EXIT_ERROR)
}

/// The pool settings: `--pool` and `--fallback-managed` over the environment; and whether
/// they chose a pool (else the comparison runs, each row with these settings but its kind).
fn pool_choice(a: &RunArgs) -> Result<(PoolConfig, bool), String> {
    let mut env = PoolConfig::from_env().map_err(|e| e.to_string())?;
    if let Some(p) = a.pool {
        env.kind = Some(p);
    }
    env.fallback_managed |= a.fallback_managed;
    let chosen = env.kind.is_some() || a.fallback_managed;
    Ok((env, chosen))
}

fn run(a: RunArgs) -> ExitCode {
    // A comparison runs when no pool is chosen; the choice is checked again below.
    let comparison = pool_choice(&a).is_ok_and(|(_, chosen)| !chosen);
    let user_log = init_logging(a.quiet, comparison);
    let prompt = a.prompt_tokens(false);
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
    let dev = match Device::from_args(&a) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    dev.apply_facts(&mut base);
    let (pool, single) = choice;
    let configs = if single {
        let mut c = base.clone();
        c.pool = pool;
        vec![c]
    } else {
        scenario::comparison(&base, &pool)
    };
    if matches!(dev, Device::Sim { backed: true, .. }) && !a.quiet {
        stdout::err(&estimate::note(&base.model, prompt, configs.len()));
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
        FormatArg::Table => stdout::out(&output::run_table(&outcomes, &header)),
        FormatArg::Csv => stdout::out(&output::run_csv(&outcomes)),
        FormatArg::Json => {
            let v = serde_json::json!({
                "scenario": output::scenario_json(&base, prompt, &dev.describe(), dev.executor_name(), dev.card_bytes()),
                "runs": outcomes.iter().map(output::run_json).collect::<Vec<_>>(),
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

fn plan_cmd(a: RunArgs) -> ExitCode {
    init_logging(a.quiet, false);
    // Options of a run that a plan has no use for: refused, not silently ignored.
    if a.format == FormatArg::Csv {
        return usage("plan has no csv output: use --format table or --format json");
    }
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
            a.budget != cli::BudgetArg::Ggml,
            "--budget",
            "plan prints the planned budget itself",
        ),
        (
            a.fallback_managed,
            "--fallback-managed",
            "plan models the pool on a card it never fills",
        ),
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
    let p = match plan(&cfg, &target, prompt) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match a.format {
        FormatArg::Json => {
            let scen =
                output::scenario_json(&cfg, prompt, &dev.describe(), "dry-run", dev.card_bytes());
            outln!(
                "{}",
                serde_json::to_string_pretty(&output::plan_json(&p, &cfg, scen))
                    .unwrap_or_default()
            );
        }
        _ => stdout::out(&output::plan_table(&p, &cfg)),
    }
    if p.fits {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_OOM)
    }
}

fn replay_cmd(a: ReplayArgs) -> ExitCode {
    init_logging(a.quiet, false);
    let text = match std::fs::read_to_string(&a.trace) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return usage(format!(
                "{} is not UTF-8 text: a trace is JSON lines",
                a.trace.display()
            ))
        }
        Err(e) => return fail(format!("reading {}: {e}", a.trace.display())),
    };
    let ops = match replay::parse(&text) {
        Ok(o) => o,
        Err(e) => return usage(format!("{}: {e}", a.trace.display())),
    };
    let vram = match a.vram.map(scenario::gib_bytes).transpose() {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    // The environment's settings (CUPOOL_VMM_ROUND_LARGE, ...), with the pool asked for.
    let config = match PoolConfig::from_env() {
        Ok(mut c) => {
            c.kind = Some(a.pool);
            if let Some(r) = a.round_large {
                c.vmm.large_rounding = r;
            }
            if let Some(s) = &a.size_classes {
                match cupool::pool::config::parse_size_classes(s) {
                    Ok(b) => c.size_classes = b,
                    Err(e) => return usage(e.to_string()),
                }
            }
            if let Err(e) = c.validate() {
                return usage(e.to_string());
            }
            c
        }
        Err(e) => return usage(e.to_string()),
    };
    let r = match replay::replay(&ops, &config, scenario::purge_policy(a.purge), vram) {
        Ok(r) => r,
        Err(e) => return usage(format!("{}: {e}", a.trace.display())),
    };
    match a.format {
        FormatArg::Json => outln!("{}", serde_json::to_string_pretty(&r).unwrap_or_default()),
        FormatArg::Csv => {
            outln!("pool,purge,events,peak_live_bytes,peak_reserved_bytes,end_reserved_bytes,driver_mallocs,driver_frees,driver_maps,driver_unmaps,ooms");
            outln!(
                "{},{},{},{},{},{},{},{},{},{},{}",
                r.pool,
                r.purge,
                r.events,
                r.peak_live_bytes,
                r.peak_reserved_bytes,
                r.end_reserved_bytes,
                r.driver_mallocs,
                r.driver_frees,
                r.driver_maps,
                r.driver_unmaps,
                r.ooms
            );
        }
        FormatArg::Table => {
            outln!(
                "replay of {} ({} events) through {} / purge {}",
                a.trace.display(),
                r.events,
                r.pool,
                r.purge
            );
            outln!("  peak live      {:>14} bytes", r.peak_live_bytes);
            outln!("  peak reserved  {:>14} bytes", r.peak_reserved_bytes);
            outln!("  end reserved   {:>14} bytes", r.end_reserved_bytes);
            outln!("  driver calls   {}", driver_calls(&r));
            outln!("  OOMs           {}", r.ooms);
        }
    }
    ExitCode::SUCCESS
}

fn predict_cmd(a: PredictArgs) -> ExitCode {
    use cupool::predict::{engine_trace, EngineRun, Schedule};
    use cupool::runtime::profile::{EngineModel, Weights};
    init_logging(a.quiet, false);
    let Some(profile) = a.engine.profile() else {
        return usage(
            "--engine cupool: predict needs an engine profile: accepted are ik-llama, llama-b8833, llama (repro-prefill run models cupool's own traffic)",
        );
    };
    let Some(mut model) = EngineModel::preset(&a.model) else {
        return usage(format!(
            "--model {:?}: the {} profile models the presets {}",
            a.model,
            profile.name(),
            EngineModel::PRESETS.join(", ")
        ));
    };
    if a.fa_occupancy == Some(0) {
        return usage("--fa-occupancy 0: accepted is 1 or more blocks per SM");
    }
    if let Some(mla) = &mut model.mla {
        mla.attn_max_batch_mib = a.amb;
    }
    let Some(weights) = Weights::parse(&a.weight_type) else {
        return usage(format!(
            "--weight-type {:?}: accepted are f16, q8_0",
            a.weight_type
        ));
    };
    let cc = match a
        .cc
        .split_once('.')
        .and_then(|(ma, mi)| Some(ma.parse::<u32>().ok()? * 100 + mi.parse::<u32>().ok()? * 10))
    {
        Some(cc) => cc,
        None => {
            return usage(format!(
                "--cc {:?}: accepted is MAJOR.MINOR, e.g. 9.0",
                a.cc
            ))
        }
    };
    let vram = match a.vram.map(scenario::gib_bytes).transpose() {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    let schedule = match a.sweep {
        Some(steps) => Schedule::Sweep {
            steps,
            ubatch: a.ubatch,
        },
        None => Schedule::Prompt {
            tokens: a.prompt,
            batch: a.batch,
            ubatch: a.ubatch,
        },
    };
    let dev = cupool::runtime::profile::Device {
        cc,
        nsm: a.sm,
        occupancy: a.fa_occupancy,
    };
    let kv = scenario::kv_type(a.kv_type);
    let config = PoolConfig::default().kind(a.pool);
    let purge = scenario::purge_policy(a.purge);
    let run = EngineRun {
        profile,
        setup: cupool::runtime::profile::Setup {
            model,
            weights,
            kv,
            dev,
        },
        schedule,
    };
    // One trace: written if asked for, then replayed.
    let trace = match engine_trace(&run) {
        Ok(t) => t,
        Err(e) => return usage(e.to_string()),
    };
    if let Some(path) = &a.trace_out {
        let text: String = trace.ops.iter().map(|o| o.to_json() + "\n").collect();
        if let Err(e) = std::fs::write(path, text) {
            return fail(format!("writing {}: {e}", path.display()));
        }
        if !a.quiet {
            eprintln!("wrote {}", path.display());
        }
    }
    let p = match trace.replay(&config, purge, vram) {
        Ok(p) => p,
        Err(e) => return usage(e.to_string()),
    };
    let r = &p.replay;
    match a.format {
        FormatArg::Json => outln!("{}", serde_json::to_string_pretty(&p).unwrap_or_default()),
        FormatArg::Table | FormatArg::Csv => {
            let what = match schedule {
                Schedule::Prompt {
                    tokens,
                    batch,
                    ubatch,
                } => format!("a {tokens}-token prompt, -b {batch} -ub {ubatch}"),
                Schedule::Sweep { steps, ubatch } => {
                    format!("llama-sweep-bench -n 1, {steps} steps of {ubatch}")
                }
            };
            outln!(
                "{} ({}): {}, {} weights, {:?} KV, {what}, {} SMs, cc {}",
                profile.name(),
                profile.commit(),
                a.model,
                a.weight_type,
                kv,
                a.sm,
                a.cc
            );
            outln!("through {} / purge {}:", r.pool, r.purge);
            let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
            outln!(
                "  peak reserved  {:>14} bytes ({:.1} MiB)",
                r.peak_reserved_bytes,
                mib(r.peak_reserved_bytes)
            );
            outln!(
                "  peak live      {:>14} bytes ({:.1} MiB)",
                r.peak_live_bytes,
                mib(r.peak_live_bytes)
            );
            outln!("  end reserved   {:>14} bytes", r.end_reserved_bytes);
            outln!("  driver calls   {}", driver_calls(r));
            match p.oom_at_token {
                Some(t) => outln!(
                    "  runs out of memory in the ubatch from token {t} ({} allocations failed)",
                    r.ooms
                ),
                None => outln!("  no allocation runs out of memory"),
            }
        }
    }
    if p.oom_at_token.is_some() {
        ExitCode::from(EXIT_OOM)
    } else {
        ExitCode::SUCCESS
    }
}

/// A replay's driver traffic, for the tables.
fn driver_calls(r: &replay::ReplayReport) -> String {
    format!(
        "{} mallocs, {} frees, {} maps, {} unmaps",
        r.driver_mallocs, r.driver_frees, r.driver_maps, r.driver_unmaps
    )
}
