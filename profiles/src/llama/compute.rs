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
//! hole the buffer is larger than the stage's live bytes, so the stages are a lower bound. For
//! a dense llama or phi3 model and for qwen3moe [`compute_buffer_bytes`] and
//! [`pipeline_compute_buffer_bytes`] therefore replay the allocator itself (`galloc.rs`) over the
//! scheduler's copy (`sched.rs`, with the tensors the CUDA backend's MoE fusions keep alive:
//! `fusion.rs`) of the reserve graph (`reserve.rs`, `moe.rs`): every buffer mainline logged on
//! one and on two H100s, to the byte printed (`profiles/tests/mainline.rs`,
//! `mainline_two_gpus.rs`; the mixture of experts on one). The stage model below stays for
//! what the replay does not model (deepseek's latent attention: a lower bound) and in
//! [`device_compute_buffer_bytes`], which `scripts/llama/two_gpu_terms.py` mirrors for the
//! two-GPU replan.
//!
//! **Several devices** (`-sm layer`, every layer and the output offloaded): llama.cpp then runs
//! the layers as a pipeline (`llama_context`'s `pipeline_parallel`, `src/llama-context.cpp`),
//! and `ggml_backend_sched_new(..., parallel = true, ...)` keeps `GGML_SCHED_MAX_COPIES` (4)
//! copies of every split's inputs (`ggml-backend.cpp`, `ggml_backend_sched_split_graph`: the
//! `tensor_id_copy` loop of pass 5), so that the next ubatch's inputs can be copied in while
//! this one still runs. Each copy is flagged input and output, which ggml-alloc never frees,
//! and the copies are added as leafs, allocated before any node. A device's split reads from
//! other backends the hidden state (from the CPU's token-embedding row lookup on the first
//! device, from the previous device's last layer on the next), the mask, the positions, the K
//! and V row indices, the Hadamard matrices of a rotated cache, and on the device of the last
//! layer the output ids; so its buffer holds 4 copies of them, never reused, under the largest
//! of its own stages: attention, the feed-forward network (the layer's input, the hole its
//! norm leaves, gate and up, the GLU's output: `2 × n_embd + 3 × n_ff` f32 rows; on one device
//! the output stage is the larger), and the output stage where the output layer lives
//! ([`device_compute_buffer_bytes`]). The CPU's copies of the graph inputs go to the
//! `CUDA_Host` buffer, not the device's.

use super::Version;
use crate::model::{Arch, EngineModel};
use crate::sweep::KV_PADDING;
use cupool_kernels::KvType;

/// ggml-alloc's alignment on a CUDA buffer (`ggml_backend_cuda_buffer_type_get_alignment`).
const ALIGN: usize = 128;

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

/// The CUDA compute buffer llama.cpp reserves for ubatches of `n_ubatch` tokens over a context
/// of `n_ctx` on one device: ggml-alloc's placement of the reserve graph replayed
/// ([`pipeline_compute_buffer_bytes`] with one device) for the graphs modelled (a dense llama
/// or phi3 model, qwen3moe); else the larger of the stages (a lower bound; see the module docs).
pub fn compute_buffer_bytes(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
) -> usize {
    if replayed(m) && m.n_layer > 0 && n_ubatch > 0 {
        let layers = vec![0; m.n_layer];
        if let Some(b) = pipeline_compute_buffer_bytes(v, m, kv, n_ctx, n_ubatch, &layers, 0, 1) {
            return b[0];
        }
    }
    stages(v, m, kv, n_ctx, n_ubatch)
}

/// The stage model: the larger of the output and attention stages' live bytes.
fn stages(v: Version, m: &EngineModel, kv: KvType, n_ctx: usize, n_ubatch: usize) -> usize {
    output_stage(m, n_ubatch).max(attention_stage(v, m, kv, n_ctx, n_ubatch))
}

