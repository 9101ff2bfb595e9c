//! The library's process-wide state: the devices, and one pool per device × stream × tag (built
//! on first use from the configuration), with its threads' states in front.
//!
//! The hot path takes no global lock: each thread caches its state in each stream pool it has
//! used (`threads.rs`), checked against a generation counter that `init` and `shutdown`
//! advance; that state's own lock guards the thread's kept and live blocks (`local.rs`).

use crate::cached::Cached;
use crate::config::Config;
use crate::local::{Held, Local};
use crate::segments::Tracked;
use crate::status::{CupoolStatus, Failure};
use cupool_pool::driver::timed::TimedDriver;
use cupool_pool::driver::Driver;
use cupool_pool::{PurgePolicy, Registry, StreamId};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The pool of one device × stream × tag, with its threads' states in front.
pub(crate) struct StreamPool {
    pub device: usize,
    pub stream: u64,
    /// The tag of what it holds (`tags.rs`; 0: none).
    pub tag: u32,
    /// Behind the threads' states (`local.rs`): threads sharing the stream do not serialise on
    /// the pool's lock, and each finds its own blocks without touching shared state.
    pub pool: Cached<StreamPool>,
    /// The state of calls that go the shared way (no thread's cache: while shutdown runs, or
    /// after the thread's locals are gone).
    pub shared: Arc<ThreadState>,
    /// The reserved peak the user sees (restarted only on request).
    pub peaks: crate::peaks::Peaks,
}

/// A thread's state in a stream pool.
pub(crate) type ThreadState = Local<StreamPool>;

impl StreamPool {
    /// A new thread's state here.
    pub(crate) fn join(self: &Arc<Self>) -> Arc<ThreadState> {
        self.pool.join(self.clone())
    }

    /// Allocates `size` bytes for the thread whose state is `me` (`held`, locked).
    #[inline]
    pub(crate) fn alloc(
        &self,
        me: &Arc<ThreadState>,
        held: &mut Held,
        size: usize,
        name: Option<&str>,
    ) -> Result<(u64, usize), Failure> {
        let at = (self.device, self.stream);
        held.alloc(me, &self.pool.front, &self.peaks, at, size, name)
    }

    /// Frees `ptr` if `held` (locked) holds it live; `None` if not.
    #[inline]
    pub(crate) fn free(
        &self,
        held: &mut Held,
        ptr: u64,
        size: usize,
    ) -> Option<Result<(), Failure>> {
        held.free(&self.pool.front, self.device, ptr, size)
    }

    /// Frees `ptr` wherever it is live (another thread's block); `None` if nowhere.
    pub(crate) fn free_any(&self, ptr: u64, size: usize) -> Option<Result<(), Failure>> {
        self.pool.free_any(self.device, ptr, size)
    }

    /// The thread whose state is `l` exited: its bins go back, and it is unlisted once none
    /// of its blocks is live.
    pub(crate) fn retire(l: &Arc<ThreadState>) {
        if let Some(p) = l.retire(|p: &StreamPool| &p.pool.front) {
            p.pool.unlist_if_idle(l);
        }
    }
}

pub(crate) struct Lib {
    pub registry: Registry,
    /// `CUPOOL_PURGE`: what ubatch boundaries and out-of-memory retries may return.
    pub purge: PurgePolicy,
    /// `CUPOOL_AUTO_HEADROOM`: the free memory below which `auto` purges at a boundary.
    pub headroom: cupool_pool::AutoHeadroom,
    pub devices: usize,
    /// What each device's pools hold from the driver (the memory snapshot's segments).
    pub segments: Vec<Arc<Tracked>>,
    /// Each device's driver calls and their time, with `CUPOOL_TIME_DRIVER` (else empty).
    pub timers: Vec<Arc<TimedDriver>>,
    /// Each device's page-move worker, with `CUPOOL_VMM_DEFER` (else empty).
    pub deferred: Vec<Arc<cupool_pool::driver::deferred::DeferredDriver>>,
    /// The blocks a thread keeps have a range of their own (libcupool's size classes; not with
    /// `CUPOOL_SIZE_CLASSES=none`): else threads keep less (`front.rs`).
    kept_apart: bool,
    streams: RwLock<HashMap<(usize, u64, u32), Arc<StreamPool>>>,
}

impl Lib {
    fn open(config: Config) -> Result<Self, Failure> {
        let crate::drivers::Stack {
            segments,
            timers,
            deferred,
        } = crate::drivers::stack(&config)?;
        let drivers = segments
            .iter()
            .map(|t| t.clone() as Arc<dyn Driver>)
            .collect();
        Ok(Self {
            devices: segments.len(),
            segments,
            timers,
            deferred,
            purge: config.purge,
            headroom: config.headroom,
            kept_apart: crate::front::kept_apart(&config.pool.size_classes),
            registry: Registry::new(config.pool, drivers),
            streams: RwLock::new(HashMap::new()),
        })
    }

