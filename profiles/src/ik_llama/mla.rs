//! ik_llama.cpp's multi-head latent attention (DeepSeek, `-mla 3 -fa`, `build_deepseek2.cpp`),
//! from the normed input to the output projection. The cache holds one compressed row per token
//! (`kv_lora` values and the rotary part).
//!
//! - **Prompt ubatches** (128 tokens or more, `pp_opt`): the cache is decompressed for every
//!   ubatch, `wkv_b × kv_cache` through cuBLAS, in chunks of heads small enough that the f32
//!   result of a chunk stays within `-amb` ([`Mla::attn_max_batch_mib`]): per chunk the cache view copied
//!   to f32, `wkv_b`'s rows converted to f16, a quantized cache's view converted to f16 too, and
//!   an f16 result of `rows × n_kv`, all held at once. These grow with the KV length: about 67
//!   KiB a position for DeepSeek-V3 (68,608 B with a q8_0 cache: cli/tests/predict.rs), the growth
//!   ik_llama.cpp's users see without `-amb`. Then flash attention with heads of 192/128 over the
//!   chunk (the "new" MMA kernel: stream-k, no K/V conversion).
//! - **Fewer tokens** (decode, a prompt's short tail): the absorbed path: `q_nope × wk_b` per head
//!   (the permuted Q copied to f32, its rows quantized; above 8 tokens one MMQ launch and fixup
//!   per head), flash attention over the cache with heads of 576/512 (V a view of K; a
//!   quantized cache converted to f16), then `× wv_b` likewise.
//!
//! The "new" MMA kernel launches `occupancy × nsm'` stream-k blocks, where `nsm'` is the
//! largest power of two of at most the SMs, halved for one token over at most 4096 positions,
//! doubled for 32 tokens or more over 4096 or more (`fattn-new-mma.cu`); ggml reads the
//! occupancy from the device. Recorded on an H200 (profiles/tests/data/h200-2026-11-22-moe):
//! for heads of 576, 4 blocks per SM over 16 columns, 2 over 32, 1 over 64; 2 for heads of 192
//! over 64.

use super::ggml::{mmq_x, MatMul, MMQ_TAIL, MMQ_Y, MMVQ_MAX_BATCH};
use crate::graph;
use crate::model::{EngineModel, Mla};
use crate::op::{req, OpCall, OpKind, Request};
use crate::setup::Device;
use cupool_kernels::KvType;

/// Ubatches of at least this many tokens take the decompressing prompt path.
const PP_MIN_TOKENS: usize = 128;
/// Compute capability of Ada Lovelace: from it on the new MMA kernel always runs stream-k.
const CC_ADA: u32 = 890;
const MUL_MAT: &str = "MUL_MAT";