/// Each CUDA device's compute buffer when the repeating layers run on `layer_dev` (one device
/// index per layer, below `n_gpus`) and the output layer on `output_dev`, with `copies` copies
/// of each split input ([`sched_copies`]): the reserve graph of a dense llama or phi3 model or
/// of qwen3moe (`reserve.rs`) through the scheduler's splits (`sched.rs`) and ggml-alloc
/// (`galloc.rs`). `None` for a graph not modelled (deepseek's latent attention) or a placement
/// naming no such device. A mixture of experts over several devices is the same graph through
/// the same scheduler, but no such run is recorded to check it against.
#[allow(clippy::too_many_arguments)]
pub fn pipeline_compute_buffer_bytes(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
    layer_dev: &[usize],
    output_dev: usize,
    n_gpus: usize,
) -> Option<Vec<usize>> {
    let copies = if n_gpus > 1 { SCHED_MAX_COPIES } else { 1 };
    if !replayed(m) || layer_dev.len() != m.n_layer || n_ubatch == 0 || n_gpus == 0 {
        return None;
    }
    if layer_dev.iter().chain([&output_dev]).any(|&d| d >= n_gpus) {
        return None;
    }
    let p = super::reserve::Placement {
        n_gpus,
        layer_dev: layer_dev.to_vec(),
        output_dev,
    };
    let g = super::reserve::build(v, m, kv, n_ctx, n_ubatch, &p);
    let mut sizes = super::sched::buffer_sizes(&g, n_gpus, copies, ALIGN);
    sizes.truncate(n_gpus);
    Some(sizes)
}

/// Whether the reserve graph of `m` is modelled (`reserve.rs`): a dense llama or phi3 model, or
/// qwen3moe (every layer's FFN the experts, two or more used per token: one used expert ends in
/// a `ggml_cont` the graph does not build). Not deepseek's latent attention, dense lead layers or
/// shared experts.
fn replayed(m: &EngineModel) -> bool {
    let plain = m.mla.is_none() && m.n_dense_lead == 0 && m.n_ff_shared == 0;
    plain
        && match m.moe {
            None => true,
            Some(moe) => m.arch == Arch::Qwen3Moe && moe.n_expert_used >= 2,
        }
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
    graph_inputs(m, kv, n_ctx, n_ubatch, true) + attention_nodes(v, m, kv, n_ctx, n_ubatch)
}

/// The graph inputs a device's layers read, each 128-byte aligned: `build_attn_inp_kq_mask`
/// (f16 with flash attention), `inp_pos` (i32), the K and V row indices (i64, V's per row:
/// flash attention keeps V untransposed), the Hadamard matrices of a rotated cache and, with
/// `out_ids`, the output ids (i32, one per row: the worst case asks for every row).
fn graph_inputs(m: &EngineModel, kv: KvType, n_ctx: usize, n: usize, out_ids: bool) -> usize {
    let n_kv = n_ctx.div_ceil(KV_PADDING) * KV_PADDING;
    let mut inputs = [n_kv * n * 2, n * 4, n * 8, n * 8]
        .into_iter()
        .map(aligned)
        .sum::<usize>();
    if out_ids {
        inputs += aligned(n * 4);
    }
    // A quantized cache with heads of a multiple of 64 is rotated (`llama_kv_cache`'s
    // `attn_rot_k`/`attn_rot_v`): f32 Hadamard matrices, K's of the largest power of two that
    // divides a head, V's of 64 (`build_input_k_rot`, `build_input_v_rot`).
    if kv != KvType::F16 && m.head_dim % 64 == 0 {
        let k_rot = 1 << m.head_dim.trailing_zeros();
        inputs += aligned(k_rot * k_rot * 4) + aligned(64 * 64 * 4);
    }
    inputs
}

/// Attention's own tensors: the layer's input, the query, the flash-attention node (its output
/// and, before the pool took them, the f16 copies of a quantized cache).
fn attention_nodes(v: Version, m: &EngineModel, kv: KvType, n_ctx: usize, n: usize) -> usize {
    let n_kv = n_ctx.div_ceil(KV_PADDING) * KV_PADDING;
    let residual = aligned(m.n_embd * n * 4);
    let q = aligned(m.q_dim() * n * 4);
    let mut fa = aligned(m.q_dim() * n * 4);
    if !v.kv_f16_from_pool() && kv != KvType::F16 {
        fa += 2 * aligned(n_kv * m.kv_dim() * 2);
    }
    residual + q + fa
}

