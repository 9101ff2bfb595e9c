//! Building devices, models and runtimes from the arguments, and running them.

use crate::cli::{ComputeArg, DeviceArg, RunArgs};
use cupool::kernels::device::DeviceFacts;
use cupool::pool::driver::cuda::CudaDriver;
use cupool::pool::driver::limit::LimitedDriver;
use cupool::pool::driver::sim::{SimConfig, SimDevice};
use cupool::pool::driver::Driver;
use cupool::pool::{PoolConfig, PoolError, PoolKind};
use cupool::runtime::executor::{cpu::CpuExecutor, cuda::CudaExecutor, dry_run::DryRun, Executor};
use cupool::runtime::memory::WeightLayout;
use cupool::runtime::{
    BudgetMode, ModelShape, PurgePolicy, RunConfig, RunReport, Runtime, RuntimeError,
};
use std::sync::Arc;

pub const GIB: f64 = (1u64 << 30) as f64;
/// Phi-3-mini's weights in f16: with a 20k q8_0 KV cache it fills a 12 GiB card as in the OOM report.
const SCENARIO_WEIGHTS: f64 = 7_640_000_000.0;

/// A driver and the executor that runs on it.
pub type Opened = (Arc<dyn Driver>, Box<dyn Executor>);

/// What the runs execute on.
pub enum Device {
    Sim {
        vram: usize,
        backed: bool,
    },
    Cuda {
        driver: Arc<CudaDriver>,
        vram: Option<usize>,
    },
}

impl Device {
    pub fn from_args(a: &RunArgs) -> Result<Self, String> {
        let vram = a.vram.map(gib_bytes).transpose()?;
        let want_cuda = match a.device {
            DeviceArg::Sim => false,
            DeviceArg::Cuda => true,
            DeviceArg::Auto => {
                cupool::pool::driver::cuda::is_available() && CudaDriver::new(0).is_ok()
            }
        };
        if want_cuda {
            if a.compute.is_some() {
                return Err(
                    "--compute applies to the simulated device; on cuda the kernels run on the GPU"
                        .into(),
                );
            }
            let driver = CudaDriver::new(0).map_err(|e| format!("--device cuda: {e}"))?;
            Ok(Device::Cuda {
                driver: Arc::new(driver),
                vram,
            })
        } else {
            if a.device == DeviceArg::Auto && !a.quiet {
                crate::stdout::err("note: no usable CUDA device: running on the simulated card (--device sim chooses it and hides this note)");
            }
            let backed = a.compute == Some(ComputeArg::Cpu);
            Ok(Device::Sim {
                vram: vram.unwrap_or((12.0 * GIB) as usize),
                backed,
            })
        }
    }

