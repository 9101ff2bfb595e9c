//! The model, written once over the executor's kernels: weight initialisation, the embedding,
//! and each layer's attention block (norm, Q/K/V, cache write, flash attention over the pool's
//! scratch) and feed-forward block (output projection, norm, SwiGLU MLP, residuals).

use crate::error::RuntimeError;
use crate::executor::{DeviceBuffers, Executor, FaBuffers};
use crate::model::ModelShape;
use crate::scratch::Scratch;
use cupool_kernels::args::{GemmArgs, KvStore, NormArgs};
use cupool_kernels::cpu::FaParams;
use cupool_kernels::fa::KvHalf;
use cupool_kernels::KvType;
use cupool_pool::adaptors::label;
use cupool_pool::{Pool, PoolBuffer};
use cupool_profiles::Weights;
use std::sync::Arc;

const EPS: f32 = 1e-6;

/// One ubatch as the layers see it.
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

/// A model's shape and cache type over its startup buffers.
pub(crate) struct Model<'a> {
    pub m: &'a ModelShape,
    pub kv: KvType,
    pub b: &'a DeviceBuffers,
    /// Where a GEMM over q8_0 weights takes its f16 copy of them.
    pub pool: &'a Arc<dyn Pool>,
}

impl Model<'_> {
    fn c(&self, off: usize) -> u64 {
        self.b.compute + off as u64
    }

    fn w(&self, off: usize) -> u64 {
        self.b.weights + off as u64
    }

    /// Makes the `rows×k` activations at `input` the input of the GEMMs that follow: converted
    /// to f16 once for all of them (Q, K and V share one; so do the FFN's gate and up). Returns
    /// those GEMMs' arguments with the input side filled in; each sets its weights `w`, output
    /// `y`, width `n` and, adding to `y`, `accumulate`.
    fn gemm_input(
        &self,
        x: &mut dyn Executor,
        input: u64,
        rows: usize,
        k: usize,
    ) -> Result<GemmArgs, RuntimeError> {
        x.gemm_input(input, self.c(self.b.cl.x_f16), rows, k)?;
        Ok(GemmArgs {
            x: input,
            w: 0,
            y: 0,
            m: rows,
            n: 0,
            k,
            accumulate: false,
        })
    }

    /// `g.y (+)= g.x · W` for the `k×n` weight matrix `W` at `g.w` (an address in the weights
    /// buffer), `g.x` made the GEMM input by [`Model::gemm_input`] since it last changed: f16
    /// weights directly; q8_0 weights converted to f16 first, into `src0_f16` taken from the
    /// pool for the GEMM (ggml's cuBLAS path for a quantized `src0`).
    fn mm(&self, x: &mut dyn Executor, g: GemmArgs) -> Result<(), RuntimeError> {
        let x_f16 = self.c(self.b.cl.x_f16);
        match self.b.wl.weight_type {
            Weights::F16 => x.matmul(&g, x_f16),
            Weights::Q8_0 => {
                let (k, n) = (g.k, g.n);
                let w16 =
                    label::with("src0_f16", || PoolBuffer::<KvHalf>::alloc(self.pool, k * n))?;
                x.dequantize_q8_0(g.w, w16.ptr(), k, n)?;
                // Returned to the pool after the GEMM is queued: the pool is stream-ordered.
                x.matmul(&GemmArgs { w: w16.ptr(), ..g }, x_f16)
            }
        }
    }

    /// RMS norm of the hidden state's `rows` rows with the weights at offset `w` into `xn`.
    fn norm(&self, w: usize, rows: usize) -> NormArgs {
        let cl = &self.b.cl;
        NormArgs {
            x: self.c(cl.x),
            w: self.w(w),
            y: self.c(cl.xn),
            rows,
            n: self.m.n_embd,
            eps: EPS,
        }
    }

    /// Fills the weights reproducibly and clears the KV cache (padded positions past the
    /// prompt are read, and masked, so they must not be garbage).
    pub fn init(&self, x: &mut dyn Executor) -> Result<(), RuntimeError> {
        let (m, wl, e) = (self.m, &self.b.wl, self.m.n_embd);
        x.fill_ones_f16(self.w(wl.norm1), e)?;
        x.fill_ones_f16(self.w(wl.norm2), e)?;
        let mut init = |off: usize, n: usize, seed: u32, fan_in: usize| {
            x.init_weights(
                self.w(off),
                n,
                seed,
                1.0 / (fan_in as f32).sqrt(),
                wl.weight_type,
            )
        };
        init(wl.wq, e * m.q_dim(), 11, e)?;
        init(wl.wk, e * m.kv_dim_k(), 12, e)?;
        if !m.v_is_k {
            init(wl.wv, e * m.kv_dim_v(), 13, e)?;
        }
        init(wl.wo, m.out_dim() * e, 14, m.out_dim())?;
        init(wl.w1, e * m.n_ff, 15, e)?;
        init(wl.w3, e * m.n_ff, 17, e)?;
        init(wl.w2, m.n_ff * e, 16, m.n_ff)?;
        x.zero(self.b.kv, self.b.kvl.bytes)
    }

    /// The ubatch's tokens into the hidden state.
    pub fn embed(&self, x: &mut dyn Executor, ub: &Ubatch) -> Result<(), RuntimeError> {
        let tokens = self.c(self.b.cl.tokens);
        x.upload_tokens(tokens, ub.tokens)?;
        x.embed(tokens, self.c(self.b.cl.x), ub.n_tokens, self.m.n_embd)
    }

    /// Norm, Q/K/V projections, the new K/V rows into the cache.
    pub fn pre_attention(
        &self,
        x: &mut dyn Executor,
        layer: usize,
        ub: &Ubatch,
    ) -> Result<(), RuntimeError> {
        let (m, cl, wl, u) = (self.m, &self.b.cl, &self.b.wl, ub.n_tokens);
        x.rms_norm(&self.norm(wl.norm1, u))?;
        let xn = self.gemm_input(x, self.c(cl.xn), u, m.n_embd)?;
        let q = GemmArgs {
            w: self.w(wl.wq),
            y: self.c(cl.q),
            n: m.q_dim(),
            ..xn
        };
        self.mm(x, q)?;
        let mut project = |w: usize, out: usize, dim: usize, cache: usize| {
            let g = GemmArgs {
                w: self.w(w),
                y: self.c(out),
                n: dim,
                ..xn
            };
            self.mm(x, g)?;
            x.store_kv(&KvStore {
                kv: self.kv,
                src: self.c(out),
                cache: self.b.kv + cache as u64,
                rows: u,
                row_len: dim,
                pos0: ub.pos0,
            })
        };
        project(wl.wk, cl.k_new, m.kv_dim_k(), self.b.kvl.k(layer))?;
        if !m.v_is_k {
            project(wl.wv, cl.v_new, m.kv_dim_v(), self.b.kvl.v(layer))?;
        }
        Ok(())
    }

    /// K/V conversion into the scratch (quantized caches), flash attention, split combine.
    pub fn attention(
        &self,
        x: &mut dyn Executor,
        layer: usize,
        ub: &Ubatch,
        s: &Scratch,
    ) -> Result<(), RuntimeError> {
        let m = self.m;
        let cache_k = self.b.kv + self.b.kvl.k(layer) as u64;
        // The layout puts V at K when V is a view of K.
        let cache_v = self.b.kv + self.b.kvl.v(layer) as u64;
        let (k, v) = match self.kv {
            KvType::F16 => (cache_k, cache_v),
            KvType::Q8_0 => {
                let k = Scratch::slice(&s.k_f16).ptr;
                x.dequantize_q8_0(cache_k, k, ub.n_kv, m.kv_dim_k())?;
                let v = if m.v_is_k {
                    k
                } else {
                    let v = Scratch::slice(&s.v_f16).ptr;
                    x.dequantize_q8_0(cache_v, v, ub.n_kv, m.kv_dim_v())?;
                    v
                };
                (k, v)
            }
        };
        let bufs = FaBuffers {
            q: self.c(self.b.cl.q),
            k,
            v,
            dst: self.c(self.b.cl.attn),
            tmp: Scratch::slice(&s.dst_tmp),
            meta: Scratch::slice(&s.dst_meta),
        };
        x.flash_attn(&fa_params(m, ub, s.fa.parallel_blocks), &bufs)
    }

    /// Output projection and residual, norm, SwiGLU MLP and residual.
    pub fn feed_forward(&self, x: &mut dyn Executor, ub: &Ubatch) -> Result<(), RuntimeError> {
        let (m, cl, wl, u) = (self.m, &self.b.cl, &self.b.wl, ub.n_tokens);
        let attn = self.gemm_input(x, self.c(cl.attn), u, m.out_dim())?;
        let out = GemmArgs {
            w: self.w(wl.wo),
            y: self.c(cl.x),
            n: m.n_embd,
            accumulate: true,
            ..attn
        };
        self.mm(x, out)?;
        x.rms_norm(&self.norm(wl.norm2, u))?;
        let xn = self.gemm_input(x, self.c(cl.xn), u, m.n_embd)?;
        let up = GemmArgs {
            w: self.w(wl.w1),
            y: self.c(cl.ff),
            n: m.n_ff,
            ..xn
        };
        self.mm(x, up)?;
        let gate = GemmArgs {
            w: self.w(wl.w3),
            y: self.c(cl.gate),
            ..up
        };
        self.mm(x, gate)?;
        x.swiglu(self.c(cl.ff), self.c(cl.gate), u * m.n_ff)?;
        let ff = self.gemm_input(x, self.c(cl.ff), u, m.n_ff)?;
        let down = GemmArgs {
            w: self.w(wl.w2),
            y: self.c(cl.x),
            n: m.n_embd,
            accumulate: true,
            ..ff
        };
        self.mm(x, down)
    }

    /// The hidden state of the last ubatch.
    pub fn hidden(&self, x: &mut dyn Executor, n_tokens: usize) -> Result<Vec<f32>, RuntimeError> {
        x.read_f32(self.c(self.b.cl.x), n_tokens * self.m.n_embd)
    }
}

