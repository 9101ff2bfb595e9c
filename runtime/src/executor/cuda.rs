//! The kernels on a CUDA device.

use super::cpu::fa_params;
use super::{DeviceBuffers, Executor, ExecutorKind, Scratch, Ubatch};
use crate::error::RuntimeError;
use crate::model::ModelShape;
use cudarc::driver::{result, CudaContext};
use cupool_kernels::cuda::Kernels;
use cupool_kernels::KvType;
use half::f16;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct CudaExecutor {
    m: ModelShape,
    kv: KvType,
    ctx: Arc<CudaContext>,
    k: Kernels,
    bufs: Option<DeviceBuffers>,
}

fn dev(e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError::Device(format!("CUDA: {e:?}"))
}

impl CudaExecutor {
    /// Compiles and loads the kernels on `ctx`; launches go to its default stream, the stream
    /// whose pool the runtime uses.
    pub fn new(m: ModelShape, kv: KvType, ctx: Arc<CudaContext>) -> Result<Self, RuntimeError> {
        let k = Kernels::load(&ctx, ctx.default_stream())?;
        Ok(Self {
            m,
            kv,
            ctx,
            k,
            bufs: None,
        })
    }

    fn bufs(&self) -> Result<DeviceBuffers, RuntimeError> {
        self.bufs
            .ok_or_else(|| RuntimeError::Invalid("executor used before init".into()))
    }

    fn store(
        &self,
        src: u64,
        cache: u64,
        n_rows: usize,
        row_len: usize,
        pos0: usize,
    ) -> Result<(), RuntimeError> {
        match self.kv {
            KvType::F16 => self.k.store_f16(src, cache, n_rows, row_len, pos0)?,
            KvType::Q8_0 => self.k.quantize_q8_0(src, cache, n_rows, row_len, pos0)?,
        }
        Ok(())
    }
}