    /// Takes the GPU's multiprocessor count and compute capability into `cfg` (the split and
    /// stream-k counts of cupool's kernels and of an engine profile read them); the simulated
    /// device, or a GPU that cannot say, keeps the flags' values.
    pub fn apply_facts(&self, cfg: &mut RunConfig) {
        let Device::Cuda { driver, .. } = self else {
            return;
        };
        let f = match DeviceFacts::query(driver.ordinal()) {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "device facts unavailable: keeping the flags' values");
                return;
            }
        };
        cfg.sms = f.multiprocessors;
        if let cupool::runtime::profile::EngineKind::Profile { profile, .. } = cfg.engine {
            cfg.engine = cupool::runtime::profile::EngineKind::Profile {
                profile,
                cc: f.compute_capability,
            };
        }
    }

    fn sim(vram: usize, backed: bool) -> Result<Arc<SimDevice>, RuntimeError> {
        let mut c = SimConfig::gib(0.0).backed(backed).record_calls(false);
        c.capacity = vram;
        Ok(Arc::new(SimDevice::new(c).map_err(PoolError::from)?))
    }

    /// A fresh driver for one run (the simulated card starts empty every time).
    pub fn driver(&self) -> Result<Arc<dyn Driver>, RuntimeError> {
        Ok(match self {
            Device::Sim { vram, backed } => Self::sim(*vram, *backed)?,
            Device::Cuda {
                driver,
                vram: Some(v),
            } => Arc::new(LimitedDriver::new(driver.clone(), *v)),
            Device::Cuda { driver, vram: None } => driver.clone(),
        })
    }

    /// A fresh driver for one run and the executor that runs on it.
    pub fn open(&self) -> Result<Opened, RuntimeError> {
        Ok(match self {
            Device::Sim { vram, backed: true } => {
                let sim = Self::sim(*vram, true)?;
                (sim.clone(), Box::new(CpuExecutor::new(sim)?))
            }
            Device::Sim { .. } => (self.driver()?, Box::new(DryRun)),
            Device::Cuda { driver, .. } => (
                self.driver()?,
                Box::new(CudaExecutor::new(driver.context().clone())?),
            ),
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Device::Sim { vram, backed } => format!(
                "simulated {:.1} GiB card, {} executor",
                *vram as f64 / GIB,
                if *backed { "cpu" } else { "dry-run" }
            ),
            Device::Cuda { driver, vram } => match vram {
                Some(v) => format!(
                    "{} limited to {:.1} GiB, cuda executor",
                    driver.name(),
                    *v as f64 / GIB
                ),
                None => format!("{}, cuda executor", driver.name()),
            },
        }
    }

    pub fn card_bytes(&self) -> Option<usize> {
        match self {
            Device::Sim { vram, .. } => Some(*vram),
            Device::Cuda { vram, .. } => *vram,
        }
    }

    pub fn executor_name(&self) -> &'static str {
        match self {
            Device::Sim { backed: false, .. } => "dry-run",
            Device::Sim { backed: true, .. } => "cpu",
            Device::Cuda { .. } => "cuda",
        }
    }
}

pub fn gib_bytes(g: f64) -> Result<usize, String> {
    // The simulated device's limit (256 TiB), so that every size accepted here can be simulated.
    let max_gib = (cupool::pool::driver::sim::MAX_CAPACITY as f64 / GIB) as u64;
    if g.is_finite() && g > 0.0 && g <= max_gib as f64 {
        Ok((g * GIB) as usize)
    } else {
        Err(format!(
            "{g} GiB is not a usable size: give a number of GiB above 0 and up to {max_gib}"
        ))
    }
}

pub fn model_from_args(a: &RunArgs) -> Result<ModelShape, String> {
    let mut m = ModelShape::preset(&a.model).map_err(|e| e.to_string())?;
    let preset = m.clone();
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
    if a.model == "phi3-mini" {
        m.weights_bytes = SCENARIO_WEIGHTS as usize;
    }
    if !overrides.is_empty() {
        m.name = format!("{} with {}", m.name, overrides.join(" "));
        // The preset's weight size, scaled by how the shape changed the weight layout (same
        // quantisation): 16 of 32 layers weigh about half.
        // (The layout is one layer's: the runtime shares it between layers.)
        let all = |s: &ModelShape| {
            WeightLayout::new(s, Default::default()).bytes as f64 * s.n_layer as f64
        };
        let (was, now) = (all(&preset), all(&m));
        m.weights_bytes = (m.weights_bytes as f64 * now / was.max(1.0)) as usize;
    }
    Ok(m)
}

/// The base configuration from the arguments (pool settings filled in by the caller).
pub fn run_config(a: &RunArgs, m: &ModelShape, plan: bool) -> Result<RunConfig, String> {
    let mut c = RunConfig::new(m.clone(), a.ctx);
    c.kv_type = a.kv_type;
    c.n_batch = a.batch;
    c.n_ubatch = a.ubatch;
    c.weights_bytes = match a.weights {
        Some(g) => gib_bytes(g)?,
        None => m.weights_bytes,
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
    c.weight_type =
        crate::values::weight_type(a.weight_type.as_deref(), &a.model, a.engine.profile())?;
    c.engine = match a.engine.profile() {
        None => cupool::runtime::profile::EngineKind::Cupool,
        Some(profile) => cupool::runtime::profile::EngineKind::Profile { profile, cc: 900 },
    };
    c.fa_occupancy = a.fa_occupancy;
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
