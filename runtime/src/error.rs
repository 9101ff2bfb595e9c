//! The runtime's error: one type, whose causes are reachable through `source()`.

use cupool_kernels::cuda::KernelError;
use cupool_pool::driver::DriverError;
use cupool_pool::{OomReport, PoolError};
use cupool_profiles::ProfileError;
use std::fmt;

/// Why the runtime could not do what was asked.
#[derive(Debug)]
pub enum RuntimeError {
    /// A bad shape or setting; the message says which and what is accepted.
    Invalid(String),
    /// Startup memory (weights, KV cache, compute buffer) does not fit the device.
    DoesNotFit {
        /// Which buffer.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// What the device had free, if it could be read.
        free: Option<usize>,
        /// The failed allocation.
        source: DriverError,
    },
    /// The planned budget does not fit the device.
    PlanDoesNotFit {
        /// What the plan needs, in bytes.
        needed: usize,
        /// What the device has.
        device: usize,
        /// The largest context that fits, if any.
        max_ctx: Option<usize>,
    },
    /// The pool ran out of memory during a run.
    OutOfMemory(Box<OomReport>),
    /// Any other pool failure, a bad pool configuration included.
    Pool(PoolError),
    /// A device call failed.
    Driver(DriverError),
    /// A kernel failed to build or launch.
    Kernel(KernelError),
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Invalid(s) => f.write_str(s),
            RuntimeError::DoesNotFit {
                what,
                bytes,
                free,
                source,
            } => {
                let verb = if what.ends_with('s') { "do" } else { "does" };
                write!(
                    f,
                    "the {what} ({:.2} GiB) {verb} not fit at startup",
                    gib(*bytes)
                )?;
                if let Some(free) = free {
                    write!(f, " ({:.2} GiB free)", gib(*free))?;
                }
                write!(f, ": {source}")
            }
            RuntimeError::PlanDoesNotFit {
                needed,
                device,
                max_ctx,
            } => {
                write!(
                    f,
                    "the planned memory ({:.2} GiB) does not fit the device ({:.2} GiB)",
                    gib(*needed),
                    gib(*device)
                )?;
                match max_ctx {
                    Some(c) => write!(f, "; the largest context that fits is {c} tokens"),
                    None => write!(f, "; no context fits: the weights alone are too large"),
                }
            }
            RuntimeError::OutOfMemory(r) => {
                write!(f, "{r} The runtime's view: the pool's need grows with the KV length; plan the budget before the run (repro-prefill plan), lower the context or the ubatch, or purge at ubatch boundaries (--purge auto)")
            }
            RuntimeError::Pool(e) => e.fmt(f),
            RuntimeError::Driver(e) => e.fmt(f),
            RuntimeError::Kernel(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RuntimeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuntimeError::DoesNotFit { source, .. } => Some(source),
            RuntimeError::Pool(e) => Some(e),
            RuntimeError::Driver(e) => Some(e),
            RuntimeError::Kernel(e) => Some(e),
            _ => None,
        }
    }
}

impl From<PoolError> for RuntimeError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::OutOfMemory(r) => RuntimeError::OutOfMemory(r),
            e => RuntimeError::Pool(e),
        }
    }
}

impl From<DriverError> for RuntimeError {
    fn from(e: DriverError) -> Self {
        RuntimeError::Driver(e)
    }
}

impl From<KernelError> for RuntimeError {
    fn from(e: KernelError) -> Self {
        RuntimeError::Kernel(e)
    }
}

/// A profile's refusal is a bad setting of the run: its message, as is.
impl From<ProfileError> for RuntimeError {
    fn from(e: ProfileError) -> Self {
        RuntimeError::Invalid(e.to_string())
    }
}