impl Executor for CudaExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Cuda
    }

    fn init(&mut self, b: &DeviceBuffers) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(dev)?;
        let (m, w) = (&self.m, b.weights);
        let ones = vec![f16::ONE; m.n_embd];
        for off in [b.wl.norm1, b.wl.norm2] {
            // SAFETY: the norm regions hold n_embd halves; synchronous copy from a live vector.
            unsafe { result::memcpy_htod_sync(w + off as u64, &ones) }.map_err(dev)?;
        }
        let e = m.n_embd;
        let init = |off: usize, n: usize, seed: u32, fan_in: usize| {
            self.k
                .init_weights(w + off as u64, n, seed, 1.0 / (fan_in as f32).sqrt())
        };
        init(b.wl.wq, e * m.q_dim(), 11, e)?;
        init(b.wl.wk, e * m.kv_dim_k(), 12, e)?;
        if !m.v_is_k {
            init(b.wl.wv, e * m.kv_dim_v(), 13, e)?;
        }
        init(b.wl.wo, m.out_dim() * e, 14, m.out_dim())?;
        init(b.wl.w1, e * m.n_ff, 15, e)?;
        init(b.wl.w2, m.n_ff * e, 16, m.n_ff)?;
        // A clean cache: padded positions past the prompt are read (and masked), never garbage.
        // SAFETY: the KV cache is exactly `bytes` long.
        unsafe { result::memset_d8_sync(b.kv, 0, b.kvl.bytes) }.map_err(dev)?;
        self.bufs = Some(*b);
        Ok(())
    }

    fn begin_ubatch(&mut self, ub: &Ubatch) -> Result<(), RuntimeError> {
        let b = self.bufs()?;
        self.ctx.bind_to_thread().map_err(dev)?;
        let tokens = b.compute + b.cl.tokens as u64;
        // The previous ubatch's kernels may still read the token region: order the copy after them.
        self.k.stream().synchronize().map_err(dev)?;
        // SAFETY: the token region holds n_ubatch ints; synchronous copy from a live slice.
        unsafe { result::memcpy_htod_sync(tokens, ub.tokens) }.map_err(dev)?;
        self.k.embed(
            tokens,
            b.compute + b.cl.x as u64,
            ub.n_tokens,
            self.m.n_embd,
        )?;
        Ok(())
    }

    fn pre_attention(&mut self, layer: usize, ub: &Ubatch) -> Result<(), RuntimeError> {
        let (b, m, u) = (self.bufs()?, &self.m, ub.n_tokens);
        let c = |off: usize| b.compute + off as u64;
        let w = |off: usize| b.weights + off as u64;
        self.k
            .rms_norm(c(b.cl.x), w(b.wl.norm1), c(b.cl.xn), u, m.n_embd, 1e-6)?;
        self.k.matmul(
            c(b.cl.xn),
            w(b.wl.wq),
            c(b.cl.q),
            u,
            m.q_dim(),
            m.n_embd,
            false,
        )?;
        self.k.matmul(
            c(b.cl.xn),
            w(b.wl.wk),
            c(b.cl.k_new),
            u,
            m.kv_dim_k(),
            m.n_embd,
            false,
        )?;
        self.store(
            c(b.cl.k_new),
            b.kv + b.kvl.k(layer) as u64,
            u,
            m.kv_dim_k(),
            ub.pos0,
        )?;
        if !m.v_is_k {
            self.k.matmul(
                c(b.cl.xn),
                w(b.wl.wv),
                c(b.cl.v_new),
                u,
                m.kv_dim_v(),
                m.n_embd,
                false,
            )?;
            self.store(
                c(b.cl.v_new),
                b.kv + b.kvl.v(layer) as u64,
                u,
                m.kv_dim_v(),
                ub.pos0,
            )?;
        }
        Ok(())
    }

    fn attention(&mut self, layer: usize, ub: &Ubatch, s: &Scratch) -> Result<(), RuntimeError> {
        let (b, m) = (self.bufs()?, &self.m);
        let p = fa_params(m, ub, s.fa.parallel_blocks);
        let kv_k = b.kv + b.kvl.k(layer) as u64;
        let kv_v = b.kv + b.kvl.v(layer) as u64;
        let (k, v) = match self.kv {
            // The layout puts V at K when V is a view of K.
            KvType::F16 => (kv_k, kv_v),
            KvType::Q8_0 => {
                let k = Scratch::ptr(&s.k_f16);
                self.k.dequantize_q8_0(kv_k, k, ub.n_kv, m.kv_dim_k())?;
                let v = if m.v_is_k {
                    k
                } else {
                    let v = Scratch::ptr(&s.v_f16);
                    self.k.dequantize_q8_0(kv_v, v, ub.n_kv, m.kv_dim_v())?;
                    v
                };
                (k, v)
            }
        };
        let c = |off: usize| b.compute + off as u64;
        self.k.flash_attn(
            &p,
            c(b.cl.q),
            k,
            v,
            c(b.cl.attn),
            Scratch::ptr(&s.dst_tmp),
            Scratch::ptr(&s.dst_meta),
        )?;
        Ok(())
    }

    fn post_attention(&mut self, _layer: usize, ub: &Ubatch) -> Result<(), RuntimeError> {
        let (b, m, u) = (self.bufs()?, &self.m, ub.n_tokens);
        let c = |off: usize| b.compute + off as u64;
        let w = |off: usize| b.weights + off as u64;
        self.k.matmul(
            c(b.cl.attn),
            w(b.wl.wo),
            c(b.cl.x),
            u,
            m.n_embd,
            m.out_dim(),
            true,
        )?;
        self.k
            .rms_norm(c(b.cl.x), w(b.wl.norm2), c(b.cl.xn), u, m.n_embd, 1e-6)?;
        self.k.matmul(
            c(b.cl.xn),
            w(b.wl.w1),
            c(b.cl.ff),
            u,
            m.n_ff,
            m.n_embd,
            false,
        )?;
        self.k.silu(c(b.cl.ff), u * m.n_ff)?;
        self.k
            .matmul(c(b.cl.ff), w(b.wl.w2), c(b.cl.x), u, m.n_embd, m.n_ff, true)?;
        Ok(())
    }

    fn end_ubatch(&mut self, _: &Ubatch) -> Result<(), RuntimeError> {
        self.k.stream().synchronize().map_err(dev)
    }

    fn hidden(&self, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        let b = self.bufs()?;
        self.ctx.bind_to_thread().map_err(dev)?;
        self.k.stream().synchronize().map_err(dev)?;
        let mut out = vec![0f32; n_tokens * self.m.n_embd];
        // SAFETY: the hidden-state region holds at least this many floats; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut out, b.compute + b.cl.x as u64) }.map_err(dev)?;
        Ok(out)
    }
}
