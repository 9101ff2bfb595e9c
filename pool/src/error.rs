//! The crate's error, [`PoolError`], and what it carries.
//!
//! Every fallible public function of this crate returns [`PoolError`] (a refused free returns
//! [`FreeError`], which hands the block back and has the [`PoolError`] as its source). Its
//! parts are errors of their own, reachable through [`std::error::Error::source`]: the
//! [`DriverError`] of a failed driver call, the [`InvalidConfig`] of a bad setting.

use crate::block::{Block, PoolId};
use crate::driver::{DriverError, MemInfo};
use crate::invalid::InvalidConfig;
use crate::kind::PoolKind;
use std::fmt;

/// Everything worth knowing when an allocation does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomReport {
    /// Bytes asked for.
    pub requested: usize,
    /// The pool that failed.
    pub pool: PoolKind,
    /// Bytes live in the pool (asked for by its users).
    pub live: usize,
    /// Device bytes the pool holds (live plus cached).
    pub reserved: usize,
    /// Bytes the pool holds that no user has.
    pub cached: usize,
    /// The part of `cached` that is too small for this request: held, but useless to it.
    pub stranded: usize,
    /// The device's free and total memory after the failure, if it could be read.
    pub device: Option<MemInfo>,
    /// The driver call that failed, or why the pool refused.
    pub cause: String,
    /// One line on what to do about it.
    pub suggestion: String,
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of device memory: {} pool asked for {} ({} bytes); pool live {}, reserved {}, cached {} ({} of it stranded: too small for this request)",
            self.pool,
            mib(self.requested),
            self.requested,
            mib(self.live),
            mib(self.reserved),
            mib(self.cached),
            mib(self.stranded),
        )?;
        match self.device {
            Some(m) => write!(f, "; device {} free of {}", mib(m.free), mib(m.total))?,
            None => write!(f, "; device memory unknown")?,
        }
        write!(
            f,
            "; cause: {}. Suggestion: {}",
            self.cause, self.suggestion
        )
    }
}

/// Why a pool operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// The request does not fit; the report has the whole picture.
    OutOfMemory(Box<OomReport>),
    /// The size cannot be served by any pool.
    InvalidSize {
        /// What was asked for, in bytes (saturated if the element count overflowed).
        requested: usize,
        /// The largest size accepted.
        max: usize,
    },
    /// A block was freed into a pool that did not hand it out.
    WrongPool {
        /// The pool that handed the block out.
        owner: PoolId,
        /// The pool it was given to.
        given_to: PoolId,
    },
    /// A sync token from another device was given to this pool.
    WrongDevice {
        /// This pool's device ordinal.
        device: usize,
    },
    /// A driver call other than an allocation failed.
    Driver(DriverError),
    /// A configuration value is outside what it accepts.
    InvalidConfig(InvalidConfig),
    /// Two settings contradict each other.
    Conflict {
        /// One setting, as `NAME=value`.
        setting: String,
        /// The setting it contradicts, as `NAME=value`.
        with: String,
        /// How to resolve it.
        resolve: &'static str,
    },
    /// The chosen pool kind cannot run on this device.
    Unsupported {
        /// The kind chosen.
        kind: PoolKind,
        /// What the device lacks.
        lacks: &'static str,
        /// The kinds it can run.
        use_instead: &'static str,
    },
    /// Size classes need one pool more than bounds, all on one device.
    SizeClasses {
        /// Bounds given.
        bounds: usize,
        /// Pools given.
        pools: usize,
        /// Whether the pools are on more than one device.
        mixed_devices: bool,
    },
    /// The pool is asleep ([`crate::Pool::sleep`]): it serves no allocation until it wakes.
    Asleep {
        /// The pool's device ordinal.
        device: usize,
        /// Bytes asleep.
        bytes: usize,
    },
    /// Only a pool over reserved address ranges can release its memory and keep its addresses.
    CannotSleep {
        /// The pool's kind.
        kind: PoolKind,
    },
    /// A snapshot was refused ([`crate::Pool::snapshot`], [`crate::Pool::restore`]).
    Snapshot {
        /// The pool's kind.
        kind: PoolKind,
        /// Why, and what would be accepted.
        why: &'static str,
    },
    /// No device with that index.
    NoSuchDevice {
        /// The index asked for.
        device: usize,
        /// How many devices there are.
        devices: usize,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::OutOfMemory(r) => r.fmt(f),
            PoolError::InvalidSize { requested, max } => write!(
                f,
                "invalid allocation size {requested} bytes: sizes from 0 to {max} bytes are accepted (0 is served as 1)"
            ),
            PoolError::WrongPool { owner, given_to } => write!(
                f,
                "block freed into the wrong pool: it belongs to pool {owner:?}, was given to pool {given_to:?}; free a block into the pool that allocated it"
            ),
            PoolError::WrongDevice { device } => write!(
                f,
                "sync token is not from device {device}: purge needs a token from synchronizing this pool's own device"
            ),
            PoolError::Driver(e) => write!(f, "driver error: {e}"),
            PoolError::InvalidConfig(e) => e.fmt(f),
            PoolError::Conflict {
                setting,
                with,
                resolve,
            } => write!(f, "{setting} conflicts with {with}: {resolve}"),
            PoolError::Unsupported {
                kind,
                lacks,
                use_instead,
            } => write!(
                f,
                "GGML_POOL={kind}: this device does not support {lacks}; use {use_instead}"
            ),
            PoolError::SizeClasses {
                mixed_devices: true,
                ..
            } => f.write_str("the pools of size classes must share one device"),
            PoolError::SizeClasses { bounds, pools, .. } => write!(
                f,
                "size classes need one pool more than bounds: {bounds} bounds, {pools} pools"
            ),
            PoolError::Asleep { device, bytes } => write!(
                f,
                "the pool on device {device} is asleep ({bytes} bytes released by sleep): wake it before allocating from it"
            ),
            PoolError::CannotSleep { kind } => write!(
                f,
                "the {kind} pool cannot sleep: only the vmm pool releases memory and keeps its addresses; use GGML_POOL=vmm (cupool's default)"
            ),
            PoolError::Snapshot { kind, why } => write!(
                f,
                "no snapshot of the {kind} pool: {why}; snapshots are for dry runs on the simulated device: the legacy or vmm pool (or size classes over them), holding no live block"
            ),
            PoolError::NoSuchDevice { device, devices } => {
                write!(f, "no device {device}: the devices are 0..{devices}")
            }
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Driver(e) => Some(e),
            PoolError::InvalidConfig(e) => Some(e),
            _ => None,
        }
    }
}

impl From<InvalidConfig> for PoolError {
    fn from(e: InvalidConfig) -> Self {
        PoolError::InvalidConfig(e)
    }
}

impl From<DriverError> for PoolError {
    fn from(e: DriverError) -> Self {
        PoolError::Driver(e)
    }
}

impl PoolError {
    /// The OOM report, if this is an out-of-memory error.
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            PoolError::OutOfMemory(r) => Some(r),
            _ => None,
        }
    }
}

/// A free that was refused; the block comes back so nothing is lost.
#[derive(Debug)]
#[non_exhaustive]
pub struct FreeError {
    /// Why.
    pub error: PoolError,
    /// The block, still live.
    pub block: Block,
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for FreeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
