//! cupool's allocator: CUDA memory pools for LLM inference.
//!
//! Layers, bottom up:
//! - [`driver`]: the device primitives, on CUDA ([`driver::cuda::CudaDriver`]) or a simulated
//!   device ([`driver::sim::SimDevice`]) with fault injection and a ledger;
//! - [`pools`]: one [`Pool`] trait; [`pools::vmm::VmmPool`], [`pools::legacy::LegacyPool`]
//!   (ggml's policy, plus purge and flush-and-retry) and [`pools::managed`];
//! - [`adaptors`]: behaviour by wrapping ([`adaptors::ManagedFallback`]);
//! - [`config`] and [`registry`]: `GGML_POOL` selection, one pool per (device, stream);
//! - [`PoolBuffer`]: typed RAII buffers that are cudarc kernel arguments.
//!
//! ```
//! use std::sync::Arc;
//! use cupool_pool::{driver::sim::{SimConfig, SimDevice}, PoolBuffer, PoolConfig, PoolKind};
//!
//! let device = Arc::new(SimDevice::new(SimConfig::gib(12.0)));
//! let pool = PoolConfig::default().kind(PoolKind::Vmm).build(device.clone()).unwrap();
//! {
//!     let scratch = PoolBuffer::<f32>::alloc(&pool, 1 << 20).unwrap();
//!     assert_eq!(scratch.bytes(), 4 << 20);
//! } // back in the pool here
//! let token = cupool_pool::synchronize(device.as_ref()).unwrap();
//! pool.purge(&token, cupool_pool::Purge::All).unwrap();
//! assert_eq!(pool.stats().reserved_bytes, 0);
//! ```
#![warn(missing_docs)]

pub mod adaptors;
mod block;
mod buffer;
pub mod check;
pub mod config;
pub mod driver;
mod error;
pub mod pools;
pub mod registry;
mod stats;
pub mod sync;

pub use block::{Block, PoolId};
pub use buffer::PoolBuffer;
pub use config::{ConfigError, PoolConfig};
pub use error::{FreeError, OomReport, PoolError};
pub use pools::{Pool, PoolKind, Purge, Released};
pub use registry::{Registry, StreamId};
pub use stats::{DriverCalls, PhaseStats, PoolStats};
pub use sync::{synchronize, SyncToken};
