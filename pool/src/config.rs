//! Choosing and building a pool: from code ([`PoolConfig`]) or from the environment.
//!
//! The variables [`PoolConfig::from_env`] reads ([`ENV_NAMES`]), what they accept and their
//! defaults are rows of the settings table, [`crate::settings`]. Boolean variables accept
//! `1/0`, `true/false`, `yes/no`, `on/off`; anything else is an error naming the variable, the
//! value and what is accepted.

use crate::adaptors::{ManagedFallback, SizeClasses};
use crate::driver::Driver;
use crate::error::PoolError;
use crate::invalid::InvalidConfig;
use crate::kind::PoolKind;
use crate::placement::caching::CachingConfig;
use crate::pool::Pool;
use crate::pools::{
    DirectPool, LegacyConfig, LegacyPool, ManagedConfig, ManagedPool, NcclPool, TorchPool, VmmPool,
};
use crate::settings::{self, FrontEnd};
use crate::upstream::vmm::VmmConfig;
use std::sync::Arc;

/// The values a yes-or-no setting accepts.
pub const BOOL_VALUES: &str = "1, 0, true, false, yes, no, on, off";

/// A yes-or-no setting's value ([`BOOL_VALUES`]); the error names `var` and what it accepts.
pub fn parse_bool(var: &'static str, value: &str) -> Result<bool, InvalidConfig> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(InvalidConfig::new(var, value, BOOL_VALUES)),
    }
}

/// The environment variables [`PoolConfig::from_env`] reads: the settings table's rows that
/// the library reads ([`FrontEnd::Library`]), in its order.
pub const ENV_NAMES: &[&str] =
    &settings::names_read_by::<{ settings::count_read_by(FrontEnd::Library) }>(FrontEnd::Library);

/// Which pool to build, and how.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// The pool kind; `None` chooses vmm where supported, else legacy.
    pub kind: Option<PoolKind>,
    /// Never choose VMM automatically (`GGML_CUDA_NO_VMM`).
    pub no_vmm: bool,
    /// Wrap the pool in [`ManagedFallback`].
    pub fallback_managed: bool,
    /// Let managed memory exceed the device's free memory.
    pub allow_oversubscription: bool,
    /// Legacy-pool policy.
    pub legacy: LegacyConfig,
    /// VMM-pool settings.
    pub vmm: VmmConfig,
    /// Settings of the `torch` kind (PyTorch's caching policy).
    pub torch: CachingConfig,
    /// Upper bounds of size classes, ascending: when not empty, each class gets a pool of its
    /// own ([`SizeClasses`]). Empty (the default): one pool.
    pub size_classes: Vec<usize>,
}

/// Parses a `CUPOOL_SIZE_CLASSES` value: byte bounds separated by commas, strictly
/// ascending, or `none`.
pub fn parse_size_classes(value: &str) -> Result<Vec<usize>, InvalidConfig> {
    use crate::adaptors::size_classes::{check_bounds, BOUNDS_ACCEPTED};
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let bounds = v
        .split(',')
        .map(|b| b.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| InvalidConfig::new("CUPOOL_SIZE_CLASSES", value, BOUNDS_ACCEPTED))?;
    check_bounds(&bounds)?;
    Ok(bounds)
}

