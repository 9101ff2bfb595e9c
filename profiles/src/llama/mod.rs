//! llama.cpp (mainline ggml), dense models, CUDA devices of compute capability 8.0 or newer,
//! flash attention on. Two versions:
//!
//! - [`Version::D99724f2`] (the `llama` profile): ggml at d99724f2 (2026-08-21), after PR
//!   #23907. A quantized cache's f16 copies of K and V live in the compute buffer, sized at
//!   startup for the whole context ([`startup_extra_bytes`]), not in the pool.
//! - [`Version::B8833`] (the `llama-b8833` profile, llama.cpp build b8833): the same
//!   kernels with the f16 copies of K and V taken from the pool per call, as before PR #23907.
//!   Its other pool traffic is modelled from d99724f2's sources: #23907 changed only where the
//!   copies live.
//!
//! Per layer, from `src/ggml-cuda/` of d99724f2:
//! - **matrix multiplies** (`ggml_cuda_mul_mat`): f16 weights go to the vector kernel (MMVF)
//!   for one column and to MMF up to 16 columns, neither of which takes pool memory, and to
//!   cuBLAS beyond, which takes the activations converted to f16 and an f16 result
//!   (`ggml_cuda_mul_mat_cublas_impl`). q8_0 weights go to MMVQ up to 8 columns (activations
//!   quantized to q8_1, `n × pad(in, 512) × 36 / 32` bytes; for one column gate and up are one
//!   fused op with one quantization), and to MMQ beyond (`mmq.cu`): the same q8_1 activations
//!   plus `J_max × 144` bytes of tail, `J_max` the largest column tile of at most the batch,
//!   and a stream-k `tmp_fixup` of `blocks × J × 128` floats only when the blocks work on
//!   fractional tiles (`mmq.cuh` `launch_mul_mat_q`: `blocks` is the tile count when the tiles
//!   fill 90% of their waves over the SMs, else the SM count).
//! - **flash attention** (`fattn.cu`, `fattn-common.cuh` `launch_fattn`): batches go to the
//!   MMA kernel (stream-k), which takes `KV_max` (one int per column tile) from 1024 tokens on,
//!   and `dst_tmp_meta` (`blocks × ncols × (2 + D_V/2)` float2) only when the stream-k blocks do
//!   not divide the output tiles; `blocks` is the occupancy (blocks per SM) times the SM count,
//!   rounded down to a multiple of the tiles when that loses at most 5%. One or two tokens with
//!   a head dimension that is a multiple of 64 go to the vector kernel (parallel blocks: a
//!   `dst_tmp` and a `dst_tmp_meta` when it splits the KV length), which reads a q8_0 or f16
//!   cache as it is: no f16 copies in either version.
//!
//! Occupancy: ggml reads it from the compiled kernel (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`).
//! [`Device::occupancy`] gives it; by default the profile takes what that call returned for
//! d99724f2's kernels built for sm_90 on an H100 (`scripts/llama/fattn_occupancy.cu`,
//! data/h100-2026-11-22-fattn-occupancy): 2 blocks per SM for every MMA configuration
//! used (its launch bound), and for the vector kernel 2 (head 128, q8_0 cache), 3 (head 128,
//! f16 cache) or 4 (head 64, q8_0 cache). Other devices and heads: the kernel's launch bound
//! (the blocks per SM its configuration asks the compiler to fit; 1 for the vector kernel).
//!
//! - **experts** (q8_0; `ggml_cuda_mul_mat_id`): up to 8 tokens MMVQ's expert path (the
//!   activations quantized per token for gate and up, fused into one op for one token; the
//!   down projection's input per routed row), beyond it MMQ's: per projection `ids_src1`,
//!   `ids_dst` (an int per routed row), `expert_bounds` (an int per expert and one), the q8_1
//!   activations of every routed row with the tail of the largest tile of at most the input's
//!   rows per token, and the fixup over the tiles of all experts. Routing (softmax, top-k,
//!   weights) is the fused `topk_moe` kernel: no pool memory.
//!
//! One column's fused groups (gate, up and the GLU; a multiply and the residual add after it)
//! run from `ggml_cuda_graph_evaluate_and_capture`, outside the op dispatch that names pool
//! requests: their requests have no name. [`compute_buffer_bytes`] gives the CUDA compute
//! buffer (ggml-alloc replayed over the reserve graph of a dense model or of qwen3moe, with
//! the tensors the CUDA backend's MoE fusions keep alive); [`device_compute_buffer_bytes`] a
//! device's in a pipeline over several GPUs (`-sm layer`: the scheduler's 4 copies of the
//! device's inputs beside them). Checked against mainline 0c1e5709 on an H100 (its ggml matches
//! d99724f2's in what this models), prompts and generated tokens: `profiles/tests/mainline.rs`.
//!
//! Not modelled, refused with a message: f16 experts (MMF's expert path, or cuBLAS per expert
//! sized by the routing), head dimensions other than 64, 80, 96, 112, 128 and 256, and devices
//! before Ampere.

