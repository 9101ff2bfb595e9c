//! Executors run kernels; the transformer built from them is written once, in `layer.rs`.
//!
//! An executor works on device addresses: the startup buffers' regions and the
//! flash-attention scratch the engine takes from the pool. All three see the same allocation
//! sequence, because they allocate nothing themselves.
//! - [`cuda::CudaExecutor`]: NVRTC kernels on the GPU;
//! - [`cpu::CpuExecutor`]: the reference maths on the simulated device's host memory;
//! - [`dry_run::DryRun`]: no maths at all, for planning and large simulations.

pub mod cpu;
pub mod cuda;
pub mod dry_run;

use crate::error::RuntimeError;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use cupool_kernels::args::{GemmArgs, KvStore, NormArgs};
use cupool_kernels::cpu::FaParams;
use cupool_profiles::Weights;

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

/// A device range: an address and a length in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevSlice {
    /// The address (0 with length 0: nothing).
    pub ptr: u64,
    /// Elements.
    pub len: usize,
}

/// The buffers of one flash-attention call.
#[derive(Clone, Copy, Debug)]
pub struct FaBuffers {
    /// Q, f32, `n_tokens * n_head * d_k`.
    pub q: u64,
    /// K, f16 rows of `k_row` halves.
    pub k: u64,
    /// V, f16 rows of `v_row` halves (K's address when V is a view of K).
    pub v: u64,
    /// The output, f32, `n_tokens * n_head * d_v`.
    pub dst: u64,
    /// `dst_tmp` (split-KV partials), f32.
    pub tmp: DevSlice,
    /// `dst_tmp_meta`, (max, sum) pairs.
    pub meta: DevSlice,
}

/// The kernels a transformer layer is made of, on device addresses. Every call is ordered
/// after the previous one (one stream); [`Executor::sync`] waits for all of them.
pub trait Executor: Send {
    /// Which executor.
    fn kind(&self) -> ExecutorKind;
    /// Waits until every queued kernel has finished.
    fn sync(&mut self) -> Result<(), RuntimeError>;
    /// Sets `bytes` at `at` to zero.
    fn zero(&mut self, at: u64, bytes: usize) -> Result<(), RuntimeError>;
    /// Sets `n` halves at `at` to one (norm weights).
    fn fill_ones_f16(&mut self, at: u64, n: usize) -> Result<(), RuntimeError>;
    /// Fills `n` weights of type `wt` at `at` (halves, or `n / 32` q8_0 blocks) with
    /// reproducible values of magnitude about `scale` (q8_0: the same values, quantized).
    fn init_weights(
        &mut self,
        at: u64,
        n: usize,
        seed: u32,
        scale: f32,
        wt: Weights,
    ) -> Result<(), RuntimeError>;
    /// Copies `tokens` from the host to `at`.
    fn upload_tokens(&mut self, at: u64, tokens: &[i32]) -> Result<(), RuntimeError>;
    /// Token embeddings: `n_tokens` ids at `tokens` into `x` (f32 rows of `n_embd`).
    fn embed(
        &mut self,
        tokens: u64,
        x: u64,
        n_tokens: usize,
        n_embd: usize,
    ) -> Result<(), RuntimeError>;
    /// RMS norm of `a.rows` rows of `a.n` floats at `a.x`, weighted by `a.n` halves at `a.w`,
    /// into `a.y`.
    fn rms_norm(&mut self, a: &NormArgs) -> Result<(), RuntimeError>;
    /// Makes the `rows×k` f32 matrix at `x` the input of the GEMMs that follow: an executor
    /// whose GEMM takes f16 inputs converts it into `x_f16` once, for every [`Executor::matmul`]
    /// on `x` until `x` changes.
    fn gemm_input(
        &mut self,
        _x: u64,
        _x_f16: u64,
        _rows: usize,
        _k: usize,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// `y (+)= x · w`: `g.x` is `m×k` f32, `g.w` is `k×n` f16, `g.y` is `m×n` f32. `x_f16`
    /// holds `g.x` as the last [`Executor::gemm_input`] on it left it.
    fn matmul(&mut self, g: &GemmArgs, x_f16: u64) -> Result<(), RuntimeError>;
    /// The GEMM workspace for the ubatch that starts (`bytes` 0: none, as when it ends). The
    /// engine takes it from the pool; only an executor whose GEMMs use one (cuBLAS) keeps it.
    fn set_gemm_workspace(&mut self, _at: u64, _bytes: usize) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// SwiGLU in place over `n` floats: `up = silu(gate) · up`.
    fn swiglu(&mut self, up: u64, gate: u64, n: usize) -> Result<(), RuntimeError>;
    /// Writes `s.rows` f32 rows of `s.row_len` at `s.src` into the `s.kv`-typed cache at
    /// `s.cache`, starting at row `s.pos0`.
    fn store_kv(&mut self, s: &KvStore) -> Result<(), RuntimeError>;
    /// Converts `rows` q8_0 rows of `row_len` values at `src` to halves at `dst`.
    fn dequantize_q8_0(
        &mut self,
        src: u64,
        dst: u64,
        rows: usize,
        row_len: usize,
    ) -> Result<(), RuntimeError>;
    /// Flash attention (and the split combine).
    fn flash_attn(&mut self, p: &FaParams, b: &FaBuffers) -> Result<(), RuntimeError>;
    /// Copies `n` floats at `at` to the host, after the queued work.
    fn read_f32(&mut self, at: u64, n: usize) -> Result<Vec<f32>, RuntimeError>;
}
