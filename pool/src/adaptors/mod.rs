//! Behaviour added by wrapping a pool, in the style of RMM's resource adaptors.

pub mod managed_fallback;
pub mod recorder;

pub use managed_fallback::ManagedFallback;
pub use recorder::{Recorder, TraceEvent};
