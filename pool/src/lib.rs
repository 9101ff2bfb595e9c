//! cupool's allocator: CUDA memory pools for LLM inference.
//!
//! Layers, bottom up (`docs/architecture.md` draws them):
//! - [`driver`]: the device primitives, on CUDA ([`driver::cuda::CudaDriver`]) or a simulated
//!   device ([`driver::sim::SimDevice`]); driver adaptors for a memory limit and fault
//!   injection;
//! - [`placement`]: where blocks go, in addresses and sizes only: ggml's legacy slots, the VMM
//!   bump range with indexed holes;
//! - [`upstream`]: where memory comes from: device malloc, managed malloc (capped per device),
//!   VMM reserve-and-map with adaptive growth;
//! - [`core`]: [`core::CorePool`], the one pool implementation over a placement and an
//!   upstream (ownership checks, poison, epochs, tokens, stats, OOM report, drop contract);
//!   [`pools`] names the combinations cupool ships;
//! - [`adaptors`]: behaviour by wrapping any [`Pool`]: phases, managed fallback, size classes;
//! - [`trace`]: allocation traces: the recorder (an adaptor), the parser and the replay;
//! - [`config`] and [`registry`]: `GGML_POOL` selection, one pool per (device, stream);
//!   [`settings`]: the table of every setting cupool's front ends read;
//! - [`PoolBuffer`]: typed RAII buffers that are cudarc kernel arguments.
//!
//! ```
//! use std::sync::Arc;
//! use cupool_pool::{driver::sim::{SimConfig, SimDevice}, PoolBuffer, PoolConfig, PoolKind};
//!
//! let device = Arc::new(SimDevice::new(SimConfig::gib(12.0))?);
//! let pool = PoolConfig::default().kind(PoolKind::Vmm).build(device.clone())?;
//! {
//!     let scratch = PoolBuffer::<f32>::alloc(&pool, 1 << 20)?;
//!     assert_eq!(scratch.bytes(), 4 << 20);
//! } // back in the pool here
//! let token = cupool_pool::synchronize(device.as_ref())?;
//! pool.purge(&token, cupool_pool::Purge::All)?;
//! assert_eq!(pool.stats().reserved_bytes, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

#[macro_use]
pub mod adaptors;
mod block;
pub mod boundary;
mod buffer;
#[cfg(feature = "check")]
pub mod check;
pub mod config;
pub mod core;
pub mod driver;
mod error;
mod invalid;
mod kind;
pub mod layering;
mod owners;
pub mod placement;
mod pool;
pub mod pools;
mod purge_policy;
pub mod rate_limit;
pub mod registry;
pub mod settings;
mod snapshot;
mod stats;
pub mod sync;
pub mod trace;
pub mod upstream;

pub use block::{Block, PoolId};
pub use boundary::Boundary;
pub use buffer::PoolBuffer;
pub use config::PoolConfig;
pub use error::{FreeError, OomReport, PoolError};
pub use invalid::InvalidConfig;
pub use kind::PoolKind;
pub use pool::{Moved, Pool, Purge, Released, MAX_REQUEST};
pub use purge_policy::{AutoHeadroom, PurgePolicy};
pub use registry::{Registry, StreamId};
pub use snapshot::{unsupported as snapshot_unsupported, PoolSnapshot};
pub use stats::{DriverCalls, PhaseStats, PoolStats};
pub use sync::{synchronize, SyncToken};
