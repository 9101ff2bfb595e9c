//! Models, configurations and runs from the arguments (the device they run on: [`crate::device`]).

use crate::cli::RunArgs;
pub use crate::device::{gib_bytes, Device, GIB};
use crate::gguf::GgufInput;
use cupool::pool::layering::Layering;
use cupool::pool::{PoolConfig, PoolKind};
use cupool::runtime::planner::weights::device_weight_bytes;
use cupool::runtime::profile::EngineModel;
use cupool::runtime::{
    BudgetMode, ModelShape, PurgePolicy, RunConfig, RunReport, Runtime, RuntimeError,
};

/// The model the arguments name: a preset with its overrides, or a GGUF file's.
pub struct Model {
    /// Its shape.
    pub shape: ModelShape,
    /// The file it was read from (`--gguf`), with its engine model and weights.
    pub file: Option<GgufInput>,
}

pub fn model_from_args(a: &RunArgs) -> Result<Model, String> {
    if let Some(path) = &a.gguf {
        let g = crate::gguf::read(path)?;
        crate::gguf::check_weights(&g, a.engine.profile())?;
        g.shape
            .validate(a.kv_type)
            .map_err(|e| format!("--gguf {}: {e}", path.display()))?;
        return Ok(Model {
            shape: g.shape.clone(),
            file: Some(g),
        });
    }
    Ok(Model {
        shape: preset_shape(a)?,
        file: None,
    })
}

/// The preset's shape with the dimensions' overrides.
fn preset_shape(a: &RunArgs) -> Result<ModelShape, String> {
    let mut m = ModelShape::preset(&a.model).map_err(|e| e.to_string())?;
    let overrides: Vec<String> = [
        ("n_layer", a.n_layer),
        ("n_embd", a.n_embd),
        ("n_head", a.n_head),
        ("n_head_kv", a.n_head_kv),
        ("head_dim_k", a.head_dim_k),
        ("head_dim_v", a.head_dim_v),
        ("n_ff", a.n_ff),
    ]
    .iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
    .chain(a.v_is_k.then(|| "v_is_k".to_string()))
    .collect();
    m.n_layer = a.n_layer.unwrap_or(m.n_layer);
    m.n_embd = a.n_embd.unwrap_or(m.n_embd);
    m.n_head = a.n_head.unwrap_or(m.n_head);
    m.n_head_kv = a.n_head_kv.unwrap_or(m.n_head_kv);
    m.head_dim_k = a.head_dim_k.unwrap_or(m.head_dim_k);
    m.head_dim_v = a.head_dim_v.unwrap_or(m.head_dim_v);
    m.n_ff = a.n_ff.unwrap_or(m.n_ff);
    m.v_is_k |= a.v_is_k;
    m.validate(a.kv_type).map_err(|e| e.to_string())?;
    if !overrides.is_empty() {
        m.name = format!("{} with {}", m.name, overrides.join(" "));
    }
    Ok(m)
}

/// The model as the engines' graphs see it: a GGUF file's (in `c`), else the preset with the
/// shape's overrides (what sizes its weights), or `None` for a name no preset has.
pub fn engine_model(a: &RunArgs, c: &RunConfig) -> Option<EngineModel> {
    if c.engine_model.is_some() {
        return c.engine_model.clone();
    }
    preset_engine_model(a)
}

fn preset_engine_model(a: &RunArgs) -> Option<EngineModel> {
    let mut m = EngineModel::preset(&a.model)?;
    m.n_layer = a.n_layer.unwrap_or(m.n_layer);
    m.n_embd = a.n_embd.unwrap_or(m.n_embd);
    m.n_head = a.n_head.unwrap_or(m.n_head);
    m.n_head_kv = a.n_head_kv.unwrap_or(m.n_head_kv);
    m.head_dim = a.head_dim_k.unwrap_or(m.head_dim);
    m.n_ff = a.n_ff.unwrap_or(m.n_ff);
    Some(m)
}

