//! The configuration string of `cupool_init`: `NAME=VALUE` pairs, separated by spaces, commas
//! or semicolons, with the names of the environment variables (a null string reads the
//! environment itself). The names, what they accept and libcupool's defaults are the rows of
//! cupool's settings table that libcupool reads (`cupool_pool::settings`, returned by
//! `cupool_settings_json`); the defaults that differ from the library's are below and in
//! `cupool_pool::layering`.

use crate::status::{CupoolStatus, Failure};
use cupool_pool::layering::Layering;
use cupool_pool::settings::{FrontEnd, SETTINGS};
use cupool_pool::AutoHeadroom as Headroom;
use cupool_pool::{PoolConfig, PurgePolicy};
use std::collections::HashMap;

/// The configuration's names: the settings libcupool reads, less those it reads from the
/// environment only (`CUPOOL_LOG`). The pool's ([`cupool_pool::config::ENV_NAMES`]) come first.
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .filter(|s| s.is_read_by(FrontEnd::Libcupool) && !s.env_only)
        .map(|s| s.name)
}

/// The largest `CUPOOL_LIMIT_MIB`: 16 TiB, above any device.
const MAX_LIMIT_MIB: usize = 16 << 20;

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
    /// `CUPOOL_LIMIT_MIB`: the most each device's pools may hold, in bytes.
    pub limit: Option<usize>,
    /// `CUPOOL_TIME_DRIVER`: time every driver call (`state.rs`, `stats.rs`).
    pub time_driver: bool,
    /// `CUPOOL_VMM_DEFER`: page moves made by a worker thread, the stream waiting for them.
    pub vmm_defer: bool,
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
        // The size classes and the rounding for a framework's traffic, unless set.
        Layering::unless_set(|n| pairs.contains_key(n)).apply(&mut pool);
        // A framework frees out of order: the VMM pool recycles the pages of its holes.
        if !pairs.contains_key("CUPOOL_VMM_RECYCLE") {
            pool.vmm.recycle = true;
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
        let limit = match pairs.get("CUPOOL_LIMIT_MIB").map(|v| v.trim().to_ascii_lowercase()) {
            None => None,
            Some(v) if v == "off" => None,
            Some(v) => Some(
                v.parse::<usize>()
                    .ok()
                    .filter(|m| (1..=MAX_LIMIT_MIB).contains(m))
                    .map(|m| m << 20)
                    .ok_or_else(|| {
                        invalid(format!(
                            "CUPOOL_LIMIT_MIB={v:?} is not valid: accepted values are off, or a number of MiB from 1 to {MAX_LIMIT_MIB}"
                        ))
                    })?,
            ),
        };
        let time_driver = match pairs.get("CUPOOL_TIME_DRIVER") {
            None => false,
            Some(v) => cupool_pool::config::parse_bool("CUPOOL_TIME_DRIVER", v)
                .map_err(|e| invalid(e.to_string()))?,
        };
        let vmm_defer = match pairs.get("CUPOOL_VMM_DEFER") {
            None => false,
            Some(v) => cupool_pool::config::parse_bool("CUPOOL_VMM_DEFER", v)
                .map_err(|e| invalid(e.to_string()))?,
        };
        Ok(Self {
            pool,
            devices,
            purge,
            headroom,
            limit,
            time_driver,
            vmm_defer,
        })
    }
}
