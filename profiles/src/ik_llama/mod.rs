//! ik_llama.cpp at 8337e4cd (whose 12 GiB-card prefill runs out in its legacy pool), dense models,
//! CUDA devices of compute capability 8.0 or newer, flash attention on.
//!
//! Per layer, from `ggml/src/ggml-cuda/` of that commit:
//! - **matrix multiplies** (`ggml_cuda_op_mul_mat`): f16 weights go to cuBLAS, which takes the
//!   activations converted to f16 (`n × in × 2` bytes) and an f16 result (`n × out × 2`), at every
//!   batch size. q8_0 weights above 8 columns go to MMQ: the activations quantized to q8_1 in
//!   MMQ's layout (`n × pad(in, 512) × 36 / 32` bytes plus `mmq_x_max × 144` of tail, `mmq.cu`)
//!   held over the launch, and a stream-k fixup buffer per launch (`nsm × mmq_x × mmq_y` floats,
//!   `mmq.cuh` `launch_mul_mat_q`, where `mmq_x` is the smallest tile that needs no more column
//!   passes than the largest one). At most 8 columns go to MMVQ, which takes the q8_1 activations
//!   alone. With quantized weights ik_llama.cpp quantizes the activations once for Q, K and V
//!   (three launches, three fixups) and runs gate and up as one `FUSED_UP_GATE` op that holds an
//!   f32 result of `n × n_ff` beside the activations.
//! - **flash attention** (`fattn.cu` → `fattn-mma-f16.cuh` `launch_fattn_mma`, stream-k): a
//!   quantized cache is converted to `K_f16` and `V_f16` (the whole view, `n_kv × kv_dim`), then
//!   `KV_min_max` (one `int2` per column tile) for batches of 1024 or more, then `dst_tmp_meta`:
//!   `blocks × ncols × (4 + D)` elements of 8 bytes, where `ncols = ncols1 × ncols2` (ncols2 the
//!   largest of 8, 4, 2, 1 dividing the GQA ratio; ncols1 the smallest of 8, 16, 32, 64 over
//!   ncols2 that covers the batch), and `blocks` is the tile count, or the stream-k block count
//!   (`2 × nsm` for batches, `nsm` for one token) when the tiles fill less than 75% of their waves
//!   or the batch is over 2048. The allocation sizes `float2` elements by `sizeof(float)`: four
//!   times what the kernel writes, as the engine asks.
//! - after the last layer's attention only the output rows go on (`inp_out_ids`), then the output
//!   matrix; a ubatch with no output row (all but the last of a prompt) skips the last layer's
//!   feed-forward and the output matrix (ggml skips ops on empty tensors).
//!
//! - **experts** (mixture-of-experts models, q8_0): `MOE_FUSED_UP_GATE` with the down projection
//!   fused in (`ggml_cuda_moe_up_gate_unary`, `mmq_id.cu`); see `ggml::MatMul::fused_experts`. The
//!   router is an f32 matrix multiply and the top-k selection, neither of which takes pool memory.
//!
//! Not modelled, refused with a message: f16 experts and ubatches of more than 32 tokens per
//! expert of the model (one cuBLAS or MMQ call per expert, each sized by the number of tokens
//! the router sends it: not predictable from the shape), head dimensions the MMA kernel has no
//! case for, single-token attention that goes to the vector kernel (an f16 cache with head
//! dimension 64 or 128 and no GQA), and devices before Ampere.

mod attention;
mod ggml;
mod mla;

use crate::error::ProfileError;
use crate::graph::{self, LayerOps};
use crate::model::{Arch, EngineModel, Mla, Moe};
use crate::op::OpCall;
pub use crate::setup::UbatchShape;
use crate::setup::{Device, Setup, Weights};
use cupool_kernels::KvType;
use ggml::MatMul;

/// The commit this profile models.
pub const COMMIT: &str = "8337e4cd";

/// Head dimensions the MMA flash-attention kernel has a case for.
const MMA_HEAD_DIMS: [usize; 7] = [64, 80, 96, 112, 128, 192, 256];

fn invalid(what: String) -> ProfileError {
    ProfileError::unsupported("ik_llama", COMMIT, what)
}

/// ik_llama.cpp takes MMQ's expert path up to this many tokens per expert of the model
/// (`mmq_id_thresh`), and per-expert matrix multiplies beyond.
const MMQ_ID_TOKENS_PER_EXPERT: usize = 32;