    /// The pool of `device` × `stream` × `tag`, built on first use when `create`.
    pub(crate) fn stream(
        &self,
        device: usize,
        stream: u64,
        tag: u32,
        create: bool,
    ) -> Result<Arc<StreamPool>, Failure> {
        if let Some(s) = self.streams.read().get(&(device, stream, tag)) {
            return Ok(s.clone());
        }
        if !create {
            return Err(Failure::new(
                CupoolStatus::UnknownPointer,
                format!("cupool handed out nothing on device {device}, stream {stream:#x}"),
            ));
        }
        // A pool may reserve its address space as it is built: that range is this stream's.
        let inner = crate::segments::on_stream(stream, tag, || {
            self.registry.pool_tagged(device, StreamId(stream), tag)
        })?;
        let s = self
            .streams
            .write()
            .entry((device, stream, tag))
            .or_insert_with(|| {
                let shared = Arc::new(Local::shared());
                Arc::new(StreamPool {
                    device,
                    stream,
                    tag,
                    pool: Cached::new(inner, shared.clone(), (stream, tag), self.kept_apart),
                    shared,
                    peaks: crate::peaks::Peaks::default(),
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
            .filter(|((d, _, _), _)| device.is_none_or(|want| *d == want))
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
            .map(|s| s.pool.live_blocks())
            .sum()
    }
}

static LIB: RwLock<Option<Arc<Lib>>> = RwLock::new(None);
/// Advanced by `init` and `shutdown`: a thread's cache of another generation is stale.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// Taken by `init` and `shutdown`, one at a time.
static ADMIN: Mutex<()> = Mutex::new(());
/// Whether the library is open (set under `LIB`'s write lock, by `open` and `close`).
static OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Opens the library with `config`.
pub(crate) fn init(config: Config) -> Result<(), Failure> {
    open(config, false)
}

/// Opens the library from the environment unless it is open already.
pub(crate) fn init_from_env_once() -> Result<(), Failure> {
    // Read-only on the hot path: a read lock would write its count on a line every thread shares.
    if OPEN.load(Ordering::Acquire) {
        return Ok(());
    }
    open(Config::parse(None)?, true)
}

/// Opens the library; when it is open already, that is fine if `if_closed`, else an error.
/// Decided under the write lock: another thread may open and close it meanwhile.
fn open(config: Config, if_closed: bool) -> Result<(), Failure> {
    crate::log::init();
    let _admin = admin();
    let mut lib = LIB.write();
    if lib.is_some() {
        if if_closed {
            return Ok(());
        }
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            "cupool is already initialised: call cupool_shutdown first to change its configuration",
        ));
    }
    *lib = Some(Arc::new(Lib::open(config)?));
    OPEN.store(true, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Held by `init` and `shutdown`: one opens or closes the library at a time.
pub(crate) struct Admin {
    _held: MutexGuard<'static, ()>,
}

pub(crate) fn admin() -> Admin {
    Admin {
        _held: ADMIN.lock(),
    }
}

/// Closes the library; refused while blocks are live (their memory must stay valid). The
/// caller holds `Admin` and has stopped the calls through the threads' states (`threads.rs`);
/// the calls that go the shared way hold the library's read lock, so once the write lock is
/// taken, the count of live blocks is exact and no block is handed out under it. Every
/// thread's state then gives its kept blocks back and lets go of its pool.
pub(crate) fn close(_admin: &Admin) -> Result<(), Failure> {
    let mut lib = LIB.write();
    let live = lib.as_ref().map_or(0, |l| l.live_blocks());
    if live > 0 {
        return Err(Failure::new(
            CupoolStatus::InvalidArgument,
            format!("{live} blocks are still live: free them before cupool_shutdown (their memory stays valid until then)"),
        ));
    }
    let closed = lib.take();
    if let Some(l) = &closed {
        l.pools_of(None).iter().for_each(|s| s.pool.close());
    }
    OPEN.store(false, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    drop(lib);
    // Outside the lock: dropping the pools gives their memory back to the driver. A call that
    // holds the library briefly (statistics, a purge) keeps it until that call ends.
    drop(closed);
    Ok(())
}

/// The open library.
pub(crate) fn lib() -> Result<Arc<Lib>, Failure> {
    LIB.read().clone().ok_or_else(not_initialized)
}

pub(crate) fn not_initialized() -> Failure {
    Failure::new(
        CupoolStatus::NotInitialized,
        "cupool is not initialised: call cupool_init first (or use the PyTorch entry points, which read the environment)",
    )
}

/// The library's generation: `init` and `shutdown` advance it.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The open library, if any.
pub(crate) fn current() -> Option<Arc<Lib>> {
    LIB.read().clone()
}

/// A new state for this thread in the pool of `device` × `stream` × `tag` (built on first use
/// when `create`), and the library's generation it belongs to; `None` when the library is not
/// open or the arguments name no pool (the shared way then says why). Under the library's read
/// lock, so a state never joins a pool that `close` has already let go of.
pub(crate) fn join(
    device: i32,
    stream: u64,
    tag: u32,
    create: bool,
) -> Option<(Arc<ThreadState>, u64)> {
    let lib = LIB.read();
    let lib = lib.as_ref()?;
    let d = lib.check_device(device).ok()?;
    let s = lib.stream(d, stream, tag, create).ok()?;
    Some((s.join(), GENERATION.load(Ordering::Acquire)))
}

/// Runs `f` on the pool of `device` × `stream` × `tag` without this thread's state: while
/// shutdown runs, for calls after this thread's locals are gone, and for frees of blocks that
/// another thread allocated. The library's read lock is held for the whole call, so shutdown
/// cannot end the library under it.
pub(crate) fn with_shared<T>(
    device: i32,
    stream: u64,
    tag: u32,
    create: bool,
    f: impl FnOnce(&StreamPool) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let lib = LIB.read();
    let lib = lib.as_ref().ok_or_else(not_initialized)?;
    let d = lib.check_device(device)?;
    let s = lib.stream(d, stream, tag, create)?;
    f(&s)
}
