//! `predict --free`: the engine's start-up buffers and what lies outside them taken from the
//! free memory before it starts, the pool's room derived, and the plan's verdict beside the
//! replay (the peak device memory, the largest context that fits).

use crate::cli::PredictArgs;
use crate::gguf::GgufInput;
use crate::scenario::GIB;
use cupool::predict::{EngineRun, Prediction, Schedule};
use cupool::runtime::planner::weights::device_weight_bytes;
use cupool::runtime::planner::{self, Outside, PlanTarget, Stop};
use cupool::runtime::profile::EngineKind;
use cupool::runtime::{ModelShape, RunConfig};
use serde_json::{json, Value};

/// The device a prediction runs on, from its free memory.
pub struct FreeDevice {
    /// Free before the engine starts.
    pub free: usize,
    /// The context the buffers are sized for.
    pub ctx: usize,
    /// Weights, KV cache, compute buffer.
    pub buffers: (usize, usize, usize),
    /// What lies outside them.
    pub outside: Outside,
    /// The pool's room, or `None` when the run stops before its pool asks for anything.
    pub room: Option<usize>,
    /// How it stops before that.
    pub stop: Option<Stop>,
    /// The largest context that fits (a prompt filling it).
    pub max_ctx: Option<usize>,
}

/// The context: `--ctx`, else the prompt or the sweep's steps, rounded up to 256.
fn ctx(a: &PredictArgs, run: &EngineRun) -> usize {
    a.ctx.unwrap_or_else(|| {
        let tokens = match run.schedule {
            Schedule::Prompt { tokens, .. } => tokens,
            Schedule::Sweep { steps, ubatch } => steps * ubatch,
        };
        tokens.next_multiple_of(256)
    })
}

/// The engine's run as the planner models it, with `free` bytes free before it starts.
/// With a model file (`file`), its shape and its weights' bytes as its header gives them.
pub fn device(
    a: &PredictArgs,
    run: &EngineRun,
    free: usize,
    file: Option<&GgufInput>,
) -> Result<FreeDevice, String> {
    let n_ctx = ctx(a, run);
    let mut cfg = match file {
        Some(g) => {
            let mut c = RunConfig::new(g.shape.clone(), n_ctx);
            c.weights_bytes = g.device_bytes;
            c
        }
        None => {
            let model = ModelShape::preset(&a.model).map_err(|e| e.to_string())?;
            let wt =
                crate::values::weight_type(a.weight_type.as_deref(), &a.model, Some(run.profile))?;
            let mut c = RunConfig::new(model, n_ctx);
            c.weights_bytes = device_weight_bytes(&run.setup.model, wt);
            c
        }
    };
    cfg.kv_type = run.setup.kv;
    cfg.warm_up = run.warm_up;
    cfg.n_ubatch = a.ubatch;
    cfg.n_batch = a.batch.max(a.ubatch);
    cfg.weight_type = run.setup.weights;
    // The model the replay runs (a file's, or the preset's with its `--amb`) is the plan's.
    cfg.engine_model = Some(run.setup.model.clone());
    cfg.engine = EngineKind::Profile {
        profile: run.profile,
        cc: run.setup.dev.cc,
    };
    cfg.sms = a.sm;
    cfg.fa_occupancy = a.fa_occupancy;
    cfg.purge = a.purge;
    cfg.pool = cupool::pool::PoolConfig::default().kind(a.pool);
    let tokens = match run.schedule {
        Schedule::Prompt { tokens, .. } => tokens,
        Schedule::Sweep { steps, ubatch } => steps * ubatch,
    };
    if tokens > n_ctx {
        return Err(format!(
            "--ctx {n_ctx}: the run processes {tokens} tokens: give a context of at least that"
        ));
    }
    cfg.validate().map_err(|e| e.to_string())?;
    let outside = Outside::of(
        cfg.engine,
        Some(&run.setup.model),
        cfg.weight_type,
        run.setup.dev.cc,
    )
    .after_warm_up(cfg.engine, cfg.warm_up);
    let target = PlanTarget {
        free_bytes: free,
        vmm: true,
        granularity: 2 << 20,
        malloc_page: planner::GPU_MALLOC_PAGE,
        outside,
    };
    let (room, stop) = match planner::pool_room(&cfg, &target) {
        Ok(r) => (Some(r), None),
        Err(s) => (None, Some(s)),
    };
    let max_ctx = planner::max_ctx_that_fits(&cfg, &target).map_err(|e| e.to_string())?;
    Ok(FreeDevice {
        free,
        ctx: n_ctx,
        buffers: cfg.startup_bytes(n_ctx),
        outside,
        room,
        stop,
        max_ctx,
    })
}

