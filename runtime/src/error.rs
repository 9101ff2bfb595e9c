use cupool_pool::{ConfigError, OomReport, PoolError};
use std::fmt;

/// Why the runtime could not do what was asked.
#[derive(Debug)]
pub enum RuntimeError {
    /// A bad shape or setting; the message says which and what is accepted.
    Invalid(String),
    /// The pool configuration does not work on this device.
    Config(ConfigError),
    /// Startup memory (weights, KV cache, compute buffer) does not fit the device.
    DoesNotFit(String),
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
    /// Any other pool failure.
    Pool(PoolError),
    /// A kernel or device failure.
    Device(String),
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Invalid(s) | RuntimeError::DoesNotFit(s) | RuntimeError::Device(s) => {
                f.write_str(s)
            }
            RuntimeError::Config(e) => e.fmt(f),
            RuntimeError::PlanDoesNotFit {
                needed,
                device,
                max_ctx,
            } => {
                write!(
                    f,
                    "the planned memory ({:.2} GiB) does not fit the device ({:.2} GiB)",
                    *needed as f64 / (1u64 << 30) as f64,
                    *device as f64 / (1u64 << 30) as f64
                )?;
                match max_ctx {
                    Some(c) => write!(f, "; the largest context that fits is {c} tokens"),
                    None => write!(f, "; no context fits: the weights alone are too large"),
                }
            }
            RuntimeError::OutOfMemory(r) => r.fmt(f),
            RuntimeError::Pool(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RuntimeError {}

impl From<PoolError> for RuntimeError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::OutOfMemory(r) => RuntimeError::OutOfMemory(r),
            e => RuntimeError::Pool(e),
        }
    }
}

impl From<cupool_pool::driver::DriverError> for RuntimeError {
    fn from(e: cupool_pool::driver::DriverError) -> Self {
        RuntimeError::Device(e.to_string())
    }
}

impl From<cupool_kernels::cuda::KernelError> for RuntimeError {
    fn from(e: cupool_kernels::cuda::KernelError) -> Self {
        RuntimeError::Device(e.to_string())
    }
}