fn check(
    m: &EngineModel,
    weights: Weights,
    kv: KvType,
    u: UbatchShape,
    dev: Device,
) -> Result<(), ProfileError> {
    let UbatchShape {
        n_tokens,
        n_kv,
        n_outputs,
    } = u;
    if dev.cc < 800 || dev.nsm == 0 {
        return Err(invalid(format!(
            "compute capability {}.{} with {} SMs: accepted are devices of compute capability 8.0 or newer",
            dev.cc / 100,
            dev.cc % 100 / 10,
            dev.nsm
        )));
    }
    if n_tokens == 0 || n_outputs > n_tokens || n_kv < n_tokens {
        return Err(invalid(format!(
            "{n_tokens} tokens, {n_outputs} outputs, KV length {n_kv}: accepted are 1 or more tokens, 0 to that many outputs and a KV length of at least the tokens"
        )));
    }
    if !MMA_HEAD_DIMS.contains(&m.head_dim) || m.n_head_kv == 0 || m.n_head % m.n_head_kv != 0 {
        return Err(invalid(format!(
            "head dimension {} with {} of {} heads for K/V: accepted are head dimensions {MMA_HEAD_DIMS:?} and a whole GQA ratio",
            m.head_dim, m.n_head_kv, m.n_head
        )));
    }
    if let Some(moe) = m.moe {
        if weights == Weights::F16 {
            return Err(invalid(
                "f16 experts go through one cuBLAS call per expert, sized by how many tokens the router sends to it: accepted are q8_0 weights for a mixture-of-experts model".into(),
            ));
        }
        let most = MMQ_ID_TOKENS_PER_EXPERT * moe.n_expert;
        if n_tokens > most {
            return Err(invalid(format!(
                "{n_tokens} tokens through {} experts: beyond {most} tokens the experts run one by one, sized by the routing; accepted are ubatches of at most {most}",
                moe.n_expert
            )));
        }
    }
    if m.mla.is_some() {
        if weights == Weights::F16 {
            return Err(invalid("f16 weights for multi-head latent attention: accepted are q8_0 weights for deepseek-v3".into()));
        }
        return Ok(());
    }
    let gqa = m.n_head / m.n_head_kv;
    let vector_decode = kv == KvType::F16 && gqa % 2 != 0 && m.head_dim % 64 == 0;
    if vector_decode && n_tokens == 1 {
        return Err(invalid(
            "single-token attention over an f16 cache without GQA goes to the vector kernel, which this profile does not model".into(),
        ));
    }
    Ok(())
}

/// The requests of layer `l` of a ubatch (the last layer's feed-forward runs on the output rows
/// only, and not at all without any).
pub fn layer(s: &Setup, u: UbatchShape, l: usize) -> Result<Vec<OpCall>, ProfileError> {
    check(&s.model, s.weights, s.kv, u, s.dev)?;
    Ok(graph::layer(&Ik::of(s), &s.model, u, l))
}

/// [`layer`] in parts: the ops before and after the attention, for `n_tokens` tokens and
/// `n_outputs` output rows (unchecked: [`attention`] refuses what [`layer`] does).
pub fn around(
    s: &Setup,
    n_tokens: usize,
    n_outputs: usize,
    l: usize,
) -> (Vec<OpCall>, Vec<OpCall>) {
    graph::around(&Ik::of(s), &s.model, n_tokens, n_outputs, l)
}

/// [`layer`]'s attention for ubatch `u`, between [`around`]'s parts.
pub fn attention(s: &Setup, u: UbatchShape) -> Result<Vec<OpCall>, ProfileError> {
    check(&s.model, s.weights, s.kv, u, s.dev)?;
    Ok(graph::attention(&Ik::of(s), &s.model, u.n_tokens, u.n_kv))
}

/// The output matrix's requests, on the output rows (none without any).
pub fn output(s: &Setup, u: UbatchShape) -> Option<OpCall> {
    graph::output(&Ik::of(s), &s.model, u)
}

/// ik_llama.cpp's kernels for one weight type, cache type and device.
struct Ik {
    weights: Weights,
    kv: KvType,
    dev: Device,
}

