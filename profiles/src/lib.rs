//! Engine profiles: the pool requests a real engine makes for one ubatch, op by op, in its
//! order, derived from its sources and checked against traces recorded inside it.
//!
//! A profile answers "what does ggml take from its per-device pool for this ubatch?" for one
//! upstream commit. The answer is a list of [`OpCall`]s: each op takes its [`OpCall::held`]
//! buffers in order and keeps them to its end, takes and returns each of its
//! [`OpCall::inner`] buffers one at a time meanwhile (a stream-k fixup per kernel launch), then
//! returns the held ones in reverse, as ggml's `ggml_cuda_pool_alloc` destructors do. That
//! order decides what a best-fit pool strands, so it is part of the answer, not a detail.
//!
//! Profiles ([`Profile`], dense models): `ik_llama` (ik_llama.cpp 8337e4cd, [`ik_llama`]),
//! `llama-b8833` and `llama` (llama.cpp before and after PR #23907, [`llama`]). Every profile
//! builds a layer in the same op order (`graph`); they differ in what each op's kernel takes.
//!
//! [`gguf`] reads a GGUF file's header (architecture, shape, tensor types and sizes, never the
//! weights) and maps it to the [`EngineModel`] and [`Weights`] a profile is asked about.
//!
//! [`predict`] turns a profile's requests for a whole prefill into a trace and replays it
//! through a pool on the simulated device; [`bench`] does the same for a mainline `llama-bench`
//! test (a prompt, tokens generated after it, the warm-up), laid out as libcupool records it. The crate stands on `cupool-pool` (the trace format,
//! the replay, the pool's settings) and takes two facts from `cupool-kernels`: the cache's
//! [`KvType`](cupool_kernels::KvType) and flash attention's KV padding.
#![warn(missing_docs)]

pub mod bench;
mod error;
mod events;
pub mod gguf;
mod graph;
pub mod ik_llama;
pub mod llama;
mod model;
mod op;
pub mod predict;
mod profile;
mod setup;
mod sweep;

pub use error::ProfileError;
pub use events::trace_events;
pub use model::{Arch, EngineModel, Mla, Moe};
pub use op::{OpCall, OpKind, Request};
pub use profile::Profile;
pub use setup::{Device, Setup, UbatchShape, Weights};
pub use sweep::{sweep_step, SweepStep, KV_PADDING};