impl FreeDevice {
    /// The peak device memory: the buffers, what lies outside them and the pool's peak (or the
    /// start-up's, with its hold), each device allocation in whole pages (the replay's card
    /// counts the pool's so).
    pub fn peak(&self, p: &Prediction) -> usize {
        let page = |b: usize| cupool::pool::driver::in_pages(b, planner::GPU_MALLOC_PAGE);
        let b = page(self.buffers.0) + page(self.buffers.1) + page(self.buffers.2);
        let run = match self.stop {
            Some(_) => 0,
            None => {
                let r = &p.replay;
                let pool = r.peak_device_bytes.unwrap_or(r.peak_reserved_bytes);
                b + self.outside.held_beside(pool, self.room) + pool
            }
        };
        run.max(b + self.outside.at_startup())
    }

    /// The JSON object `free`.
    pub fn json(&self, p: &Prediction) -> Value {
        let o = &self.outside;
        json!({
            "free_bytes": self.free, "ctx": self.ctx,
            "weights_bytes": self.buffers.0, "kv_bytes": self.buffers.1, "compute_bytes": self.buffers.2,
            "outside": {
                "cuda_context_bytes": o.cuda_context, "cublas_workspace_bytes": o.cublas_workspace,
                "kernel_modules_bytes": o.kernel_modules, "shim_hold_bytes": o.shim_hold,
                "output_buffer_bytes": o.output_buffer, "warm_up_graph_workspace_bytes": o.given_back,
            },
            "pool_room_bytes": self.room, "stop": self.stop.map(stop_name),
            "peak_device_bytes": self.peak(p),
            "fits": self.stop.is_none() && p.oom_at_token.is_none(),
            "max_ctx_that_fits": self.max_ctx,
        })
    }

    /// The table's lines after the pool's.
    pub fn table(&self, p: &Prediction) -> String {
        let g = |b: usize| format!("{:.2} GiB", b as f64 / GIB);
        let (w, kv, c) = self.buffers;
        let mut s = format!(
            "from {} free before start, -c {}: weights {}, KV cache {}, compute buffer {}, outside them {}\n",
            g(self.free),
            self.ctx,
            g(w),
            g(kv),
            g(c),
            g(self.outside.at_compute().max(self.outside.at_startup()))
        );
        s += &match (self.room, self.stop) {
            (Some(r), _) => format!("  the pool's room {}\n", g(r)),
            (None, Some(stop)) => format!("  {}\n", stop_text(stop)),
            (None, None) => String::new(),
        };
        s += &format!("  peak device memory {}\n", g(self.peak(p)));
        s += &match self.max_ctx {
            Some(m) => format!("  largest context that fits (a prompt filling it): {m}\n"),
            None => "  no context fits\n".into(),
        };
        s
    }
}

/// A stop's name in the JSON output.
pub fn stop_name(s: Stop) -> &'static str {
    match s {
        Stop::StartUp => "start-up",
        Stop::FirstCompute => "first-compute",
        Stop::Prefill => "prefill",
    }
}

/// A stop in words.
pub fn stop_text(s: Stop) -> &'static str {
    match s {
        Stop::StartUp => "the context is not created: its buffers do not fit beside the CUDA context (and the start-up hold, where there is one)",
        Stop::FirstCompute => "the run dies at its first compute: what it loads (cuBLAS workspace, kernel modules) does not fit beside the buffers",
        Stop::Prefill => "the run dies in the prefill, in its pool",
    }
}