impl LayerOps for Ik {
    fn matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
        Some(self.mm().single(input, output, n))
    }

    fn qkv(&self, m: &EngineModel, n: usize) -> Vec<OpCall> {
        let e = m.n_embd;
        match self.weights {
            Weights::F16 => [e, m.kv_dim(), m.kv_dim()]
                .into_iter()
                .map(|out| self.mm().single(e, out, n))
                .collect(),
            Weights::Q8_0 => vec![self.mm().shared_input(e, 3, n)],
        }
    }

    fn gate_up(&self, e: usize, n_ff: usize, n: usize) -> Vec<OpCall> {
        match self.weights {
            Weights::F16 => (0..2).map(|_| self.mm().single(e, n_ff, n)).collect(),
            Weights::Q8_0 => vec![self.mm().fused_up_gate(e, n_ff, n)],
        }
    }

    fn mla_attention(&self, m: &EngineModel, mla: Mla, n: usize, n_kv: usize) -> Vec<OpCall> {
        mla::attention(&self.mm(), self.kv, self.dev, m, mla, n, n_kv)
    }

    fn attention(&self, m: &EngineModel, n: usize, n_kv: usize) -> Option<OpCall> {
        Some(attention::flash_attention(m, self.kv, n, n_kv, self.dev))
    }

    fn experts(&self, m: &EngineModel, moe: Moe, n: usize) -> Vec<OpCall> {
        vec![self.mm().fused_experts(m.n_embd, moe, n)]
    }

    fn rows_after_attention(&self, m: &EngineModel, n_tokens: usize, n_outputs: usize) -> usize {
        // Qwen3-MoE's graph selects the output rows only for more than one token
        // (`build_qwen3moe`): a lone token goes through the last layer and the output matrix
        // whether or not it asked for logits (sweep-bench's warm-up does not).
        if m.arch == Arch::Qwen3Moe && n_tokens == 1 {
            1
        } else {
            n_outputs
        }
    }
}

impl Ik {
    fn of(s: &Setup) -> Self {
        Self {
            weights: s.weights,
            kv: s.kv,
            dev: s.dev,
        }
    }

    fn mm(&self) -> MatMul {
        MatMul::new(self.weights, self.dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole ubatch through the profile.
    fn ubatch(
        m: &EngineModel,
        weights: Weights,
        kv: KvType,
        n_tokens: usize,
        n_kv: usize,
        n_outputs: usize,
        dev: Device,
    ) -> Result<Vec<OpCall>, ProfileError> {
        let s = Setup {
            model: m.clone(),
            weights,
            kv,
            dev,
        };
        let u = UbatchShape {
            n_tokens,
            n_kv,
            n_outputs,
        };
        crate::profile::Profile::IkLlama.ubatch(&s, u)
    }

    #[test]
    fn bad_inputs_are_refused_with_what_is_accepted() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let dev = Device::H100_SXM;
        let err = |r: Result<Vec<OpCall>, ProfileError>| r.unwrap_err().to_string();
        let e = err(ubatch(&m, Weights::F16, KvType::Q8_0, 512, 256, 1, dev));
        assert!(e.contains("KV length of at least"), "{e}");
        let e = err(ubatch(
            &m,
            Weights::F16,
            KvType::Q8_0,
            512,
            512,
            1,
            Device::new(750, 40),
        ));
        assert!(e.contains("8.0 or newer"), "{e}");
        let mut odd = m.clone();
        odd.head_dim = 48;
        let e = err(ubatch(&odd, Weights::F16, KvType::Q8_0, 8, 256, 1, dev));
        assert!(e.contains("head dimensions"), "{e}");
        let mut mha = m.clone();
        mha.n_head_kv = mha.n_head;
        let e = err(ubatch(&mha, Weights::F16, KvType::F16, 1, 256, 1, dev));
        assert!(e.contains("vector kernel"), "{e}");
        assert!(ubatch(&m, Weights::F16, KvType::Q8_0, 512, 512, 513, dev).is_err());
        // No output row: the last layer's feed-forward and the output matrix are skipped.
        let all = ubatch(&m, Weights::F16, KvType::Q8_0, 512, 512, 1, dev).unwrap();
        let none = ubatch(&m, Weights::F16, KvType::Q8_0, 512, 512, 0, dev).unwrap();
        assert_eq!(all.len() - none.len(), 4);
        assert_eq!(none[..], all[..none.len()]);
    }

    #[test]
    fn a_long_batch_adds_the_kv_tile_bounds_and_goes_stream_k() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let calls = ubatch(
            &m,
            Weights::F16,
            KvType::Q8_0,
            4096,
            8192,
            1,
            Device::H100_SXM,
        )
        .unwrap();
        let fa = &calls[3];
        let names: Vec<&str> = fa.held.iter().map(|r| r.name).collect();
        assert_eq!(names, ["K_f16", "V_f16", "KV_min_max", "dst_tmp_meta"]);
        // ncols2 = 4 (GQA 4), ncols1 = 16: 256 column tiles of 8 bytes; over 2048 tokens the
        // kernel runs stream-k on 2 × 132 blocks of 64 columns.
        assert_eq!(fa.held[2].bytes, 256 * 8);
        assert_eq!(fa.held[3].bytes, 264 * 64 * 132 * 32);
    }
}
