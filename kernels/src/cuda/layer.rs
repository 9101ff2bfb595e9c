//! Launches of the layer kernels (`layer.cu`): embedding, RMS norm, the CUDA-core GEMM,
//! SwiGLU and the reproducible weight initialisation.

use super::{grid, KernelError, Kernels};
use crate::args::{GemmArgs, NormArgs};
use cudarc::driver::{LaunchConfig, PushKernelArg};

impl Kernels {
    /// Token embeddings into `x`.
    pub fn embed(
        &self,
        tokens: u64,
        x: u64,
        n_tokens: usize,
        n_embd: usize,
    ) -> Result<(), KernelError> {
        let (n, e) = (n_tokens as i32, n_embd as i32);
        let mut b = self.stream.launch_builder(&self.embed);
        b.arg(&tokens).arg(&x).arg(&n).arg(&e);
        // SAFETY: tokens holds n_tokens ints, x n_tokens*n_embd floats.
        unsafe { b.launch(grid(n_tokens * n_embd, 256)) }?;
        Ok(())
    }

    /// RMSNorm of `a.rows` rows of `a.n`.
    pub fn rms_norm(&self, a: &NormArgs) -> Result<(), KernelError> {
        let NormArgs {
            x,
            w,
            y,
            rows,
            n,
            eps,
        } = *a;
        let nn = n as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.rms_norm);
        b.arg(&x).arg(&w).arg(&y).arg(&nn).arg(&eps);
        // SAFETY: x, y hold rows*n floats; w n halves.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// y (+)= x . w, with `x` f32.
    pub fn matmul(&self, g: &GemmArgs) -> Result<(), KernelError> {
        let GemmArgs {
            x,
            w,
            y,
            m,
            n,
            k,
            accumulate,
        } = *g;
        let (mm, nn, kk, acc) = (m as i32, n as i32, k as i32, accumulate as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.matmul);
        b.arg(&x)
            .arg(&w)
            .arg(&y)
            .arg(&mm)
            .arg(&nn)
            .arg(&kk)
            .arg(&acc);
        // SAFETY: x holds m*k floats, w k*n halves, y m*n floats.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// up = silu(gate) · up over `n` floats.
    pub fn swiglu(&self, up: u64, gate: u64, n: usize) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.swiglu);
        b.arg(&up).arg(&gate).arg(&nn);
        // SAFETY: up and gate hold n floats each.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }

    /// Deterministic weights into `n` halves.
    pub fn init_weights(&self, w: u64, n: usize, seed: u32, scale: f32) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.init_weights);
        b.arg(&w).arg(&nn).arg(&seed).arg(&scale);
        // SAFETY: w holds n halves.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }

    /// The same weights as q8_0 blocks: `n` values (a multiple of 32) into `n / 32` blocks.
    pub fn init_weights_q8_0(
        &self,
        w: u64,
        n: usize,
        seed: u32,
        scale: f32,
    ) -> Result<(), KernelError> {
        let nn = n as i64;
        let mut b = self.stream.launch_builder(&self.init_weights_q8_0);
        b.arg(&w).arg(&nn).arg(&seed).arg(&scale);
        // SAFETY: w holds n / 32 q8_0 blocks; one warp per block.
        unsafe { b.launch(grid(n, 256)) }?;
        Ok(())
    }
}
