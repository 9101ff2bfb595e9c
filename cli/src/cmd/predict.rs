//! `repro-prefill predict`: what a real engine asks of its pool for a prefill (its profile's
//! requests, op by op, replayed through a pool on the simulated device); the arguments made
//! into the library's [`EngineRun`], and its table and JSON.

use super::predict_free::{device, FreeDevice};
use super::{fail, usage, EXIT_OOM};
use crate::cli::{FormatArg, PredictArgs};
use crate::gguf::GgufInput;
use crate::output::driver_calls;
use crate::{scenario, stdout, values};
use cupool::pool::trace::Card;
use cupool::pool::PoolConfig;
use cupool::predict::{engine_trace, EngineRun, Prediction, Schedule};
use cupool::runtime::profile::{Device, EngineModel, Setup};
use std::process::ExitCode;

/// Predicts the engine's requests, writes them if asked, prints the replay; exits 3 when the
/// engine runs out of memory.
pub fn predict(mut a: PredictArgs) -> ExitCode {
    crate::log::init(a.quiet, false);
    // A model file is read once; its name stands for the model in what is printed.
    let file = match a.gguf.as_deref().map(crate::gguf::read).transpose() {
        Ok(f) => f,
        Err(e) => return usage(e),
    };
    if let Some(g) = &file {
        a.model = g.shape.name.clone();
    }
    let run = match engine_run(&a, file.as_ref()) {
        Ok(r) => r,
        Err(e) => return usage(e),
    };
    if let Some(path) = &a.trace_out {
        if let Err(e) = super::output_path("--trace-out", path) {
            return usage(e);
        }
    }
    let free = match a.free.map(scenario::gib_bytes).transpose() {
        Ok(v) => v,
        Err(e) => return usage(format!("--free: {e}")),
    };
    let dev = match free.map(|f| device(&a, &run, f, file.as_ref())).transpose() {
        Ok(d) => d,
        Err(e) => return usage(e),
    };
    // The engine's pool as libcupool builds it (size classes and rounding for vmm).
    let mut config = PoolConfig::default().kind(a.pool);
    cupool::pool::layering::Layering::default().apply(&mut config);
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
    // The pool's room: what the buffers and what lies outside them leave of the free memory;
    // a run that stops before its pool asks for anything replays nothing.
    // Its allocations take whole pages there, as on the GPU (and in `plan`'s dry runs).
    let card = match &dev {
        // ggml aborts at the first allocation its pool cannot make: the run's figures end there.
        Some(d) => Card {
            bytes: Some(d.room.unwrap_or(0).max(1)),
            malloc_page: cupool::runtime::planner::GPU_MALLOC_PAGE,
            stop_at_first_oom: true,
        },
        None => Card::of(None),
    };
    let mut p = match trace.replay(&config, a.purge, card) {
        Ok(p) => p,
        Err(e) => return usage(e.to_string()),
    };
    if let Some(FreeDevice { stop: Some(_), .. }) = &dev {
        p.oom_at_token = Some(0);
    }
    print(&a, &run, &p, dev.as_ref());
    if p.oom_at_token.is_some() {
        ExitCode::from(EXIT_OOM)
    } else {
        ExitCode::SUCCESS
    }
}

/// The engine's prefill the arguments ask for, or what is wrong with them and what is
/// accepted.
fn engine_run(a: &PredictArgs, file: Option<&GgufInput>) -> Result<EngineRun, String> {
    let profile = a.engine;
    let preset = match file {
        Some(g) => {
            crate::gguf::check_weights(g, Some(profile))?;
            Some(g.engine.clone())
        }
        None => EngineModel::preset(&a.model),
    };
    let Some(mut model) = preset else {
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
    let weights = match file {
        Some(g) => g.weight_type.path(),
        None => values::weight_type(a.weight_type.as_deref(), &a.model, Some(profile))?.path(),
    };
    let cc = values::cc(&a.cc)?;
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
        warm_up: !a.no_warmup,
    })
}

