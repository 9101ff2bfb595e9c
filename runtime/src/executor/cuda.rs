//! The kernels on a CUDA device, launched on the context's default stream: the stream whose
//! pool the runtime takes scratch from. GEMMs go through cuBLAS (input converted to f16 in the
//! compute buffer, f32 output, the workspace the engine took from the pool); without libcublas
//! they run on the runtime's own CUDA-core kernel, with a warning.

use super::{Executor, ExecutorKind, FaBuffers};
use crate::error::RuntimeError;
use cudarc::driver::{result, CudaContext};
use cupool_kernels::args::{GemmArgs, KvStore, NormArgs};
use cupool_kernels::blas::Gemm;
use cupool_kernels::cpu::FaParams;
use cupool_kernels::cuda::{FaPtrs, KernelError, Kernels};
use cupool_profiles::Weights;
use half::f16;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct CudaExecutor {
    ctx: Arc<CudaContext>,
    k: Kernels,
    gemm: Option<Gemm>,
}

fn dev(e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError::Kernel(KernelError::Driver(e))
}

impl CudaExecutor {
    /// Compiles and loads the kernels on `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self, RuntimeError> {
        let k = Kernels::load(&ctx, ctx.default_stream())?;
        let gemm =
            Gemm::new(ctx.default_stream()).map_err(|e| RuntimeError::Invalid(e.to_string()))?;
        if gemm.is_none() {
            tracing::warn!("libcublas not found on the loader path: GEMMs run on the runtime's CUDA-core kernel (slow)");
        }
        Ok(Self { ctx, k, gemm })
    }

    /// Whether GEMMs go through cuBLAS.
    pub fn uses_cublas(&self) -> bool {
        self.gemm.is_some()
    }
}

impl Executor for CudaExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cuda
    }

    fn sync(&mut self) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(dev)?;
        self.k.stream().synchronize().map_err(dev)
    }

    fn zero(&mut self, at: u64, bytes: usize) -> Result<(), RuntimeError> {
        self.sync()?;
        // SAFETY: the caller names a live device range of `bytes`; the stream is idle.
        unsafe { result::memset_d8_sync(at, 0, bytes) }.map_err(dev)
    }

    fn fill_ones_f16(&mut self, at: u64, n: usize) -> Result<(), RuntimeError> {
        self.sync()?;
        let ones = vec![f16::ONE; n];
        // SAFETY: a live device range of `n` halves; synchronous copy from a live vector.
        unsafe { result::memcpy_htod_sync(at, &ones) }.map_err(dev)
    }

    fn init_weights(
        &mut self,
        at: u64,
        n: usize,
        seed: u32,
        scale: f32,
        wt: Weights,
    ) -> Result<(), RuntimeError> {
        match wt {
            Weights::F16 => self.k.init_weights(at, n, seed, scale)?,
            Weights::Q8_0 => self.k.init_weights_q8_0(at, n, seed, scale)?,
        }
        Ok(())
    }

    fn upload_tokens(&mut self, at: u64, tokens: &[i32]) -> Result<(), RuntimeError> {
        // Kernels queued earlier may still read the region: copy after them.
        self.sync()?;
        // SAFETY: a live device range of `tokens.len()` ints; synchronous copy.
        unsafe { result::memcpy_htod_sync(at, tokens) }.map_err(dev)
    }

    fn embed(
        &mut self,
        tokens: u64,
        x: u64,
        n_tokens: usize,
        n_embd: usize,
    ) -> Result<(), RuntimeError> {
        Ok(self.k.embed(tokens, x, n_tokens, n_embd)?)
    }

    fn rms_norm(&mut self, a: &NormArgs) -> Result<(), RuntimeError> {
        Ok(self.k.rms_norm(a)?)
    }

    fn matmul(&mut self, g: &GemmArgs, x_f16: u64) -> Result<(), RuntimeError> {
        let Some(blas) = &self.gemm else {
            return Ok(self.k.matmul(g)?);
        };
        blas.f16_f32(&GemmArgs { x: x_f16, ..*g })
            .map_err(|e| RuntimeError::Invalid(e.to_string()))
    }

    fn gemm_input(
        &mut self,
        x: u64,
        x_f16: u64,
        rows: usize,
        k: usize,
    ) -> Result<(), RuntimeError> {
        if self.gemm.is_some() {
            self.k.store_f16(x, x_f16, rows, k, 0)?;
        }
        Ok(())
    }

    fn set_gemm_workspace(&mut self, at: u64, bytes: usize) -> Result<(), RuntimeError> {
        match &mut self.gemm {
            Some(g) => g
                .set_workspace(at, bytes)
                .map_err(|e| RuntimeError::Invalid(e.to_string())),
            None => Ok(()),
        }
    }

    fn swiglu(&mut self, up: u64, gate: u64, n: usize) -> Result<(), RuntimeError> {
        Ok(self.k.swiglu(up, gate, n)?)
    }

    fn store_kv(&mut self, s: &KvStore) -> Result<(), RuntimeError> {
        Ok(self.k.store_kv(s)?)
    }

    fn dequantize_q8_0(
        &mut self,
        src: u64,
        dst: u64,
        rows: usize,
        row_len: usize,
    ) -> Result<(), RuntimeError> {
        Ok(self.k.dequantize_q8_0(src, dst, rows, row_len)?)
    }

    fn flash_attn(&mut self, p: &FaParams, b: &FaBuffers) -> Result<(), RuntimeError> {
        Ok(self.k.flash_attn(
            p,
            &FaPtrs {
                q: b.q,
                k: b.k,
                v: b.v,
                dst: b.dst,
                dst_tmp: b.tmp.ptr,
                dst_meta: b.meta.ptr,
            },
        )?)
    }

    fn read_f32(&mut self, at: u64, n: usize) -> Result<Vec<f32>, RuntimeError> {
        self.sync()?;
        let mut out = vec![0f32; n];
        // SAFETY: a live device range of at least `n` floats; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut out, at) }.map_err(dev)?;
        Ok(out)
    }
}