/// The attention of `n` tokens over `n_kv` cache positions.
pub(super) fn attention(
    mm: &MatMul,
    kv: KvType,
    dev: Device,
    m: &EngineModel,
    mla: Mla,
    n: usize,
    n_kv: usize,
) -> Vec<OpCall> {
    let (e, h) = (m.n_embd, m.n_head);
    let nope = m.head_dim - mla.rope;
    // wq_a and wkv_a_mqa read one quantization of the input; then wq_b.
    let mut calls = vec![
        mm.shared_input(e, 2, n),
        mm.single(mla.q_lora, h * m.head_dim, n),
    ];
    if n >= PP_MIN_TOKENS {
        let per_head = nope + mla.v_head;
        let heads = chunk_heads(h, per_head, n_kv, mla.attn_max_batch_mib);
        let rows = per_head * heads;
        let mut held = vec![
            req(MUL_MAT, n_kv * mla.kv_lora * 4),
            req(MUL_MAT, rows * mla.kv_lora * 2),
        ];
        if kv != KvType::F16 {
            held.push(req(MUL_MAT, n_kv * mla.kv_lora * 2));
        }
        held.push(req(MUL_MAT, rows * n_kv * 2));
        let decompress = OpCall::new(OpKind::MatMul, held, vec![]);
        let head = Head {
            dk: m.head_dim,
            dv: mla.v_head,
            ncols: (64, 1),
            q_per_kv: 1,
            kv_heads: heads,
        };
        let fa = new_mma(dev, head, n, n_kv);
        let fa = OpCall::new(OpKind::FlashAttention, fa, vec![]);
        // One op per chunk, holding nothing itself, run once per chunk.
        let mut chunk = OpCall::new(OpKind::FlashAttention, vec![], vec![]);
        chunk.nested = vec![decompress, fa];
        chunk.repeat = h / heads;
        calls.push(chunk);
    } else {
        // q_nope × wk_b, per head: the permuted Q copied to f32, its rows quantized.
        calls.push(per_head(dev, h, nope, n, true));
        let mut fa = Vec::with_capacity(2);
        if kv != KvType::F16 {
            fa.push(req("K_f16", n_kv * (mla.kv_lora + mla.rope) * 2));
        }
        // All heads share the one cache head: 16 of them per block, 1, 2 or 4 tokens a tile.
        let ncols1 = match n {
            1 => 1,
            2 => 2,
            _ => 4,
        };
        let head = Head {
            dk: mla.kv_lora + mla.rope,
            dv: mla.kv_lora,
            ncols: (ncols1, 16),
            q_per_kv: h,
            kv_heads: 1,
        };
        fa.extend(new_mma(dev, head, n, n_kv));
        calls.push(OpCall::new(OpKind::FlashAttention, fa, vec![]));
        // × wv_b, per head: the permuted result copied to f32 (one token's is contiguous).
        calls.push(per_head(dev, h, mla.kv_lora, n, n > 1));
    }
    calls.push(mm.single(h * mla.v_head, e, n));
    calls
}

/// A matrix multiply per head of `n` tokens of `input` values (`wk_b`, `wv_b`): the input
/// copied to f32 where it is a permuted view, its `heads × n` rows quantized to q8_1; above 8
/// tokens MMQ runs one launch per head, each with its stream-k fixup.
fn per_head(dev: Device, heads: usize, input: usize, n: usize, copy: bool) -> OpCall {
    let rows = heads * n;
    let mut held = Vec::with_capacity(2);
    if copy {
        held.push(req(MUL_MAT, rows * input * 4));
    }
    if n <= MMVQ_MAX_BATCH {
        held.push(req(MUL_MAT, graph::q8_1_bytes(input, rows)));
        return OpCall::new(OpKind::MatMul, held, vec![]);
    }
    held.push(req(MUL_MAT, graph::q8_1_bytes(input, rows) + MMQ_TAIL));
    let fixup = req(MUL_MAT, dev.nsm * mmq_x(n) * MMQ_Y * 4);
    OpCall::new(OpKind::MatMul, held, vec![fixup; heads])
}

/// Heads per decompression chunk: all of them without a limit or while their f32 K/V
/// (`rows × n_kv` floats, in whole MiB) fits `limit_mib`, else the fewest chunks (a divisor of
/// the heads) that fit.
fn chunk_heads(heads: usize, per_head: usize, n_kv: usize, limit_mib: usize) -> usize {
    let mib = heads * per_head * n_kv * 4 / (1 << 20);
    if limit_mib == 0 || mib <= limit_mib {
        return heads;
    }
    (2..heads)
        .find(|&it| heads % it == 0 && mib / it <= limit_mib)
        .map_or(1, |it| heads / it)
}

