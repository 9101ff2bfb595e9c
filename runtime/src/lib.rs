//! A compact prefill engine whose memory behaves like llama.cpp's, on cupool.
//!
//! A [`Runtime`] is built from a model shape ([`ModelShape`]) and a [`RunConfig`]. At startup
//! it allocates, outside the pool and once, the weights, the KV cache for the whole context and
//! the compute buffer for the worst ubatch ([`Startup`] owns them). `decode` splits a batch into ubatches; each ubatch
//! is a pool *phase*, and every flash-attention call takes its scratch (`K_f16`, `V_f16`,
//! `dst_tmp`, `dst_tmp_meta`) from the pool, as ggml's `launch_fattn` does. After each
//! ubatch the runtime records the high-water, warns when compute buffer + pool reserve exceeds
//! the reserved budget, and applies the purge policy at prefill boundaries. [`plan`] predicts
//! the pool's need before the run by dry-running the whole context.
//!
//! Inside: `engine/` is the ubatch loop; `layer.rs` is the transformer, written once over
//! the kernels an [`executor::Executor`] provides (CUDA, CPU reference, or none for dry runs).
#![warn(missing_docs)]

mod budget;
pub mod config;
mod counting_driver;
mod engine;
mod engine_kind;
mod error;
pub mod executor;
mod fast_forward;
mod held;
mod layer;
pub mod memory;
pub mod model;
pub mod planner;
pub mod policy;
pub mod profile;
mod profiled;
mod report;
mod runtime;
mod scratch;
mod startup;

pub use config::RunConfig;
pub use error::RuntimeError;
pub use executor::ExecutorKind;
pub use half;
pub use layer::Ubatch;
pub use model::ModelShape;
pub use planner::{plan, Plan};
pub use policy::{BudgetMode, PurgePolicy};
pub use report::{RunReport, UbatchRow};
pub use runtime::Runtime;
pub use scratch::Scratch;
pub use startup::Startup;
