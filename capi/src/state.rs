//! The library's process-wide state: the devices, one pool per device × stream (built on first
//! use from the configuration), and the blocks handed out, by address.
//!
//! The hot path takes no global lock: each thread caches the stream pools it has used, checked
//! against a generation counter that `init` and `shutdown` advance; a stream pool's own lock
//! guards its live blocks, so threads on different streams do not contend.

use crate::config::{Config, Devices};
use crate::status::{CupoolStatus, Failure};
use crate::usage::Usage;
use cupool_pool::driver::cuda::{device_count, CudaDriver};
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::{Block, Pool, PurgePolicy, Registry, StreamId};
use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The pool of one device × stream and the blocks it handed out: address → (size asked for,
/// block).
pub(crate) struct StreamPool {
    pub device: usize,
    pub stream: u64,
    pub pool: Arc<dyn Pool>,
    pub live: Mutex<HashMap<u64, (usize, Block)>>,
    /// What its requests held at once since the last ubatch boundary.
    pub usage: Mutex<Usage>,
}

pub(crate) struct Lib {
    pub registry: Registry,
    /// `CUPOOL_PURGE`: what ubatch boundaries and out-of-memory retries may return.
    pub purge: PurgePolicy,
    /// `CUPOOL_AUTO_HEADROOM`: the free memory below which `auto` purges at a boundary.
    pub headroom: cupool_pool::AutoHeadroom,
    pub devices: usize,
    streams: RwLock<HashMap<(usize, u64), Arc<StreamPool>>>,
}

impl Lib {
    fn open(config: Config) -> Result<Self, Failure> {
        let sims = |gib: f64, count: usize| -> Result<Vec<Arc<dyn Driver>>, Failure> {
            (0..count)
                .map(|i| {
                    let mut c = SimConfig::gib(gib).record_calls(false);
                    c.ordinal = i;
                    let d: Arc<dyn Driver> =
                        Arc::new(SimDevice::new(c).map_err(cupool_pool::PoolError::from)?);
                    Ok(d)
                })
                .collect()
        };
        let cuda = || -> Result<Vec<Arc<dyn Driver>>, Failure> {
            (0..device_count()?)
                .map(|i| Ok(Arc::new(CudaDriver::new(i)?) as Arc<dyn Driver>))
                .collect()
        };
        let drivers = match config.devices {
            Devices::Cuda => cuda()?,
            Devices::Sim { gib, count } => sims(gib, count)?,
            Devices::Auto { gib, count } => match cuda() {
                Ok(d) if !d.is_empty() => d,
                _ => {
                    tracing::info!("no CUDA device: cupool runs on simulated cards");
                    sims(gib, count)?
                }
            },
        };
        Ok(Self {
            devices: drivers.len(),
            purge: config.purge,
            headroom: config.headroom,
            registry: Registry::new(config.pool, drivers),
            streams: RwLock::new(HashMap::new()),
        })
    }

    /// The pool of `device` × `stream`, built on first use when `create`.
    fn stream(&self, device: usize, stream: u64, create: bool) -> Result<Arc<StreamPool>, Failure> {
        if let Some(s) = self.streams.read().get(&(device, stream)) {
            return Ok(s.clone());
        }
        if !create {
            return Err(Failure::new(
                CupoolStatus::UnknownPointer,
                format!("cupool handed out nothing on device {device}, stream {stream:#x}"),
            ));
        }
        let pool = self.registry.pool(device, StreamId(stream))?;
        let s = self
            .streams
            .write()
            .entry((device, stream))
            .or_insert_with(|| {
                Arc::new(StreamPool {
                    device,
                    stream,
                    pool,
                    live: Mutex::new(HashMap::new()),
                    usage: Mutex::new(Usage::default()),
                })
            })
            .clone();
        Ok(s)
    }

    /// Every stream pool of `device` (all devices when `None`).
    pub fn pools_of(&self, device: Option<usize>) -> Vec<Arc<StreamPool>> {
        self.streams
            .read()
            .iter()
            .filter(|((d, _), _)| device.is_none_or(|want| *d == want))
            .map(|(_, s)| s.clone())
            .collect()
    }

    pub fn check_device(&self, device: i32) -> Result<usize, Failure> {
        usize::try_from(device)
            .ok()
            .filter(|&d| d < self.devices)
            .ok_or_else(|| {
                Failure::new(
                    CupoolStatus::InvalidArgument,
                    format!(
                        "device {device} does not exist: the devices are 0 to {}",
                        self.devices as i64 - 1
                    ),
                )
            })
    }

    fn live_blocks(&self) -> usize {
        self.pools_of(None)
            .iter()
            .map(|s| s.live.lock().len())
            .sum()
    }
}

static LIB: RwLock<Option<Arc<Lib>>> = RwLock::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(1);

struct Cache {
    generation: u64,
    lib: Option<Arc<Lib>>,
    streams: HashMap<(usize, u64), Arc<StreamPool>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache { generation: 0, lib: None, streams: HashMap::new() });
}