/// The new MMA kernel's pool buffers for heads of `dk`/`dv` over `ncols1 × ncols2` columns:
/// `KV_max` from 1024 tokens, and the stream-k `dst_tmp_meta`.
fn new_mma(dev: Device, head: Head, n: usize, n_kv: usize) -> Vec<Request> {
    let Head {
        dk,
        dv,
        ncols: (ncols1, ncols2),
        q_per_kv,
        kv_heads,
    } = head;
    let mut nsm = 1;
    while nsm * 2 <= dev.nsm {
        nsm *= 2;
    }
    if n == 1 && n_kv <= 4096 && nsm > 32 {
        nsm /= 2;
    }
    if n >= 32 && n_kv >= 4096 {
        nsm *= 2;
    }
    let occupancy = dev
        .occupancy
        .unwrap_or(match (dev.cc, dk, ncols1 * ncols2) {
            (900, 576, 16) => 4,
            (900, 576, 64) => 1,
            _ => 2,
        });
    let mut out = Vec::with_capacity(2);
    if n >= 1024 {
        out.push(req("KV_max", n.div_ceil(ncols1) * 4));
    }
    // From Ada on always stream-k; before, only when whole tiles fill less than 75% of the
    // waves (else one block per tile).
    let max_blocks = occupancy * nsm;
    let tiles = n.div_ceil(ncols1) * q_per_kv.div_ceil(ncols2) * kv_heads;
    let waves = tiles.div_ceil(max_blocks);
    let stream_k = dev.cc >= CC_ADA || 100 * tiles / (max_blocks * waves) < 75;
    let blocks = if stream_k { max_blocks } else { tiles };
    out.push(req(
        "dst_tmp_meta",
        blocks * ncols1 * ncols2 * (4 + dv) * 4 * 8,
    ));
    out
}

/// A flash-attention call of the new MMA kernel: head sizes, the columns of a tile (tokens ×
/// query heads), query heads per K/V head, K/V heads.
#[derive(Clone, Copy, Debug)]
struct Head {
    dk: usize,
    dv: usize,
    ncols: (usize, usize),
    q_per_kv: usize,
    kv_heads: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_the_decompressed_heads_within_the_batch_limit() {
        // DeepSeek-V3: 128 heads of 256 rows; 2048 positions are 256 MiB of f32: one chunk.
        assert_eq!(chunk_heads(128, 256, 2048, 256), 128);
        assert_eq!(chunk_heads(128, 256, 2304, 256), 64);
        // 20480 positions: 2560 MiB, 16 chunks of 8 heads; without a limit one.
        assert_eq!(chunk_heads(128, 256, 20480, 256), 8);
        assert_eq!(chunk_heads(128, 256, 20480, 0), 128);
    }

    const DECODE: Head = Head {
        dk: 576,
        dv: 512,
        ncols: (1, 16),
        q_per_kv: 128,
        kv_heads: 1,
    };
    const PROMPT: Head = Head {
        dk: 192,
        dv: 128,
        ncols: (64, 1),
        q_per_kv: 1,
        kv_heads: 128,
    };

    #[test]
    fn the_new_kernel_s_stream_k_blocks_follow_its_sm_rounding() {
        let dev = Device::H100_SXM;
        // One token over 1280 positions: 64 SMs counted, 4 blocks each, 16 columns.
        assert_eq!(
            new_mma(dev, DECODE, 1, 1280),
            [req("dst_tmp_meta", 256 * 16 * 516 * 32)]
        );
        // 512 tokens over 8192 positions: 256 SMs counted, 2 blocks each, 64 columns.
        assert_eq!(
            new_mma(dev, PROMPT, 512, 8192),
            [req("dst_tmp_meta", 512 * 64 * 132 * 32)]
        );
        // An A100 (108 SMs counted as 64, before Ada): stream-k only where whole tiles would
        // fill less than 75% of the waves. A decode's 8 tiles fill 25% of 32 × 2 blocks:
        // stream-k; a prompt ubatch's 1024 fill 128 blocks 8 times exactly: one per tile.
        let a100 = Device::new(800, 108);
        assert_eq!(
            new_mma(a100, DECODE, 1, 1280),
            [req("dst_tmp_meta", 64 * 16 * 516 * 32)]
        );
        assert_eq!(
            new_mma(a100, PROMPT, 512, 2048),
            [req("dst_tmp_meta", 1024 * 64 * 132 * 32)]
        );
        // 2048 tokens: the KV tile bounds too.
        assert_eq!(new_mma(dev, PROMPT, 2048, 8192)[0], req("KV_max", 32 * 4));
    }
}