/// A dense layer's feed-forward stage: the layer's input (read by the residual add after the
/// FFN), the hole its norm leaves once gate and up have read it (the GLU's output does not fit
/// there and goes above), gate and up (one fused `2 × n_ff` matrix in phi3, two in llama) and
/// the GLU's output, all f32. None for a mixture of experts (this stage model does not cover
/// it: a lower bound).
fn ffn_stage(m: &EngineModel, n: usize) -> usize {
    if m.moe.is_some() {
        return 0;
    }
    2 * aligned(m.n_embd * n * 4) + 3 * aligned(m.n_ff * n * 4)
}

/// `GGML_SCHED_MAX_COPIES` (`ggml-backend.cpp`): the copies a pipelined scheduler keeps of
/// each split input.
pub const SCHED_MAX_COPIES: usize = 4;

/// The copies `ggml_backend_sched` keeps of each split input: [`SCHED_MAX_COPIES`] where
/// llama.cpp enables pipeline parallelism (`llama_context::llama_context`: more than one
/// device, every repeating layer and the output offloaded, `n_gpu_layers > n_layer`, layer
/// split, the KV cache offloaded, no tensor overrides; CUDA devices support the async compute
/// and events it also needs), else 1.
pub fn sched_copies(
    n_devices: usize,
    n_gpu_layers: usize,
    n_layer: usize,
    layer_split: bool,
) -> usize {
    if n_devices > 1 && n_gpu_layers > n_layer && layer_split {
        SCHED_MAX_COPIES
    } else {
        1
    }
}

/// A device's place in llama.cpp's layer split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlace {
    /// Copies the scheduler keeps of each split input ([`sched_copies`]).
    pub copies: usize,
    /// Whether the device runs the last repeating layer (which reads the output ids).
    pub last_layer: bool,
    /// Whether it holds the output layer (the final norm and the logits).
    pub output: bool,
}

impl SplitPlace {
    /// One device running the whole model.
    pub const WHOLE: Self = Self {
        copies: 1,
        last_layer: true,
        output: true,
    };
}

