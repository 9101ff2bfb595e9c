//! The configuration string of `cupool_init`: `NAME=VALUE` pairs, separated by spaces, commas
//! or semicolons, with the names of the environment variables (a null string reads the
//! environment itself):
//!
//! | name | values |
//! |---|---|
//! | `GGML_POOL` | `vmm`, `legacy`, `managed`, `torch`, `direct` (unset: vmm where supported, else legacy) |
//! | `GGML_CUDA_NO_VMM`, `GGML_CUDA_POOL_USE_MANAGED`, `GGML_CUDA_ALLOC_FALLBACK_MANAGED`, `CUPOOL_ALLOW_OVERSUBSCRIPTION` | booleans |
//! | `CUPOOL_DEVICE` | `cuda` (every CUDA device), `sim` (simulated cards), `auto` (the default: cuda if present) |
//! | `CUPOOL_SIM_GIB` | each simulated card's memory in GiB (default 16) |
//! | `CUPOOL_SIM_DEVICES` | how many simulated cards (default 1) |
//! | `CUPOOL_SIZE_CLASSES` | byte bounds of size classes with a pool each, or `none` (here `1048576` by default for vmm) |
//! | `CUPOOL_PURGE` | at an engine's ubatch boundary (`cupool_ubatch_end`): `never` (keep every cached buffer; no out-of-memory retry either), `always` (synchronize, return every idle buffer), `auto` (the default: return what the ubatch just ended would not reuse, when the device is short: `CUPOOL_AUTO_HEADROOM`) |
//! | `CUPOOL_AUTO_HEADROOM` | when `auto` returns memory at a boundary: while the device has less free than this. `ubatch` (the default: twice what the ubatch just ended held at once), a number of MiB (0: never at boundaries, only before an out-of-memory retry), or `inf` (at every boundary with something to return) |
//! | `CUPOOL_VMM_ROUND_LARGE` | the VMM pool rounds requests above 1 MiB up to this power of two (here 2 MiB by default, for PyTorch's traffic) |

use crate::status::{CupoolStatus, Failure};
use cupool_pool::AutoHeadroom as Headroom;
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use std::collections::HashMap;

/// The library's own names; the pool's ([`cupool_pool::config::ENV_NAMES`]) come too.
const OWN_NAMES: &[&str] = &[
    "CUPOOL_DEVICE",
    "CUPOOL_SIM_GIB",
    "CUPOOL_SIM_DEVICES",
    "CUPOOL_PURGE",
    "CUPOOL_AUTO_HEADROOM",
];

fn names() -> impl Iterator<Item = &'static str> {
    cupool_pool::config::ENV_NAMES
        .iter()
        .chain(OWN_NAMES)
        .copied()
}

/// The VMM pool's rounding of large requests unless configured: the 2 MiB granule. A
/// framework's tensors are replaced by slightly larger ones (a KV cache concatenated every
/// chunk); with ggml's 128 bytes the holes they leave are just too small (docs/pytorch.md).
const ROUND_LARGE: usize = 2 << 20;

/// The VMM pool's size classes unless configured: small (up to 1 MiB) and large requests in
/// address ranges of their own, so small tensors do not pin the holes large ones leave
/// (docs/pytorch.md).
const SIZE_CLASSES: [usize; 1] = [1 << 20];

/// Which devices the library runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Devices {
    Cuda,
    Sim { gib: f64, count: usize },
    Auto { gib: f64, count: usize },
}

/// A parsed configuration.
#[derive(Debug)]
pub(crate) struct Config {
    pub pool: PoolConfig,
    pub devices: Devices,
    pub purge: PurgePolicy,
    pub headroom: Headroom,
}

fn invalid(text: String) -> Failure {
    Failure::new(CupoolStatus::InvalidArgument, text)
}

impl Config {
    /// Parses `text`, or the environment when `None`.
    pub fn parse(text: Option<&str>) -> Result<Self, Failure> {
        let pairs: HashMap<String, String> = match text {
            None => {
                let mut m = HashMap::new();
                for n in names() {
                    match std::env::var(n) {
                        Ok(v) => {
                            m.insert(n.to_string(), v);
                        }
                        Err(std::env::VarError::NotUnicode(_)) => {
                            return Err(invalid(format!("{n} is not UTF-8 text")));
                        }
                        Err(std::env::VarError::NotPresent) => {}
                    }
                }
                m
            }
            Some(t) => {
                let mut m = HashMap::new();
                for item in t
                    .split([' ', ',', ';', '\n', '\t'])
                    .filter(|s| !s.is_empty())
                {
                    let (k, v) = item.split_once('=').ok_or_else(|| {
                        invalid(format!("configuration item {item:?} is not NAME=VALUE"))
                    })?;
                    if !names().any(|n| n == k) {
                        return Err(invalid(format!(
                            "unknown configuration name {k:?}: accepted names are {}",
                            names().collect::<Vec<_>>().join(", ")
                        )));
                    }
                    m.insert(k.to_string(), v.to_string());
                }
                m
            }
        };
        let mut pool = PoolConfig::from_lookup(|k| pairs.get(k).cloned())?;
        if !pairs.contains_key("CUPOOL_VMM_ROUND_LARGE") {
            pool.vmm.large_rounding = ROUND_LARGE;
        }
        if !pairs.contains_key("CUPOOL_SIZE_CLASSES")
            && matches!(pool.kind, None | Some(PoolKind::Vmm))
        {
            pool.size_classes = SIZE_CLASSES.to_vec();
        }
        let gib = match pairs.get("CUPOOL_SIM_GIB") {
            None => 16.0,
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|g| g.is_finite() && *g > 0.0 && *g <= 256.0 * 1024.0)
                .ok_or_else(|| invalid(format!("CUPOOL_SIM_GIB={v:?} is not valid: accepted values are numbers of GiB above 0 and up to 262144")))?,
        };
        let count = match pairs.get("CUPOOL_SIM_DEVICES") {
            None => 1,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    invalid(format!(
                        "CUPOOL_SIM_DEVICES={v:?} is not valid: accepted values are 1 to 64"
                    ))
                })?,
        };
        let devices = match pairs
            .get("CUPOOL_DEVICE")
            .map(|s| s.trim().to_ascii_lowercase())
        {
            None => Devices::Auto { gib, count },
            Some(d) if d == "auto" => Devices::Auto { gib, count },
            Some(d) if d == "cuda" => Devices::Cuda,
            Some(d) if d == "sim" => Devices::Sim { gib, count },
            Some(d) => {
                return Err(invalid(format!(
                    "CUPOOL_DEVICE={d:?} is not valid: accepted values are cuda, sim, auto"
                )))
            }
        };
        let purge = match pairs.get("CUPOOL_PURGE") {
            None => PurgePolicy::Auto,
            Some(v) => PurgePolicy::parse(&v.trim().to_ascii_lowercase()).ok_or_else(|| {
                invalid(format!(
                    "CUPOOL_PURGE={v:?} is not valid: accepted values are {}",
                    PurgePolicy::NAMES
                ))
            })?,
        };
        let headroom = match pairs.get("CUPOOL_AUTO_HEADROOM") {
            None => Headroom::Ubatch,
            Some(v) => Headroom::parse(v).ok_or_else(|| {
                invalid(format!(
                    "CUPOOL_AUTO_HEADROOM={v:?} is not valid: accepted values are ubatch, inf, or a number of MiB (0 or more)"
                ))
            })?,
        };
        Ok(Self {
            pool,
            devices,
            purge,
            headroom,
        })
    }
}
