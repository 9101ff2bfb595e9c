//! cupool: a CUDA memory pool for LLM inference, with an instrumented inference runtime.
//!
//! This umbrella crate re-exports the workspace members:
//! - [`pool`]: the allocator (usable alone as `cupool-pool`);
//! - [`runtime`]: the compact inference runtime;
//! - [`kernels`]: the NVRTC kernels and their CPU references;
//! - [`trace`]: allocation traces (record, parse and replay; the pool crate's);
//! - [`profiles`]: what real engines ask of their pools, op by op, and [`predict`], their
//!   replay (usable alone as `cupool-profiles`), and [`gguf`], a model read from a GGUF file's
//!   header and mapped to the profiles' model description.
//!
//! The `repro-prefill` command line is its own crate (`cli/`), so depending on this library
//! pulls in no argument parser, plotting or terminal code. The fuzz entry points are behind
//! the `fuzzing` feature.
//!
//! See the README for the environment variables and an example.

pub use cupool_kernels as kernels;
pub use cupool_pool as pool;
pub use cupool_profiles as profiles;
pub use cupool_runtime as runtime;

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub use cupool_pool::trace;
pub use cupool_profiles::gguf;
pub use cupool_profiles::predict;

/// The README's example, compiled and run as a test (it falls back to the simulated device).
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The runtime guide's example, compiled and run as a test.
#[doc = include_str!("../docs/runtime.md")]
#[cfg(doctest)]
pub struct RuntimeDocDoctests;
