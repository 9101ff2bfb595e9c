//! CPU references of every kernel, written for clarity. The CPU executor runs them on the
//! simulated device; tests compare the CUDA kernels against them.

use crate::fa::KEYS_PER_TILE;
use crate::{Q8_0_BLOCK_BYTES, QK8_0};
use half::f16;

/// Rows of f32 into q8_0 blocks (`src.len()` a multiple of 32), as ggml quantizes.
pub fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, blk) in src
        .chunks_exact(QK8_0)
        .zip(dst.chunks_exact_mut(Q8_0_BLOCK_BYTES))
    {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        blk[..2].copy_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        for (q, v) in blk[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// q8_0 blocks into f16 values.
pub fn dequantize_q8_0(src: &[u8], dst: &mut [f16]) {
    for (blk, out) in src
        .chunks_exact(Q8_0_BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(QK8_0))
    {
        let d = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        for (o, &q) in out.iter_mut().zip(&blk[2..]) {
            *o = f16::from_f32(q as i8 as f32 * d);
        }
    }
}

/// f32 into f16.
pub fn store_f16(src: &[f32], dst: &mut [f16]) {
    for (o, &v) in dst.iter_mut().zip(src) {
        *o = f16::from_f32(v);
    }
}

/// Flash-attention parameters, as the CUDA kernel takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaParams {
    /// Query tokens.
    pub n_tokens: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// K head dimension.
    pub d_k: usize,
    /// V head dimension.
    pub d_v: usize,
    /// KV length visible to the call.
    pub n_kv: usize,
    /// Position of the first query token.
    pub pos0: usize,
    /// K elements between positions.
    pub k_row: usize,
    /// K elements between KV heads.
    pub k_head: usize,
    /// V elements between positions.
    pub v_row: usize,
    /// V elements between KV heads.
    pub v_head: usize,
    /// Softmax scale (1/sqrt(D_K)).
    pub scale: f32,
    /// KV splits.
    pub parallel_blocks: usize,
}

/// Flash attention for one split (one query row, one head, one share of the KV tiles): partial outputs normalised by their own sum, and (max, sum).
/// Splits divide the key tiles of each 32-query block the way the CUDA kernel does.
#[allow(clippy::too_many_arguments)] // the kernel's own parameters, kept flat to mirror it
fn attend_split(
    p: &FaParams,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    t: usize,
    head: usize,
    split: usize,
    out: &mut [f32],
) -> (f32, f32) {
    let head_kv = head / (p.n_head / p.n_head_kv);
    let block_t0 = t / crate::fa::QUERIES_PER_BLOCK * crate::fa::QUERIES_PER_BLOCK;
    let block_last = (block_t0 + crate::fa::QUERIES_PER_BLOCK).min(p.n_tokens) - 1;
    let last_pos = (p.pos0 + block_last).min(p.n_kv - 1);
    let n_tiles = last_pos / KEYS_PER_TILE + 1;
    let per = n_tiles.div_ceil(p.parallel_blocks);
    let (kb, ke) = (
        (split * per).min(n_tiles) * KEYS_PER_TILE,
        ((split + 1) * per).min(n_tiles) * KEYS_PER_TILE,
    );
    let qrow = &q[(t * p.n_head + head) * p.d_k..][..p.d_k];
    let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
    out.iter_mut().for_each(|o| *o = 0.0);
    for pos in kb..ke.min(p.n_kv).min(p.pos0 + t + 1) {
        let krow = &k[pos * p.k_row + head_kv * p.k_head..][..p.d_k];
        let s: f32 = qrow
            .iter()
            .zip(krow)
            .map(|(a, b)| a * p.scale * b.to_f32())
            .sum();
        let m_new = m.max(s);
        let corr = (m - m_new).exp();
        let w = (s - m_new).exp();
        l = l * corr + w;
        let vrow = &v[pos * p.v_row + head_kv * p.v_head..][..p.d_v];
        for (o, vv) in out.iter_mut().zip(vrow) {
            *o = *o * corr + w * vv.to_f32();
        }
        m = m_new;
    }
    if l > 0.0 {
        out.iter_mut().for_each(|o| *o /= l);
    }
    (m, l)
}

/// Flash attention: `dst` [n_tokens][n_head][D_V]; with splits, partials go through `dst_tmp`
/// and `dst_meta` and are combined into `dst`, as on the GPU.
pub fn flash_attn(
    p: &FaParams,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    dst: &mut [f32],
    dst_tmp: &mut [f32],
    dst_meta: &mut [[f32; 2]],
) {
    let rows = p.n_tokens * p.n_head;
    for t in 0..p.n_tokens {
        for h in 0..p.n_head {
            let row = t * p.n_head + h;
            if p.parallel_blocks == 1 {
                attend_split(p, q, k, v, t, h, 0, &mut dst[row * p.d_v..][..p.d_v]);
            } else {
                for s in 0..p.parallel_blocks {
                    let r = s * rows + row;
                    let (m, l) =
                        attend_split(p, q, k, v, t, h, s, &mut dst_tmp[r * p.d_v..][..p.d_v]);
                    dst_meta[r] = [m, l];
                }
            }
        }
    }
    if p.parallel_blocks > 1 {
        combine(dst_tmp, dst_meta, dst, rows, p.d_v, p.parallel_blocks);
    }
}

/// Merges split partials into `dst`.
pub fn combine(
    dst_tmp: &[f32],
    dst_meta: &[[f32; 2]],
    dst: &mut [f32],
    n_rows: usize,
    d_v: usize,
    parallel_blocks: usize,
) {
    for row in 0..n_rows {
        let mx = (0..parallel_blocks)
            .map(|s| dst_meta[s * n_rows + row][0])
            .fold(f32::NEG_INFINITY, f32::max);
        for d in 0..d_v {
            let (mut num, mut den) = (0.0f32, 0.0f32);
            for s in 0..parallel_blocks {
                let [m, l] = dst_meta[s * n_rows + row];
                if l == 0.0 {
                    continue;
                }
                let w = (m - mx).exp() * l;
                num += w * dst_tmp[(s * n_rows + row) * d_v + d];
                den += w;
            }
            dst[row * d_v + d] = if den > 0.0 { num / den } else { 0.0 };
        }
    }
}

fn hash_embed(token: u32, i: u32) -> f32 {
    let mut h = token.wrapping_mul(2654435761) ^ i.wrapping_mul(2246822519);
    h ^= h >> 15;
    h = h.wrapping_mul(2654435761);
    h ^= h >> 13;
    (h & 0xffff) as f32 / 32768.0 - 1.0
}

/// Deterministic token embeddings, as the `embed` kernel.
pub fn embed(tokens: &[i32], x: &mut [f32], n_embd: usize) {
    for (i, v) in x.iter_mut().enumerate().take(tokens.len() * n_embd) {
        *v = hash_embed(tokens[i / n_embd] as u32, (i % n_embd) as u32);
    }
}

/// y = x / rms(x) * w, per row of `n`.
pub fn rms_norm(x: &[f32], w: &[f16], y: &mut [f32], n: usize, eps: f32) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let scale = 1.0 / (ss / n as f32 + eps).sqrt();
        for ((o, &v), wv) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * scale * wv.to_f32();
        }
    }
}

