//! Why kernels could not be loaded or launched.

use cudarc::driver::DriverError;

/// Why kernels could not be loaded or launched.
#[derive(Debug)]
pub enum KernelError {
    /// NVRTC is missing or rejected a source.
    Compile(String),
    /// The driver failed.
    Driver(DriverError),
    /// Shapes the kernels do not support.
    Unsupported(String),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelError::Compile(s) => write!(f, "kernel compilation failed: {s}"),
            KernelError::Driver(e) => write!(f, "kernel launch failed: {e}"),
            KernelError::Unsupported(s) => write!(f, "unsupported kernel shape: {s}"),
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KernelError::Driver(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DriverError> for KernelError {
    fn from(e: DriverError) -> Self {
        KernelError::Driver(e)
    }
}
