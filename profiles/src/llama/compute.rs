//! llama.cpp's CUDA compute buffer: what ggml's graph allocator (`ggml-alloc.c`) reserves for
//! the worst-case graph (every row of a full ubatch asks for logits, the KV cache at its full
//! context), as the larger of the two stages where the live tensors are largest.
//!
//! - **Output**: `result_norm` (the final RMS norm, computed in place over the last layer's
//!   output) and `result_output` (f32 logits of every row). Both are graph outputs, which
//!   ggml-alloc never frees, and nothing else is live once the last layer's residual add ran.
//! - **Attention** (a layer before the last): the graph inputs copied to the device, which live
//!   until their last user in the last layer (the f16 mask over the whole context, positions,
//!   the cache rows to write K and V to, the output ids, and with a rotated quantized cache the
//!   Hadamard matrices), the layer's input (the residual add reads it after attention), the
//!   query, and the flash-attention node itself: its f32 output plus, for a quantized cache,
//!   the f16 copies of K and V over the whole context (`ggml_cuda_flash_attn_ext_get_alloc_size`,
//!   each 128-byte aligned after the output).
//!
//! ggml-alloc places tensors best-fit and leaves holes; where a stage's block lands above a
//! hole the buffer is larger than the stage's live bytes. This is therefore a lower bound,
//! exact where no hole lies under the peak (see `profiles/tests/mainline.rs`).

use super::Version;
use crate::model::EngineModel;
use crate::sweep::KV_PADDING;
use cupool_kernels::KvType;

/// ggml-alloc's alignment on a CUDA buffer (`ggml_backend_cuda_buffer_type_get_alignment`).
const ALIGN: usize = 128;

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// The CUDA compute buffer llama.cpp reserves for ubatches of `n_ubatch` tokens over a context
/// of `n_ctx` (a lower bound; see the module docs).
pub fn compute_buffer_bytes(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
) -> usize {
    output_stage(m, n_ubatch).max(attention_stage(v, m, kv, n_ctx, n_ubatch))
}

/// `result_norm` and the logits, f32, for every row of the ubatch.
fn output_stage(m: &EngineModel, n_ubatch: usize) -> usize {
    aligned(m.n_embd * n_ubatch * 4) + aligned(m.n_vocab * n_ubatch * 4)
}

fn attention_stage(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
) -> usize {
    let n_kv = n_ctx.div_ceil(KV_PADDING) * KV_PADDING;
    let n = n_ubatch;
    // `build_attn_inp_kq_mask` (f16 with flash attention), `inp_pos` (i32), the K and V row
    // indices (i64, V's per row: flash attention keeps V untransposed) and `out_ids` (i32).
    let mut inputs = [n_kv * n * 2, n * 4, n * 8, n * 8, n * 4]
        .into_iter()
        .map(aligned)
        .sum::<usize>();
    // A quantized cache with heads of a multiple of 64 is rotated (`llama_kv_cache`'s
    // `attn_rot_k`/`attn_rot_v`): f32 Hadamard matrices, K's of the largest power of two that
    // divides a head, V's of 64 (`build_input_k_rot`, `build_input_v_rot`).
    if kv != KvType::F16 && m.head_dim % 64 == 0 {
        let k_rot = 1 << m.head_dim.trailing_zeros();
        inputs += aligned(k_rot * k_rot * 4) + aligned(64 * 64 * 4);
    }
    let residual = aligned(m.n_embd * n * 4);
    let q = aligned(m.q_dim() * n * 4);
    let mut fa = aligned(m.q_dim() * n * 4);
    if !v.kv_f16_from_pool() && kv != KvType::F16 {
        fa += 2 * aligned(n_kv * m.kv_dim() * 2);
    }
    inputs + residual + q + fa
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_larger_stage_counts() {
        let m = EngineModel::preset("phi3-mini").unwrap();
        let v = Version::D99724f2;
        // A short context: the logits of 512 rows and the norm beside them.
        let out = (32064 + 3072) * 512 * 4;
        assert_eq!(compute_buffer_bytes(v, &m, KvType::Q8_0, 512, 512), out);
        // 20k positions: attention's f16 copies of K and V (120 MiB each), the mask (20 MiB),
        // the output, query and residual (6 MiB each) and 12 KiB of positions and indices.
        let attn = 2 * 20480 * 3072 * 2 + 20480 * 512 * 2 + 3 * (6 << 20) + (12 << 10);
        assert_eq!(compute_buffer_bytes(v, &m, KvType::Q8_0, 20480, 512), attn);
        // Without the copies (an f16 cache, or before PR #23907) the output stage is the peak.
        assert_eq!(compute_buffer_bytes(v, &m, KvType::F16, 20480, 512), out);
        let old = Version::B8833;
        assert_eq!(compute_buffer_bytes(old, &m, KvType::Q8_0, 20480, 512), out);
    }
}