impl PoolConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, PoolError> {
        for name in ENV_NAMES {
            if let Err(std::env::VarError::NotUnicode(v)) = std::env::var(name) {
                let shown = v.to_string_lossy().into_owned();
                return Err(
                    InvalidConfig::new(name, shown, "UTF-8 text (the value is not)").into(),
                );
            }
        }
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads settings through `get` (a variable's value, or `None` if unset), so callers and
    /// tests can supply their own environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, PoolError> {
        let mut c = PoolConfig::default();
        let flag = |var: &'static str| -> Result<bool, InvalidConfig> {
            match get(var) {
                Some(v) => parse_bool(var, &v),
                None => Ok(false),
            }
        };
        if let Some(v) = get("GGML_POOL") {
            let kind = PoolKind::parse(&v)
                .ok_or_else(|| InvalidConfig::new("GGML_POOL", &v, PoolKind::names()))?;
            c.kind = Some(kind);
        }
        c.no_vmm = flag("GGML_CUDA_NO_VMM")?;
        if flag("GGML_CUDA_POOL_USE_MANAGED")? {
            match c.kind {
                None | Some(PoolKind::Managed) => c.kind = Some(PoolKind::Managed),
                Some(k) => {
                    return Err(PoolError::Conflict {
                        setting: format!("GGML_POOL={k}"),
                        with: "GGML_CUDA_POOL_USE_MANAGED=1".into(),
                        resolve: "choose one pool",
                    })
                }
            }
        }
        if c.no_vmm && c.kind == Some(PoolKind::Vmm) {
            return Err(PoolError::Conflict {
                setting: "GGML_POOL=vmm".into(),
                with: "GGML_CUDA_NO_VMM=1".into(),
                resolve: "unset one of them",
            });
        }
        c.fallback_managed = flag("GGML_CUDA_ALLOC_FALLBACK_MANAGED")?;
        c.allow_oversubscription = flag("CUPOOL_ALLOW_OVERSUBSCRIPTION")?;
        if let Some(v) = get("CUPOOL_SIZE_CLASSES") {
            c.size_classes = parse_size_classes(&v)?;
        }
        if let Some(v) = get("CUPOOL_VMM_ROUND_LARGE") {
            c.vmm.large_rounding = v.trim().parse().map_err(|_| {
                InvalidConfig::new(
                    "CUPOOL_VMM_ROUND_LARGE",
                    &v,
                    "a power of two from 128 to 1073741824 (bytes)",
                )
            })?;
            c.vmm.validate()?;
        }
        if let Some(v) = get("CUPOOL_VMM_RECYCLE") {
            c.vmm.recycle = parse_bool("CUPOOL_VMM_RECYCLE", &v)?;
        }
        if let Some(v) = get("CUPOOL_VMM_RECYCLE_PAGE") {
            c.vmm.recycle_page = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|m| (1..=1024).contains(m))
                .map(|m| m << 20)
                .ok_or_else(|| {
                    InvalidConfig::new(
                        "CUPOOL_VMM_RECYCLE_PAGE",
                        &v,
                        "a number of MiB from 1 to 1024",
                    )
                })?;
        }
        if let Some(v) = get("CUPOOL_VMM_RECYCLE_FREE") {
            c.vmm.recycle_free = v.trim().parse().ok().filter(|p| *p <= 100).ok_or_else(|| {
                InvalidConfig::new("CUPOOL_VMM_RECYCLE_FREE", &v, "a percent from 0 to 100")
            })?;
        }
        if let Some(v) = get("CUPOOL_VMM_LANES") {
            c.vmm.lanes = parse_bool("CUPOOL_VMM_LANES", &v)?;
        }
        if let Some(v) = get("CUPOOL_VMM_AHEAD") {
            c.vmm.ahead = crate::upstream::vmm::Ahead::from_word(&v).ok_or_else(|| {
                InvalidConfig::new("CUPOOL_VMM_AHEAD", &v, "one of worker, inline, off")
            })?;
        }
        Ok(c)
    }

    /// Sets the kind.
    pub fn kind(mut self, kind: PoolKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Sets the managed fallback.
    pub fn fallback_managed(mut self, on: bool) -> Self {
        self.fallback_managed = on;
        self
    }

    /// The kind this configuration gives on a device with or without VMM.
    pub fn resolve(&self, vmm_supported: bool) -> Result<PoolKind, PoolError> {
        match self.kind {
            Some(k @ (PoolKind::Vmm | PoolKind::Nccl)) if !vmm_supported => {
                Err(PoolError::Unsupported {
                    kind: k,
                    lacks: "virtual memory management",
                    use_instead: "legacy or managed",
                })
            }
            Some(k) => Ok(k),
            None if vmm_supported && !self.no_vmm => Ok(PoolKind::Vmm),
            None => Ok(PoolKind::Legacy),
        }
    }

    /// Checks every setting.
    pub fn validate(&self) -> Result<(), PoolError> {
        self.legacy.placement.validate()?;
        self.vmm.validate()?;
        self.torch.validate()?;
        crate::adaptors::size_classes::check_bounds(&self.size_classes)?;
        Ok(())
    }

    /// Builds a pool on `driver`.
    pub fn build(&self, driver: Arc<dyn Driver>) -> Result<Arc<dyn Pool>, PoolError> {
        self.validate()?;
        // A device opened on first use opens here, so that the kind chosen below reads what the
        // device supports, not the failure to open it.
        driver.open()?;
        let kind = self.resolve(driver.vmm_supported())?;
        if self.kind.is_none() {
            tracing::info!(device = driver.ordinal(), pool = %kind, vmm_supported = driver.vmm_supported(), no_vmm = self.no_vmm, "pool chosen automatically");
        }
        let pool = if self.size_classes.is_empty() {
            self.build_kind(kind, driver)?
        } else {
            let pools = (0..=self.size_classes.len())
                .map(|_| self.build_kind(kind, driver.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            Arc::new(SizeClasses::new(self.size_classes.clone(), pools)?)
        };
        Ok(if self.fallback_managed {
            Arc::new(ManagedFallback::new(pool, self.allow_oversubscription))
        } else {
            pool
        })
    }

    /// One pool of `kind`: the one place that maps kinds to their pools.
    fn build_kind(
        &self,
        kind: PoolKind,
        driver: Arc<dyn Driver>,
    ) -> Result<Arc<dyn Pool>, PoolError> {
        let pool: Arc<dyn Pool> = match kind {
            PoolKind::Vmm => Arc::new(VmmPool::with_config(driver, self.vmm.clone())?),
            PoolKind::Legacy => Arc::new(LegacyPool::with_config(driver, self.legacy.clone())?),
            PoolKind::Managed => Arc::new(ManagedPool::new(
                driver,
                ManagedConfig {
                    allow_oversubscription: self.allow_oversubscription,
                },
            )),
            PoolKind::Torch => Arc::new(TorchPool::with_config(driver, self.torch)?),
            PoolKind::Direct => Arc::new(DirectPool::new(driver)),
            PoolKind::Nccl => Arc::new(NcclPool::new(driver)),
        };
        Ok(pool)
    }
}
