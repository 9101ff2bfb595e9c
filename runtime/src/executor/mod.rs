//! Executors run a ubatch's maths. All three see the same allocation sequence: the runtime
//! takes the flash-attention scratch from the pool itself and hands it to the executor.
//! - [`cuda::CudaExecutor`]: NVRTC kernels on the GPU;
//! - [`cpu::CpuExecutor`]: the reference maths on the simulated device's host memory;
//! - [`dry_run::DryRun`]: no maths at all, for planning and large simulations.

pub mod cpu;
pub mod cuda;
pub mod dry_run;

use crate::error::RuntimeError;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use cupool_kernels::fa::FaScratch;
use cupool_pool::{Pool, PoolBuffer, PoolError};
use half::f16;
use std::sync::Arc;

/// Which executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// Allocations only.
    DryRun,
    /// Reference maths on host memory (simulated device only).
    Cpu,
    /// Kernels on a CUDA device.
    Cuda,
}

impl ExecutorKind {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::DryRun => "dry-run",
            ExecutorKind::Cpu => "cpu",
            ExecutorKind::Cuda => "cuda",
        }
    }
}

/// The startup allocations, by device address, and their layouts.
#[derive(Clone, Copy, Debug)]
pub struct DeviceBuffers {
    /// Weights buffer.
    pub weights: u64,
    /// KV cache.
    pub kv: u64,
    /// Compute buffer.
    pub compute: u64,
    /// Weight layout.
    pub wl: WeightLayout,
    /// KV layout.
    pub kvl: KvLayout,
    /// Compute layout.
    pub cl: ComputeLayout,
}

/// One ubatch as the executor sees it.
#[derive(Clone, Copy, Debug)]
pub struct Ubatch<'a> {
    /// Index within the run.
    pub index: usize,
    /// Position of its first token.
    pub pos0: usize,
    /// Tokens in it.
    pub n_tokens: usize,
    /// KV length its attention sees (padded).
    pub n_kv: usize,
    /// Token ids.
    pub tokens: &'a [i32],
}

/// One flash-attention call's scratch, taken from the pool in ggml's order and returned in
/// reverse when dropped.
#[derive(Debug)]
pub struct Scratch {
    /// The sizes.
    pub fa: FaScratch,
    /// `K_f16`.
    pub k_f16: Option<PoolBuffer<f16>>,
    /// `V_f16`.
    pub v_f16: Option<PoolBuffer<f16>>,
    /// `dst_tmp`.
    pub dst_tmp: Option<PoolBuffer<f32>>,
    /// `dst_tmp_meta`.
    pub dst_meta: Option<PoolBuffer<[f32; 2]>>,
}

fn take<T>(pool: &Arc<dyn Pool>, n: usize) -> Result<Option<PoolBuffer<T>>, PoolError> {
    if n == 0 {
        Ok(None)
    } else {
        PoolBuffer::alloc(pool, n).map(Some)
    }
}

impl Scratch {
    /// Takes the scratch of `fa` from `pool`. On failure whatever was taken goes back.
    pub fn take(pool: &Arc<dyn Pool>, fa: FaScratch) -> Result<Self, PoolError> {
        let mut s = Scratch {
            fa,
            k_f16: None,
            v_f16: None,
            dst_tmp: None,
            dst_meta: None,
        };
        s.k_f16 = take(pool, fa.k_f16)?;
        s.v_f16 = take(pool, fa.v_f16)?;
        s.dst_tmp = take(pool, fa.dst_tmp)?;
        s.dst_meta = take(pool, fa.dst_meta)?;
        Ok(s)
    }

    /// The buffer's address, or 0 when not taken.
    pub fn ptr<T>(b: &Option<PoolBuffer<T>>) -> u64 {
        b.as_ref().map_or(0, |b| b.ptr())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Reverse order, as ggml's destructors run.
        drop(self.dst_meta.take());
        drop(self.dst_tmp.take());
        drop(self.v_f16.take());
        drop(self.k_f16.take());
    }
}

/// Runs the maths of a ubatch, layer by layer.
pub trait Executor: Send {
    /// Which executor.
    fn kind(&self) -> ExecutorKind;
    /// Fills the weights, clears the KV cache.
    fn init(&mut self, bufs: &DeviceBuffers) -> Result<(), RuntimeError>;
    /// Embeds the ubatch's tokens into the hidden state.
    fn begin_ubatch(&mut self, ub: &Ubatch) -> Result<(), RuntimeError>;
    /// Norm, Q/K/V projections, new K/V rows into the cache.
    fn pre_attention(&mut self, layer: usize, ub: &Ubatch) -> Result<(), RuntimeError>;
    /// K/V conversion into the scratch (if quantized), flash attention, split combine.
    fn attention(
        &mut self,
        layer: usize,
        ub: &Ubatch,
        scratch: &Scratch,
    ) -> Result<(), RuntimeError>;
    /// Output projection, residual, MLP, residual.
    fn post_attention(&mut self, layer: usize, ub: &Ubatch) -> Result<(), RuntimeError>;
    /// Waits for the ubatch's work (timing is per ubatch).
    fn end_ubatch(&mut self, ub: &Ubatch) -> Result<(), RuntimeError>;
    /// The hidden state of the last ubatch, `n_tokens * n_embd` floats.
    fn hidden(&self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError>;
}
