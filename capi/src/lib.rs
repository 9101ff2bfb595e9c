//! libcupool: cupool's C ABI.
//!
//! A shared (`libcupool.so`) and a static (`libcupool.a`) library over the pool registry, with
//! the header `include/cupool.h` generated from these sources by cbindgen (a test fails when
//! the checked-in header is stale). Every function:
//! - returns a status code or a null pointer on failure, and sets a thread-local error text
//!   (`cupool_last_error`) that says what was wrong and what is accepted;
//! - lets no Rust panic cross the boundary (a panic becomes `CUPOOL_STATUS_INTERNAL`);
//! - checks every pointer it is given back: a pointer cupool never handed out, a double free or
//!   a size mismatch is reported and leaves the pool untouched.
//!
//! Layers: `status.rs` (codes, last error, the panic guard), `config.rs` (the configuration
//! string), `state.rs` (the process-wide library state: devices, one pool per device × stream ×
//! tag), `cached.rs` (a stream's pool with its threads' states in front: what purges, sleeps and
//! statistics see), `local.rs` (one thread's state in one pool: its kept blocks, counts and live
//! blocks, behind one lock: `owned_lock.rs`), `threads.rs` (each thread's cache of its states, and shutdown's
//! gate), `front.rs` (what a thread's state reaches of its pool), `owners.rs` (which thread
//! holds a block, for frees from another thread), `api/` (the C functions, by idea: opening, closing and the
//! settings table; memory; releases; stats; recording; tags, sleep and wake), `torch.rs` (PyTorch's
//! `CUDAPluggableAllocator` entry points), `stats.rs` (statistics as JSON), `record.rs` (traces for
//! `repro-prefill replay`), `boundary.rs` (an engine's ubatch boundary: `CUPOOL_PURGE`, per-ubatch
//! peaks), `tags.rs` (the names a caller gives what it allocates, for sleep and wake), `registered.rs` (ranges
//! registered with NCCL: kept mapped until deregistered), `history.rs`, `segments.rs` and
//! `snapshot.rs` (the memory history, what the pools hold from the driver, and the snapshot of
//! both in PyTorch's format).

mod api;
mod boundary;
mod cached;
mod config;
mod drivers;
mod front;
mod hash;
mod history;
mod local;
mod log;
mod owned_lock;
mod owners;
mod peaks;
mod record;
mod registered;
mod segments;
mod snapshot;
mod state;
mod stats;
mod status;
mod tags;
mod threads;
mod torch;
mod usage;

pub use api::*;
pub use status::{cupool_last_error, CupoolStatus};
pub use torch::{cupool_torch_alloc, cupool_torch_free};

#[cfg(test)]
mod tests;