/// y[M][N] (+)= x[M][K] . w[K][N].
pub fn matmul(x: &[f32], w: &[f16], y: &mut [f32], m: usize, n: usize, k: usize, accumulate: bool) {
    for i in 0..m {
        let yr = &mut y[i * n..][..n];
        if !accumulate {
            yr.fill(0.0);
        }
        for kk in 0..k {
            let a = x[i * k + kk];
            for (o, wv) in yr.iter_mut().zip(&w[kk * n..][..n]) {
                *o += a * wv.to_f32();
            }
        }
    }
}

/// SwiGLU in place: up = silu(gate) · up.
pub fn swiglu(up: &mut [f32], gate: &[f32]) {
    for (u, &g) in up.iter_mut().zip(gate) {
        *u *= g / (1.0 + (-g).exp());
    }
}

/// Deterministic pseudo-random weights of standard deviation `scale`, as `init_weights`.
pub fn init_weights(w: &mut [f16], seed: u32, scale: f32) {
    for (i, o) in w.iter_mut().enumerate() {
        let mut h = (i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(2246822519);
        h ^= h >> 15;
        h = h.wrapping_mul(2246822519);
        h ^= h >> 13;
        h = h.wrapping_mul(3266489917);
        h ^= h >> 16;
        *o = f16::from_f32(((h & 0xffffff) as f32 / 8388608.0 - 1.0) * scale * 1.732_050_8);
    }
}

/// [`init_weights`]'s values (rounded to f16), stored as q8_0 blocks: `w` holds `n / 32` blocks.
pub fn init_weights_q8_0(w: &mut [u8], seed: u32, scale: f32) {
    let mut h = vec![f16::ZERO; w.len() / Q8_0_BLOCK_BYTES * QK8_0];
    init_weights(&mut h, seed, scale);
    let x: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
    quantize_q8_0(&x, w);
}