/// The CUDA compute buffer llama.cpp reserves on a device that runs some of the layers at
/// `place` in a pipeline (see the module docs): the copies of its split's inputs, never freed,
/// under the largest of its stages. With one copy (no pipeline) this is
/// [`compute_buffer_bytes`], the one-device model. A lower bound as that is: checked against
/// the buffers mainline 0c1e5709 logged on two H100s (`profiles/tests/mainline_two_gpus.rs`).
pub fn device_compute_buffer_bytes(
    v: Version,
    m: &EngineModel,
    kv: KvType,
    n_ctx: usize,
    n_ubatch: usize,
    place: SplitPlace,
) -> usize {
    if place.copies <= 1 {
        return stages(v, m, kv, n_ctx, n_ubatch);
    }
    let n = n_ubatch;
    let hidden = aligned(m.n_embd * n * 4);
    let inputs = hidden + graph_inputs(m, kv, n_ctx, n, place.last_layer);
    let own = attention_nodes(v, m, kv, n_ctx, n).max(ffn_stage(m, n));
    let own = if place.output {
        own.max(output_stage(m, n))
    } else {
        own
    };
    place.copies * inputs + own
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
        assert_eq!(stages(v, &m, KvType::Q8_0, 512, 512), out);
        // 20k positions: attention's f16 copies of K and V (120 MiB each), the mask (20 MiB),
        // the output, query and residual (6 MiB each) and 12 KiB of positions and indices.
        let attn = 2 * 20480 * 3072 * 2 + 20480 * 512 * 2 + 3 * (6 << 20) + (12 << 10);
        assert_eq!(stages(v, &m, KvType::Q8_0, 20480, 512), attn);
        // Without the copies (an f16 cache, or before PR #23907) the output stage is the peak.
        assert_eq!(stages(v, &m, KvType::F16, 20480, 512), out);
        let old = Version::B8833;
        assert_eq!(stages(old, &m, KvType::Q8_0, 20480, 512), out);
        // The replay: equal where nothing lies under the peak, above by ggml-alloc's holes
        // elsewhere (5,120 positions: the flash-attention node lands above the hole the
        // layer's norm leaves, 2.625 MiB over the attention stage).
        assert_eq!(compute_buffer_bytes(v, &m, KvType::Q8_0, 20480, 512), attn);
        let hole = compute_buffer_bytes(v, &m, KvType::Q8_0, 5120, 512);
        assert_eq!(hole - stages(v, &m, KvType::Q8_0, 5120, 512), 2752512);
        // A mixture of experts is replayed too: at 5,120 positions the last layer's output
        // lands above the experts' down projection and its weighted copy (kept alive together
        // by the CUDA backend's fusion, `fusion.rs`), and the logits above it: 40.7852 MiB over
        // the stages, as llama.cpp logged it.
        let moe = EngineModel::preset("qwen3-30b-a3b").unwrap();
        let s = stages(v, &moe, KvType::Q8_0, 5120, 512);
        let replay = compute_buffer_bytes(v, &moe, KvType::Q8_0, 5120, 512);
        assert_eq!((s, replay), (315359232, 358125568));
        let p = pipeline_compute_buffer_bytes(v, &moe, KvType::Q8_0, 5120, 512, &[0; 48], 0, 1);
        assert_eq!(p, Some(vec![replay]));
        // Latent attention (deepseek-v3) is not: the stage model's lower bound.
        let ds = EngineModel::preset("deepseek-v3").unwrap();
        let s = stages(v, &ds, KvType::Q8_0, 5120, 512);
        assert_eq!(compute_buffer_bytes(v, &ds, KvType::Q8_0, 5120, 512), s);
        let p = pipeline_compute_buffer_bytes(v, &ds, KvType::Q8_0, 5120, 512, &[0; 61], 0, 1);
        assert!(p.is_none());
        let bad = pipeline_compute_buffer_bytes(v, &m, KvType::Q8_0, 5120, 512, &[0; 32], 2, 2);
        assert!(bad.is_none(), "an output device past the devices");
    }

    #[test]
    fn a_pipeline_keeps_four_copies_of_each_device_s_inputs() {
        let m = EngineModel::preset("phi3-mini").unwrap();
        let v = Version::B8833;
        let mib = 1 << 20;
        let first = SplitPlace {
            copies: sched_copies(2, 99, 32, true),
            last_layer: false,
            output: false,
        };
        let last = SplitPlace {
            last_layer: true,
            output: true,
            ..first
        };
        // Per copy: the hidden state (6 MiB), the mask (20 MiB), positions and K/V row indices
        // (10 KiB), on the last device the output ids (2 KiB); then the FFN stage (60 MiB) on
        // the first device, the output stage (68.625 MiB) on the last.
        let inputs = 26 * mib + (10 << 10);
        let got = device_compute_buffer_bytes(v, &m, KvType::Q8_0, 20480, 512, first);
        assert_eq!(got, 4 * inputs + 60 * mib);
        let got = device_compute_buffer_bytes(v, &m, KvType::Q8_0, 20480, 512, last);
        assert_eq!(got, 4 * (inputs + (2 << 10)) + (32064 + 3072) * 512 * 4);
        // No pipeline: one copy, the one-device model.
        assert_eq!(sched_copies(1, 99, 32, true), 1);
        assert_eq!(sched_copies(2, 32, 32, true), 1, "the output on the CPU");
        assert_eq!(sched_copies(2, 99, 32, false), 1, "row split");
        let whole = device_compute_buffer_bytes(v, &m, KvType::Q8_0, 20480, 512, SplitPlace::WHOLE);
        assert_eq!(whole, stages(v, &m, KvType::Q8_0, 20480, 512));
    }
}