mod attention;
mod cgraph;
mod compute;
mod fusion;
pub mod galloc;
mod mat_mul;
mod moe;
mod reserve;
mod sched;

pub use compute::{
    compute_buffer_bytes, device_compute_buffer_bytes, pipeline_compute_buffer_bytes, sched_copies,
    SplitPlace, SCHED_MAX_COPIES,
};

use crate::error::ProfileError;
use crate::graph::{self, LayerOps};
use crate::model::{EngineModel, Mla, Moe};
use crate::op::OpCall;
use crate::setup::{Device, Setup, UbatchShape, Weights};
use crate::sweep::KV_PADDING;
use cupool_kernels::KvType;

/// Which llama.cpp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// Before PR #23907 (release b8833): K/V f16 copies from the pool.
    B8833,
    /// ggml d99724f2: K/V f16 copies in the compute buffer.
    D99724f2,
}

impl Version {
    /// The commit (or release) it models.
    pub fn commit(self) -> &'static str {
        match self {
            Self::B8833 => "b8833",
            Self::D99724f2 => "d99724f2",
        }
    }

    /// Whether flash attention takes the f16 copies of a quantized cache from the pool.
    fn kv_f16_from_pool(self) -> bool {
        self == Self::B8833
    }
}

fn invalid(v: Version, what: String) -> ProfileError {
    ProfileError::unsupported("llama", v.commit(), what)
}

/// The requests of layer `l` of a ubatch.
pub fn layer(v: Version, s: &Setup, u: UbatchShape, l: usize) -> Result<Vec<OpCall>, ProfileError> {
    check(v, &s.model, s.weights, u, s.dev)?;
    Ok(graph::layer(&Llama::of(v, s), &s.model, u, l))
}

/// [`layer`] in parts: the ops before and after the attention, for `n_tokens` tokens and
/// `n_outputs` output rows (unchecked: [`attention`] refuses what [`layer`] does).
pub fn around(
    v: Version,
    s: &Setup,
    n_tokens: usize,
    n_outputs: usize,
    l: usize,
) -> (Vec<OpCall>, Vec<OpCall>) {
    graph::around(&Llama::of(v, s), &s.model, n_tokens, n_outputs, l)
}

/// [`layer`]'s attention for ubatch `u`, between [`around`]'s parts.
pub fn attention(v: Version, s: &Setup, u: UbatchShape) -> Result<Vec<OpCall>, ProfileError> {
    check(v, &s.model, s.weights, u, s.dev)?;
    Ok(graph::attention(
        &Llama::of(v, s),
        &s.model,
        u.n_tokens,
        u.n_kv,
    ))
}

/// The output matrix's requests, on the output rows.
pub fn output(v: Version, s: &Setup, u: UbatchShape) -> Option<OpCall> {
    graph::output(&Llama::of(v, s), &s.model, u)
}

/// Bytes the engine adds to its compute buffer at startup for flash attention: the f16 copies
/// of a quantized cache's K and V over the whole context (`ggml_cuda_flash_attn_ext_get_alloc_size`,
/// each 128-byte aligned after the attention output). The graph allocator reuses one node's
/// space for every layer, so this counts once. None before PR #23907 and for an f16 cache.
pub fn startup_extra_bytes(v: Version, m: &EngineModel, kv: KvType, n_ctx: usize) -> usize {
    if v.kv_f16_from_pool() || kv == KvType::F16 {
        return 0;
    }
    let n_kv = n_ctx.div_ceil(KV_PADDING) * KV_PADDING;
    let one = n_kv * m.kv_dim() * 2;
    2 * (one.div_ceil(128) * 128)
}