/// Sends the library's log to stderr, filtered by `CUPOOL_LOG` (else `RUST_LOG`, else
/// warnings and errors; `CUPOOL_LOG=off` silences it). A host that installed its own tracing
/// subscriber in this library's copy of `tracing` keeps it.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("CUPOOL_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

/// Opens the library with `config`.
pub(crate) fn init(config: Config) -> Result<(), Failure> {
    init_logging();
    let mut lib = LIB.write();
    if lib.is_some() {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            "cupool is already initialised: call cupool_shutdown first to change its configuration",
        ));
    }
    *lib = Some(Arc::new(Lib::open(config)?));
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Opens the library from the environment unless it is open already.
pub(crate) fn init_from_env_once() -> Result<(), Failure> {
    if LIB.read().is_some() {
        return Ok(());
    }
    match init(Config::parse(None)?) {
        Err(f) if LIB.read().is_some() => {
            drop(f); // another thread opened it meanwhile
            Ok(())
        }
        r => r,
    }
}

/// Closes the library; refused while blocks are live (their memory must stay valid).
pub(crate) fn shutdown() -> Result<(), Failure> {
    let mut lib = LIB.write();
    let Some(l) = lib.as_ref() else {
        return Ok(());
    };
    let live = l.live_blocks();
    if live > 0 {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{live} blocks are still live: free them before cupool_shutdown (their memory stays valid until then)"),
        ));
    }
    *lib = None;
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The open library.
pub(crate) fn lib() -> Result<Arc<Lib>, Failure> {
    LIB.read().clone().ok_or_else(not_initialized)
}

fn not_initialized() -> Failure {
    Failure::new(
        CupoolStatus::NotInitialized,
        "cupool is not initialised: call cupool_init first (or use the PyTorch entry points, which read the environment)",
    )
}

/// Runs `f` on the pool of `device` × `stream` (built on first use when `create`), through
/// this thread's cache.
#[inline]
pub(crate) fn with_stream<T>(
    device: i32,
    stream: u64,
    create: bool,
    f: impl FnOnce(&StreamPool) -> Result<T, Failure>,
) -> Result<T, Failure> {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let generation = GENERATION.load(Ordering::Acquire);
        if c.generation != generation {
            c.streams.clear();
            c.lib = LIB.read().clone();
            c.generation = generation;
        }
        // No reference count changes here: threads would contend on the shared counters.
        let d = c
            .lib
            .as_ref()
            .ok_or_else(not_initialized)?
            .check_device(device)?;
        if !c.streams.contains_key(&(d, stream)) {
            let s = c
                .lib
                .as_ref()
                .ok_or_else(not_initialized)?
                .stream(d, stream, create)?;
            c.streams.insert((d, stream), s);
        }
        match c.streams.get(&(d, stream)) {
            Some(s) => f(s),
            None => Err(not_initialized()),
        }
    })
}
