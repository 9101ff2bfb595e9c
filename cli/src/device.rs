//! The device the runs execute on: the simulated card or a GPU, the free memory before the
//! engine starts, and what the engine takes of it outside its buffers and pool.

use crate::cli::{ComputeArg, DeviceArg, RunArgs};
use cupool::kernels::device::DeviceFacts;
use cupool::pool::driver::cuda::CudaDriver;
use cupool::pool::driver::limit::LimitedDriver;
use cupool::pool::driver::sim::{SimConfig, SimDevice};
use cupool::pool::driver::Driver;
use cupool::pool::PoolError;
use cupool::runtime::executor::{cpu::CpuExecutor, cuda::CudaExecutor, dry_run::DryRun, Executor};
use cupool::runtime::planner::Outside;
use cupool::runtime::profile::EngineModel;
use cupool::runtime::{RunConfig, RuntimeError};
use std::sync::Arc;

pub const GIB: f64 = (1u64 << 30) as f64;

/// A driver and the executor that runs on it.
pub type Opened = (Arc<dyn Driver>, Box<dyn Executor>);

/// What the runs execute on. `free` is the device's free memory before the engine starts;
/// `room` what the run's buffers and pool may take of it: `free` less what the engine takes
/// outside them ([`Device::set_outside`]).
pub enum Device {
    Sim {
        card: usize,
        free: usize,
        room: usize,
        outside: Outside,
        backed: bool,
    },
    Cuda {
        driver: Arc<CudaDriver>,
        free: Option<usize>,
        room: Option<usize>,
        outside: Outside,
    },
}

impl Device {
    pub fn from_args(a: &RunArgs) -> Result<Self, String> {
        let vram = a.vram.map(gib_bytes).transpose()?;
        let free = a.free.map(gib_bytes).transpose()?;
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
            let free = free.or(vram);
            Ok(Device::Cuda {
                driver: Arc::new(driver),
                free,
                room: free,
                outside: Outside::NONE,
            })
        } else {
            if a.device == DeviceArg::Auto && !a.quiet {
                crate::stdout::err("note: no usable CUDA device: running on the simulated card (--device sim chooses it and hides this note)");
            }
            let card = vram.unwrap_or((12.0 * GIB) as usize);
            let free = free.unwrap_or(card);
            if free > card {
                return Err(format!(
                    "--free {:.2} GiB is more than the card (--vram {:.2} GiB): give at most the card's size",
                    free as f64 / GIB,
                    card as f64 / GIB
                ));
            }
            let backed = a.compute == Some(ComputeArg::Cpu);
            Ok(Device::Sim {
                card,
                free,
                room: free,
                outside: Outside::NONE,
                backed,
            })
        }
    }

    /// Takes what the engine of `cfg` holds outside its buffers and pool out of the free memory
    /// (on cuda, only when a free size was given: else the GPU's real context and modules are
    /// already out of what it reports free).
    pub fn set_outside(&mut self, cfg: &RunConfig, model: Option<&EngineModel>, cc: u32) {
        let o = Outside::of(cfg.engine, model, cfg.weight_type, cc)
            .after_warm_up(cfg.engine, cfg.warm_up);
        match self {
            Device::Sim {
                free,
                room,
                outside,
                ..
            } => {
                *outside = o;
                *room = o.room(*free, 0).unwrap_or(0);
            }
            Device::Cuda {
                free: Some(f),
                room,
                outside,
                ..
            } => {
                *outside = o;
                *room = Some(o.room(*f, 0).unwrap_or(0));
            }
            Device::Cuda { .. } => {}
        }
    }

    /// Why `cfg` cannot start from the free memory: its start-up buffers, with the CUDA context
    /// and the start-up hold beside them, are more than is free.
    pub fn startup_refusal(&self, cfg: &RunConfig) -> Option<String> {
        let (free, o) = match self {
            Device::Sim { free, outside, .. } => (*free, outside),
            Device::Cuda {
                free: Some(f),
                outside,
                ..
            } => (*f, outside),
            Device::Cuda { .. } => return None,
        };
        let (w, kv, c) = cfg.startup_bytes(cfg.n_ctx);
        let need = w + kv + c + o.at_startup();
        (o.shim_hold > 0 && need > free).then(|| {
            format!(
                "the context is not created: its buffers ({:.2} GiB), the CUDA context and the start-up hold ({:.2} GiB) are more than the {:.2} GiB free",
                (w + kv + c) as f64 / GIB,
                o.at_startup() as f64 / GIB,
                free as f64 / GIB
            )
        })
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
        // A GPU's: device allocations take whole 2 MiB pages, as the plan counts them.
        let mut c = SimConfig::gib(0.0)
            .backed(backed)
            .record_calls(false)
            .malloc_page(cupool::runtime::planner::GPU_MALLOC_PAGE);
        c.capacity = vram;
        Ok(Arc::new(SimDevice::new(c).map_err(PoolError::from)?))
    }

    /// A fresh driver for one run (the simulated card starts empty every time).
    pub fn driver(&self) -> Result<Arc<dyn Driver>, RuntimeError> {
        Ok(match self {
            Device::Sim { room, backed, .. } => Self::sim(*room, *backed)?,
            Device::Cuda {
                driver,
                room: Some(v),
                ..
            } => Arc::new(LimitedDriver::new(driver.clone(), *v)),
            Device::Cuda {
                driver, room: None, ..
            } => driver.clone(),
        })
    }

    /// A fresh driver for one run and the executor that runs on it.
    pub fn open(&self) -> Result<Opened, RuntimeError> {
        Ok(match self {
            Device::Sim {
                room, backed: true, ..
            } => {
                let sim = Self::sim(*room, true)?;
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
        let g = |b: usize| b as f64 / GIB;
        match self {
            Device::Sim {
                card, free, backed, ..
            } => format!(
                "simulated {:.1} GiB card, {:.2} GiB free before start, {} executor",
                g(*card),
                g(*free),
                if *backed { "cpu" } else { "dry-run" }
            ),
            Device::Cuda { driver, free, .. } => match free {
                Some(f) => format!(
                    "{} with {:.2} GiB free before start, cuda executor",
                    driver.name(),
                    g(*f)
                ),
                None => format!("{}, cuda executor", driver.name()),
            },
        }
    }

    pub fn card_bytes(&self) -> Option<usize> {
        match self {
            Device::Sim { card, .. } => Some(*card),
            Device::Cuda { free, .. } => *free,
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
