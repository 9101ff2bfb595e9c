//! Behaviour added by wrapping a pool, in the style of RMM's resource adaptors. Each takes an
//! `Arc<dyn Pool>` and is one: stack them in any order.
//!
//! - [`Phases`]: per-phase high-water marks (the runtime's per-ubatch numbers);
//! - [`Recorder`]: a replayable trace of every allocation, free and phase;
//! - [`ManagedFallback`]: on device OOM, serve that one allocation from managed memory.
//!
//! A memory limit and fault injection wrap the driver instead (they change what the device
//! does, for every pool on it): see [`crate::driver::limit`] and [`crate::driver::fault`].

pub mod managed_fallback;
pub mod phases;
pub mod recorder;

pub use managed_fallback::ManagedFallback;
pub use phases::Phases;
pub use recorder::{Recorder, TraceEvent};
