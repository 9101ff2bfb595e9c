//! The pools cupool ships: each a placement over an upstream, built by the one core.
//!
//! | pool | placement | upstream |
//! |---|---|---|
//! | [`VmmPool`] | [`Bump`] in [`Lanes`] | [`VmmReserve`] |
//! | [`LegacyPool`] | [`Slots`] (ggml's policy) | [`DeviceMalloc`] |
//! | [`ManagedPool`] | [`Slots`], smaller idle buffers dropped on growth | [`ManagedMalloc`] |
//! | [`TorchPool`] | [`Caching`] (PyTorch's policy), emptied and retried on OOM | [`DeviceMalloc`] |
//! | [`DirectPool`] | [`Direct`]: no cache | [`DeviceMalloc`] |
//! | [`NcclPool`] | [`Direct`]: no cache | [`VmmEach`]: one VMM allocation per segment |

use crate::core::{CoreOptions, CorePool};
use crate::driver::Driver;
use crate::error::PoolError;
use crate::kind::PoolKind;
use crate::placement::bump::Bump;
use crate::placement::caching::{Caching, CachingConfig};
use crate::placement::direct::Direct;
use crate::placement::lanes::Lanes;
use crate::placement::slots::{Slots, SlotsConfig};
use crate::placement::Placement;
use crate::upstream::device::DeviceMalloc;
use crate::upstream::managed::ManagedMalloc;
use crate::upstream::vmm::{VmmConfig, VmmReserve};
use crate::upstream::vmm_each::VmmEach;
use crate::upstream::Upstream;
use std::sync::Arc;

pub use crate::placement::bump::VMM_ALIGN;

/// The VMM reserve-and-map pool: see [`Bump`], [`Lanes`] and [`VmmReserve`].
pub type VmmPool = CorePool<Lanes<Bump>, VmmReserve>;
/// ggml's legacy pool, with cupool's fixes as options: see [`Slots`] and [`LegacyConfig`].
pub type LegacyPool = CorePool<Slots, DeviceMalloc>;
/// ggml's `GGML_CUDA_POOL_USE_MANAGED` (PR #22158): the legacy placement over managed memory,
/// idle smaller buffers released before it grows (under managed memory they would sit in host
/// memory and page over PCIe later). Unlike the PR it never asks for more managed memory than
/// the device has free unless oversubscription is allowed.
pub type ManagedPool = CorePool<Slots, ManagedMalloc>;

/// PyTorch's native caching allocator: [`Caching`] over `cudaMalloc`, the whole cache emptied
/// and the allocation retried once on out-of-memory, as PyTorch does. For replaying traces:
/// it shows what PyTorch would reserve.
pub type TorchPool = CorePool<Caching, DeviceMalloc>;

/// No cache: every request is a `cudaMalloc` of its own, freed at once (`cudaFree` waits for
/// the device). For use under a caching layer, such as a `torch.cuda.MemPool`, where a second
/// cache would only hold memory the layer above already gave up.
pub type DirectPool = CorePool<Direct, DeviceMalloc>;

/// No cache, VMM memory: every request its own allocation with one physical handle, mapped for
/// every peer, as NCCL's `ncclMemAlloc` makes it, released (after a synchronize) when freed.
/// For a `torch.cuda.MemPool` whose segments are registered with NCCL.
pub type NcclPool = CorePool<Direct, VmmEach>;

/// The legacy pool's settings. [`Default`] is ggml's policy exactly.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LegacyConfig {
    /// The placement: slots, look-ahead, rounding, the largest excess.
    pub placement: SlotsConfig,
    /// On device OOM: synchronize, free the whole cache, retry once (ggml after PR #22155).
    pub flush_and_retry: bool,
    /// Before growing: free idle cached buffers smaller than the request (PR #22158).
    pub drop_smaller_on_grow: bool,
}

/// The managed pool's settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedConfig {
    /// Allow managed memory beyond the device's free memory.
    pub allow_oversubscription: bool,
}