/// The base configuration from the arguments (pool settings filled in by the caller).
pub fn run_config(a: &RunArgs, m: &Model, plan: bool) -> Result<RunConfig, String> {
    let mut c = RunConfig::new(m.shape.clone(), a.ctx);
    // An engine profile's pool takes libcupool's defaults, as under the shim, for each of
    // them the environment leaves unset.
    c.layering = Layering::unless_set(|n| std::env::var_os(n).is_some());
    c.kv_type = a.kv_type;
    c.n_batch = a.batch;
    c.n_ubatch = a.ubatch;
    let wt = match &m.file {
        Some(g) => g.weight_type,
        None => crate::values::weight_type(a.weight_type.as_deref(), &a.model, a.engine.profile())?,
    };
    c.weight_type = wt.path();
    c.engine_model = m.file.as_ref().map(|g| g.engine.clone());
    c.weights_bytes = match (a.weights, &m.file, preset_engine_model(a)) {
        (Some(g), _, _) => gib_bytes(g)?,
        // The file's own bytes, as its header gives them.
        (None, Some(g), _) => g.device_bytes,
        (None, None, Some(em)) => device_weight_bytes(&em, wt),
        (None, None, None) => m.shape.weights_bytes,
    };
    c.purge = a.purge;
    c.auto_headroom = cupool::pool::AutoHeadroom::parse(&a.auto_headroom).ok_or_else(|| {
        format!(
            "--auto-headroom {:?}: accepted are {}",
            a.auto_headroom,
            cupool::pool::AutoHeadroom::FORMS
        )
    })?;
    c.budget = a.budget;
    c.engine = match a.engine.profile() {
        None => cupool::runtime::profile::EngineKind::Cupool,
        Some(profile) => cupool::runtime::profile::EngineKind::Profile {
            profile,
            cc: crate::values::cc(&a.cc)?,
        },
    };
    c.fa_occupancy = a.fa_occupancy;
    c.warm_up = !a.no_warmup;
    c.validate().map_err(|e| e.to_string())?;
    if let Some(v) = a.vram {
        gib_bytes(v)?;
    }
    let prompt = a.prompt_tokens(plan);
    if prompt == 0 || prompt > a.ctx {
        return Err(format!(
            "--prompt {prompt} must be between 1 and --ctx {}",
            a.ctx
        ));
    }
    Ok(c)
}

/// Startup bytes outside the pool: weights, KV cache, compute buffer.
pub fn static_bytes(c: &RunConfig) -> (usize, usize, usize) {
    c.startup_bytes(c.n_ctx)
}

/// One configuration's outcome.
pub struct Outcome {
    pub label: String,
    pub config: RunConfig,
    pub report: Result<RunReport, String>,
    /// It did not start because its startup memory or its plan does not fit the card.
    pub did_not_fit: bool,
    pub trace: Option<String>,
}

/// Runs one configuration on a fresh driver.
pub fn run_one(
    dev: &Device,
    cfg: RunConfig,
    prompt: usize,
    progress: Option<&indicatif::ProgressBar>,
) -> Outcome {
    let label = label(&cfg);
    if let Some(why) = dev.startup_refusal(&cfg) {
        return Outcome {
            label,
            config: cfg,
            report: Err(why),
            did_not_fit: true,
            trace: None,
        };
    }
    let run = || -> Result<(RunReport, Option<String>), RuntimeError> {
        let (driver, exec) = dev.open()?;
        let mut rt = Runtime::new(driver, cfg.clone(), exec)?;
        if let Some(pb) = progress {
            let pb = pb.clone();
            pb.set_position(0);
            pb.set_message(label.clone());
            rt.set_observer(move |row| pb.inc(row.n_tokens as u64));
        }
        let report = rt.prefill(prompt)?;
        let trace = rt.recorder().map(|r| r.to_jsonl());
        Ok((report, trace))
    };
    match run() {
        Ok((report, trace)) => Outcome {
            label,
            config: cfg,
            report: Ok(report),
            did_not_fit: false,
            trace,
        },
        Err(e) => Outcome {
            label,
            config: cfg,
            did_not_fit: matches!(
                e,
                RuntimeError::DoesNotFit { .. } | RuntimeError::PlanDoesNotFit { .. }
            ),
            report: Err(e.to_string()),
            trace: None,
        },
    }
}

pub fn label(c: &RunConfig) -> String {
    let kind = c.pool.kind.map_or("auto", |k| k.name());
    let mut l = format!("{kind}/{}", c.purge.name());
    if c.budget == BudgetMode::Planned {
        l.push_str("+planned");
    }
    if c.pool.fallback_managed {
        l.push_str("+fallback");
    }
    l
}

/// The comparison's configurations, each with the environment's pool settings (`env`: the
/// managed fallback, oversubscription, ...) but its own kind; without the VMM rows when
/// `GGML_CUDA_NO_VMM` forbids VMM.
pub fn comparison(base: &RunConfig, env: &PoolConfig) -> Vec<RunConfig> {
    let mk = |kind: PoolKind, purge: PurgePolicy, budget: BudgetMode| {
        let mut c = base.clone();
        c.pool = env.clone().kind(kind);
        c.purge = purge;
        c.budget = budget;
        c
    };
    let rows = vec![
        mk(PoolKind::Legacy, PurgePolicy::Never, BudgetMode::Ggml),
        mk(PoolKind::Legacy, PurgePolicy::Always, BudgetMode::Ggml),
        mk(PoolKind::Legacy, PurgePolicy::Auto, BudgetMode::Ggml),
        mk(PoolKind::Vmm, PurgePolicy::Never, BudgetMode::Ggml),
        mk(PoolKind::Managed, PurgePolicy::Never, BudgetMode::Ggml),
        mk(PoolKind::Vmm, PurgePolicy::Never, BudgetMode::Planned),
    ];
    rows.into_iter()
        .filter(|c| !(env.no_vmm && c.pool.kind == Some(PoolKind::Vmm)))
        .collect()
}
