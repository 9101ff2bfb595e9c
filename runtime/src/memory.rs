//! What the runtime allocates once at startup, outside the pool, as ggml does: the weights, the
//! KV cache for the whole context, and the compute buffer for the worst-case ubatch.

use crate::model::ModelShape;
use cupool_kernels::KvType;
use cupool_profiles::Weights;

const ALIGN: usize = 256;

/// Byte offsets of the per-ubatch activations inside the compute buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComputeLayout {
    /// Token ids (i32).
    pub tokens: usize,
    /// Hidden state x [u][n_embd] f32.
    pub x: usize,
    /// Normalised x [u][n_embd] f32.
    pub xn: usize,
    /// Q [u][n_head][D_K] f32.
    pub q: usize,
    /// New K rows [u][n_head_kv*D_K] f32.
    pub k_new: usize,
    /// New V rows [u][n_head_kv*D_V] f32.
    pub v_new: usize,
    /// Attention output [u][n_head][D_V] f32.
    pub attn: usize,
    /// FFN activations (up, then SwiGLU's product) [u][n_ff] f32.
    pub ff: usize,
    /// FFN gate activations [u][n_ff] f32.
    pub gate: usize,
    /// A GEMM's input converted to f16 for cuBLAS [u][widest input] (ggml's `src1` in f16).
    pub x_f16: usize,
    /// Total bytes.
    pub bytes: usize,
}

impl ComputeLayout {
    /// The layout for ubatches of up to `n_ubatch` tokens.
    pub fn new(m: &ModelShape, n_ubatch: usize) -> Self {
        let mut at = 0usize;
        let mut region = |floats: usize| {
            let off = at;
            at += (floats * 4).next_multiple_of(ALIGN);
            off
        };
        let u = n_ubatch;
        let tokens = region(u);
        let x = region(u * m.n_embd);
        let xn = region(u * m.n_embd);
        let q = region(u * m.q_dim());
        let k_new = region(u * m.kv_dim_k());
        let v_new = region(u * m.kv_dim_v());
        let attn = region(u * m.out_dim());
        let ff = region(u * m.n_ff);
        let gate = region(u * m.n_ff);
        // Halves: the floats of half the count.
        let x_f16 = region((u * m.n_embd.max(m.out_dim()).max(m.n_ff)).div_ceil(2));
        Self {
            tokens,
            x,
            xn,
            q,
            k_new,
            v_new,
            attn,
            ff,
            gate,
            x_f16,
            bytes: at,
        }
    }
}

/// Byte offsets of one layer's weights inside the weights buffer: norms in f16, matrices in the
/// run's weight type (rows of `n` outputs; q8_0 blocks run along a row). One set serves every
/// layer: the maths is real, the weights are random, and only their size has to be resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightLayout {
    /// Attention RMSNorm [n_embd].
    pub norm1: usize,
    /// Q projection [n_embd][q_dim].
    pub wq: usize,
    /// K projection [n_embd][kv_dim_k].
    pub wk: usize,
    /// V projection [n_embd][kv_dim_v].
    pub wv: usize,
    /// Output projection [out_dim][n_embd].
    pub wo: usize,
    /// FFN RMSNorm [n_embd].
    pub norm2: usize,
    /// FFN up [n_embd][n_ff].
    pub w1: usize,
    /// FFN down [n_ff][n_embd].
    pub w2: usize,
    /// FFN gate [n_embd][n_ff] (SwiGLU: down(silu(x·gate) · x·up)).
    pub w3: usize,
    /// The matrices' type.
    pub weight_type: Weights,
    /// Total bytes.
    pub bytes: usize,
}

impl WeightLayout {
    /// The layout of one layer's weights.
    pub fn new(m: &ModelShape, wt: Weights) -> Self {
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let off = at;
            at += bytes.next_multiple_of(ALIGN);
            off
        };
        let e = m.n_embd;
        // A k×n matrix: k rows of n.
        let matrix = |k: usize, n: usize| k * wt.row_bytes(n);
        let norm1 = region(e * 2);
        let wq = region(matrix(e, m.q_dim()));
        let wk = region(matrix(e, m.kv_dim_k()));
        let wv = region(if m.v_is_k { 0 } else { matrix(e, m.kv_dim_v()) });
        let wo = region(matrix(m.out_dim(), e));
        let norm2 = region(e * 2);
        let w1 = region(matrix(e, m.n_ff));
        let w2 = region(matrix(m.n_ff, e));
        let w3 = region(matrix(e, m.n_ff));
        Self {
            norm1,
            wq,
            wk,
            wv,
            wo,
            norm2,
            w1,
            w2,
            w3,
            weight_type: wt,
            bytes: at,
        }
    }
}

/// Where layer `l`'s K and V rows live in the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Bytes of one K row (one position, all KV heads).
    pub k_row_bytes: usize,
    /// Bytes of one V row (0 when V is a view of K).
    pub v_row_bytes: usize,
    /// Positions.
    pub n_ctx: usize,
    /// Bytes per layer.
    pub layer_bytes: usize,
    /// Total bytes.
    pub bytes: usize,
}

impl KvLayout {
    /// The cache for `n_ctx` positions.
    pub fn new(m: &ModelShape, kv: KvType, n_ctx: usize) -> Self {
        let k_row_bytes = kv.row_bytes(m.kv_dim_k());
        let v_row_bytes = if m.v_is_k {
            0
        } else {
            kv.row_bytes(m.kv_dim_v())
        };
        let layer_bytes = ((k_row_bytes + v_row_bytes) * n_ctx).next_multiple_of(ALIGN);
        Self {
            k_row_bytes,
            v_row_bytes,
            n_ctx,
            layer_bytes,
            bytes: layer_bytes * m.n_layer,
        }
    }

    /// Offset of layer `l`'s K cache.
    pub fn k(&self, l: usize) -> usize {
        l * self.layer_bytes
    }

    /// Offset of layer `l`'s V cache (its K cache when V is a view of K).
    pub fn v(&self, l: usize) -> usize {
        if self.v_row_bytes == 0 {
            self.k(l)
        } else {
            l * self.layer_bytes + self.k_row_bytes * self.n_ctx
        }
    }
}