fn check(
    v: Version,
    m: &EngineModel,
    weights: Weights,
    u: UbatchShape,
    dev: Device,
) -> Result<(), ProfileError> {
    const HEAD_DIMS: [usize; 6] = [64, 80, 96, 112, 128, 256];
    if dev.cc < 800 || dev.nsm == 0 {
        return Err(invalid(
            v,
            format!(
                "compute capability {}.{} with {} SMs: accepted are devices of compute capability 8.0 or newer",
                dev.cc / 100,
                dev.cc % 100 / 10,
                dev.nsm
            ),
        ));
    }
    if u.n_tokens == 0 || u.n_outputs > u.n_tokens || u.n_kv < u.n_tokens {
        return Err(invalid(v, format!(
            "{} tokens, {} outputs, KV length {}: accepted are 1 or more tokens, 0 to that many outputs and a KV length of at least the tokens",
            u.n_tokens, u.n_outputs, u.n_kv
        )));
    }
    if m.mla.is_some() {
        return Err(invalid(v, "multi-head latent attention (deepseek-v3): mainline's graph for it is not in the sources this profile models; the ik_llama profile models it".into()));
    }
    if m.moe.is_some() && weights == Weights::F16 {
        return Err(invalid(v, "f16 experts go to MMF or to per-expert cuBLAS calls sized by the routing: accepted are q8_0 weights for a mixture-of-experts model".into()));
    }
    if !HEAD_DIMS.contains(&m.head_dim) || m.n_head_kv == 0 || m.n_head % m.n_head_kv != 0 {
        return Err(invalid(v, format!(
            "head dimension {} with {} of {} heads for K/V: accepted are head dimensions {HEAD_DIMS:?} and a whole GQA ratio",
            m.head_dim, m.n_head_kv, m.n_head
        )));
    }
    Ok(())
}

/// llama.cpp's kernels for one version, weight type, cache type and device.
struct Llama {
    v: Version,
    weights: Weights,
    kv: KvType,
    dev: Device,
}

impl LayerOps for Llama {
    fn matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
        self.mul_mat(input, output, n)
    }

    fn gate_up(&self, e: usize, n_ff: usize, n: usize) -> Vec<OpCall> {
        // One column: gate, up and the GLU are one fused vector op (`ggml_cuda_should_fuse_mul_mat_vec_q`).
        if n == 1 && self.weights == Weights::Q8_0 {
            return self
                .matmul(e, n_ff, n)
                .map(mat_mul::fused)
                .into_iter()
                .collect();
        }
        (0..2).filter_map(|_| self.matmul(e, n_ff, n)).collect()
    }

    fn residual_matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
        // One column: the multiply and the residual add of the same shape are one fused
        // vector op (`ggml_cuda_graph_evaluate_and_capture`'s "mul_mat + add", MMVQ with
        // `x_bias`); MMVF takes nothing either way.
        let c = self.matmul(input, output, n)?;
        Some(if n == 1 { mat_mul::fused(c) } else { c })
    }

    fn mla_attention(&self, _: &EngineModel, _: Mla, _: usize, _: usize) -> Vec<OpCall> {
        vec![] // refused by `check`
    }

    fn experts(&self, m: &EngineModel, moe: Moe, n: usize) -> Vec<OpCall> {
        self.mul_mat_id(m, moe, n)
    }

    fn attention(&self, m: &EngineModel, n: usize, n_kv: usize) -> Option<OpCall> {
        self.flash_attn_ext(m, n, n_kv)
    }
}