/// The prediction in `--format`.
fn print(a: &PredictArgs, run: &EngineRun, p: &Prediction, dev: Option<&FreeDevice>) {
    match a.format {
        FormatArg::Json => {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            if let (Some(d), Some(o)) = (dev, v.as_object_mut()) {
                o.insert("free".into(), d.json(p));
            }
            outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())
        }
        FormatArg::Csv => stdout::out(&csv(a, run, p)),
        FormatArg::Table => {
            let mut s = table(a, run, p);
            if let Some(d) = dev {
                s += &d.table(p);
            }
            stdout::out(&s)
        }
    }
}

/// The prediction as CSV: a header line and one row (an empty field where a column does not
/// apply: a sweep has no prompt, a run that never runs out no token of its end).
fn csv(a: &PredictArgs, run: &EngineRun, p: &Prediction) -> String {
    let r = &p.replay;
    let (schedule, prompt, steps, batch, ubatch) = match run.schedule {
        Schedule::Prompt {
            tokens,
            batch,
            ubatch,
        } => (
            "prompt",
            tokens.to_string(),
            String::new(),
            batch.to_string(),
            ubatch,
        ),
        Schedule::Sweep { steps, ubatch } => (
            "sweep",
            String::new(),
            steps.to_string(),
            String::new(),
            ubatch,
        ),
    };
    let row = [
        run.profile.name().to_string(),
        run.profile.commit().to_string(),
        a.model.clone(),
        run.setup.weights.name().to_string(),
        run.setup.kv.name().to_string(),
        schedule.to_string(),
        prompt,
        steps,
        batch,
        ubatch.to_string(),
        a.sm.to_string(),
        a.cc.clone(),
        r.pool.to_string(),
        r.purge.to_string(),
        r.peak_live_bytes.to_string(),
        r.peak_reserved_bytes.to_string(),
        r.end_reserved_bytes.to_string(),
        r.driver_mallocs.to_string(),
        r.driver_frees.to_string(),
        r.driver_maps.to_string(),
        r.driver_unmaps.to_string(),
        r.ooms.to_string(),
        p.oom_at_token.map_or(String::new(), |t| t.to_string()),
    ];
    format!("{CSV_HEADER}\n{}\n", row.join(","))
}

/// The columns of [`csv`].
const CSV_HEADER: &str = "engine,commit,model,weight_type,kv_type,schedule,prompt_tokens,sweep_steps,batch,ubatch,sm,cc,pool,purge,peak_live_bytes,peak_reserved_bytes,end_reserved_bytes,driver_mallocs,driver_frees,driver_maps,driver_unmaps,ooms,oom_at_token";

/// The prediction as a table: what was predicted, then the pool's figures.
fn table(a: &PredictArgs, run: &EngineRun, p: &Prediction) -> String {
    let r = &p.replay;
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
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    let mut s = format!(
        "{} ({}): {}, {} weights, {} KV, {what}, {} SMs, cc {}\n",
        run.profile.name(),
        run.profile.commit(),
        a.model,
        run.setup.weights.name(),
        run.setup.kv.name(),
        a.sm,
        a.cc
    );
    s += &format!("through {} / purge {}:\n", r.pool, r.purge);
    s += &format!(
        "  peak reserved  {:>14} bytes ({:.1} MiB)\n",
        r.peak_reserved_bytes,
        mib(r.peak_reserved_bytes)
    );
    s += &format!(
        "  peak live      {:>14} bytes ({:.1} MiB)\n",
        r.peak_live_bytes,
        mib(r.peak_live_bytes)
    );
    s += &format!("  end reserved   {:>14} bytes\n", r.end_reserved_bytes);
    s += &format!("  driver calls   {}\n", driver_calls(r));
    s += &match p.oom_at_token {
        Some(t) => format!(
            "  runs out of memory in the ubatch from token {t}: the engine stops at that allocation\n"
        ),
        None => "  no allocation runs out of memory\n".to_string(),
    };
    s
}