/// The `src0_f16` bytes each GEMM of a layer takes from the pool, in the order the layer runs
/// them (none for f16 weights).
pub(crate) fn src0_requests(m: &ModelShape, wt: Weights) -> Vec<usize> {
    if wt == Weights::F16 {
        return Vec::new();
    }
    let e = m.n_embd;
    let mut kn = vec![e * m.q_dim(), e * m.kv_dim_k()];
    if !m.v_is_k {
        kn.push(e * m.kv_dim_v());
    }
    kn.extend([m.out_dim() * e, e * m.n_ff, e * m.n_ff, m.n_ff * e]);
    kn.into_iter()
        .map(|n| n * std::mem::size_of::<KvHalf>())
        .collect()
}

/// The kernel parameters of one flash-attention call.
fn fa_params(m: &ModelShape, ub: &Ubatch, parallel_blocks: usize) -> FaParams {
    let (k_row, k_head) = (m.kv_dim_k(), m.head_dim_k);
    let (v_row, v_head) = if m.v_is_k {
        (m.kv_dim_k(), m.head_dim_k)
    } else {
        (m.kv_dim_v(), m.head_dim_v)
    };
    FaParams {
        n_tokens: ub.n_tokens,
        n_head: m.n_head,
        n_head_kv: m.n_head_kv,
        d_k: m.head_dim_k,
        d_v: m.head_dim_v,
        n_kv: ub.n_kv,
        pos0: ub.pos0,
        k_row,
        k_head,
        v_row,
        v_head,
        scale: 1.0 / (m.head_dim_k as f32).sqrt(),
        parallel_blocks,
    }
}