impl VmmPool {
    /// A pool with default settings.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::from_parts(
            PoolKind::Vmm,
            vmm_placement(&VmmConfig::default()),
            VmmReserve::new(driver, VmmConfig::default()),
            CoreOptions::default(),
        )
    }

    /// A pool with the given settings (checked). Nothing is reserved until the first
    /// allocation.
    pub fn with_config(driver: Arc<dyn Driver>, config: VmmConfig) -> Result<Self, PoolError> {
        config.validate()?;
        Ok(Self::from_parts(
            PoolKind::Vmm,
            vmm_placement(&config),
            VmmReserve::new(driver, config),
            CoreOptions::default(),
        ))
    }

    /// Bytes currently mapped.
    pub fn mapped_bytes(&self) -> usize {
        self.inspect(|_, u| u.mapped())
    }
}

/// The VMM pool's placement for `config`: lanes open only with [`VmmConfig::lanes`], and name
/// what their next copies need only where the upstream makes it ahead ([`VmmConfig::ahead`]).
fn vmm_placement(config: &VmmConfig) -> Lanes<Bump> {
    let bump = Bump::with_large_rounding(config.large_rounding);
    let mut lanes = Lanes::new(bump, config.large_rounding);
    if !config.lanes {
        lanes.apart_refused();
    }
    if config.ahead == crate::upstream::vmm::Ahead::Off {
        lanes.predict_nothing();
    }
    lanes
}

impl LegacyPool {
    /// A pool with ggml's policy.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::from_parts(
            PoolKind::Legacy,
            Slots::new(SlotsConfig::default()),
            DeviceMalloc::new(driver),
            CoreOptions::default(),
        )
    }

    /// A pool with the given policy (checked).
    pub fn with_config(driver: Arc<dyn Driver>, config: LegacyConfig) -> Result<Self, PoolError> {
        config.placement.validate()?;
        Ok(Self::from_parts(
            PoolKind::Legacy,
            Slots::new(config.placement),
            DeviceMalloc::new(driver),
            CoreOptions {
                flush_and_retry: config.flush_and_retry,
                drop_smaller_on_grow: config.drop_smaller_on_grow,
            },
        ))
    }
}

impl ManagedPool {
    /// A managed pool.
    pub fn new(driver: Arc<dyn Driver>, config: ManagedConfig) -> Self {
        Self::from_parts(
            PoolKind::Managed,
            Slots::new(SlotsConfig::default()),
            ManagedMalloc::new(driver, config.allow_oversubscription),
            CoreOptions {
                flush_and_retry: false,
                drop_smaller_on_grow: true,
            },
        )
    }
}

impl TorchPool {
    /// A pool with PyTorch's policy and `config` (checked).
    pub fn with_config(driver: Arc<dyn Driver>, config: CachingConfig) -> Result<Self, PoolError> {
        config.validate()?;
        Ok(Self::from_parts(
            PoolKind::Torch,
            Caching::new(config),
            DeviceMalloc::new(driver),
            CoreOptions {
                flush_and_retry: true,
                drop_smaller_on_grow: false,
            },
        ))
    }
}

impl DirectPool {
    /// A pool that caches nothing.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::from_parts(
            PoolKind::Direct,
            Direct,
            DeviceMalloc::new(driver),
            CoreOptions::default(),
        )
    }
}

impl NcclPool {
    /// A pool that caches nothing and maps each request on its own.
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self::from_parts(
            PoolKind::Nccl,
            Direct,
            VmmEach::new(driver),
            CoreOptions::default(),
        )
    }
}

impl<U: Upstream> CorePool<Slots, U> {
    /// Sizes of the idle cached buffers, in slot order.
    pub fn cached_sizes(&self) -> Vec<usize> {
        self.inspect(|p, _| p.cached_sizes())
    }

    /// The size a new buffer for `size` bytes gets (ggml: `round_up((size_t)(1.05 * size),
    /// 256)`).
    pub fn grow_size(&self, size: usize) -> usize {
        self.inspect(|p, _| p.config().grow_size(size))
    }
}