impl Llama {
    fn of(v: Version, s: &Setup) -> Self {
        Self {
            v,
            weights: s.weights,
            kv: s.kv,
            dev: s.dev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n_tokens: usize, n_kv: usize, n_outputs: usize) -> UbatchShape {
        UbatchShape {
            n_tokens,
            n_kv,
            n_outputs,
        }
    }

    pub(super) fn k(v: Version, weights: Weights, kv: KvType) -> Llama {
        Llama {
            v,
            weights,
            kv,
            dev: Device::H100_SXM,
        }
    }

    fn setup(m: &EngineModel, weights: Weights, kv: KvType, dev: Device) -> Setup {
        Setup {
            model: m.clone(),
            weights,
            kv,
            dev,
        }
    }

    #[test]
    fn bad_inputs_are_refused_and_a_ubatch_without_outputs_stops_early() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let (v, w, kv) = (Version::B8833, Weights::Q8_0, KvType::Q8_0);
        let dev = Device::H100_SXM;
        let err = |r: Result<Vec<OpCall>, ProfileError>| r.unwrap_err().to_string();
        let e = err(layer(v, &setup(&m, w, kv, dev), shape(512, 256, 1), 0));
        assert!(
            e.contains("KV length of at least") && e.contains("b8833"),
            "{e}"
        );
        let old = setup(&m, w, kv, Device::new(750, 40));
        let e = err(layer(v, &old, shape(8, 256, 1), 0));
        assert!(e.contains("8.0 or newer"), "{e}");
        let mut odd = m.clone();
        odd.head_dim = 48;
        let e = err(layer(v, &setup(&odd, w, kv, dev), shape(8, 256, 1), 0));
        assert!(e.contains("head dimensions"), "{e}");
        // The last layer without output rows ends after attention's output projection; with
        // one it runs the fused gate-up (one column) and down projection on it.
        let last = m.n_layer - 1;
        let none = layer(v, &setup(&m, w, kv, dev), shape(512, 1024, 0), last).unwrap();
        let one = layer(v, &setup(&m, w, kv, dev), shape(512, 1024, 1), last).unwrap();
        assert_eq!(one.len() - none.len(), 2);
        assert_eq!(one[..none.len()], none[..]);
        assert!(output(v, &setup(&m, w, kv, dev), shape(512, 1024, 0)).is_none());
        // f16 weights: one output row goes to MMVF, which takes nothing.
        assert!(output(v, &setup(&m, Weights::F16, kv, dev), shape(512, 1024, 1)).is_none());
    }

    #[test]
    fn one_column_s_fused_ops_carry_no_name() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let s = setup(&m, Weights::Q8_0, KvType::Q8_0, Device::H100_SXM);
        let names = |l: usize| -> Vec<&str> {
            layer(Version::D99724f2, &s, shape(1, 256, 1), l)
                .unwrap()
                .iter()
                .flat_map(|c| c.held.iter().map(|r| r.name))
                .collect()
        };
        // Q, K, V, attention's vector kernel (its split buffers), the output projection fused
        // with the residual add, gate-up-GLU fused, down fused with its add.
        let attention = ["dst_tmp", "dst_tmp_meta"];
        let mut want = vec!["MUL_MAT"; 3];
        want.extend(attention);
        want.extend(["", "", ""]);
        assert_eq!(names(0), want);
        // The last layer's output projection feeds `inp_out_ids`' row selection, not the add.
        assert_eq!(names(m.n_layer - 1)[5], "MUL_MAT");
        // Two columns: nothing fused.
        let two = layer(Version::D99724f2, &s, shape(2, 256, 1), 0).unwrap();
        let named = |name: &str| name == "MUL_MAT" || attention.contains(&name);
        assert!(two.iter().all(|c| c.held.iter().all(|r| named(r.name))));
    }

    #[test]
    fn startup_extra_is_the_whole_context_s_copies() {
        let m = EngineModel::preset("phi3-mini").unwrap();
        let v = Version::D99724f2;
        assert_eq!(
            startup_extra_bytes(v, &m, KvType::Q8_0, 20480),
            2 * 20480 * 3072 * 2
        );
        assert_eq!(startup_extra_bytes(v, &m, KvType::F16, 20480), 0);
        assert_eq!(
            startup_extra_bytes(Version::B8833, &m, KvType::Q8_0, 20480),
            0
        );
        // Padded to the KV padding.
        assert_eq!(
            startup_extra_bytes(v, &m, KvType::Q8_0, 20000),
            2 * 20224 * 3072 * 2
        );
    }
}
