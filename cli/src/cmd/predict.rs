//! `repro-prefill predict`: what a real engine asks of its pool for a prefill (its profile's
//! requests, op by op, replayed through a pool on the simulated device); the arguments made
//! into the library's [`EngineRun`], and its table and JSON.

use super::{fail, usage, EXIT_OOM};
use crate::cli::{FormatArg, PredictArgs};
use crate::output::driver_calls;
use crate::{scenario, values};
use cupool::pool::PoolConfig;
use cupool::predict::{engine_trace, EngineRun, Prediction, Schedule};
use cupool::runtime::profile::{Device, EngineModel, Profile, Setup, Weights};
use std::process::ExitCode;

/// Predicts the engine's requests, writes them if asked, prints the replay; exits 3 when the
/// engine runs out of memory.
pub fn predict(a: PredictArgs) -> ExitCode {
    crate::init_logging(a.quiet, false);
    let run = match engine_run(&a) {
        Ok(r) => r,
        Err(e) => return usage(e),
    };
    let vram = match a.vram.map(scenario::gib_bytes).transpose() {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    let config = PoolConfig::default().kind(a.pool);
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
    let p = match trace.replay(&config, a.purge, vram) {
        Ok(p) => p,
        Err(e) => return usage(e.to_string()),
    };
    print(&a, &run, &p);
    if p.oom_at_token.is_some() {
        ExitCode::from(EXIT_OOM)
    } else {
        ExitCode::SUCCESS
    }
}

/// The engine's prefill the arguments ask for, or what is wrong with them and what is
/// accepted.
fn engine_run(a: &PredictArgs) -> Result<EngineRun, String> {
    let Some(profile) = a.engine.profile() else {
        let names: Vec<String> = Profile::ALL.map(values::engine_name).into();
        return Err(format!(
            "--engine cupool: predict needs an engine profile: accepted are {} (repro-prefill run models cupool's own traffic)",
            names.join(", ")
        ));
    };
    let Some(mut model) = EngineModel::preset(&a.model) else {
        return Err(format!(
            "--model {:?}: the {} profile models the presets {}",
            a.model,
            profile.name(),
            EngineModel::PRESETS.join(", ")
        ));
    };
    if a.fa_occupancy == Some(0) {
        return Err("--fa-occupancy 0: accepted is 1 or more blocks per SM".into());
    }
    if let Some(mla) = &mut model.mla {
        mla.attn_max_batch_mib = a.amb;
    }
    let Some(weights) = Weights::parse(&a.weight_type) else {
        return Err(format!(
            "--weight-type {:?}: accepted are f16, q8_0",
            a.weight_type
        ));
    };
    let Some(cc) = a
        .cc
        .split_once('.')
        .and_then(|(ma, mi)| Some(ma.parse::<u32>().ok()? * 100 + mi.parse::<u32>().ok()? * 10))
    else {
        return Err(format!(
            "--cc {:?}: accepted is MAJOR.MINOR, e.g. 9.0",
            a.cc
        ));
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
    let dev = Device {
        cc,
        nsm: a.sm,
        occupancy: a.fa_occupancy,
    };
    Ok(EngineRun {
        profile,
        setup: Setup {
            model,
            weights,
            kv: a.kv_type,
            dev,
        },
        schedule,
    })
}

/// The prediction in `--format` (csv: as the table).
fn print(a: &PredictArgs, run: &EngineRun, p: &Prediction) {
    let r = &p.replay;
    match a.format {
        FormatArg::Json => outln!("{}", serde_json::to_string_pretty(p).unwrap_or_default()),
        FormatArg::Table | FormatArg::Csv => {
            let what = match run.schedule {
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
                run.profile.name(),
                run.profile.commit(),
                a.model,
                a.weight_type,
                run.setup.kv,
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
}
