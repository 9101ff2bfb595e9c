//! llama.cpp (mainline ggml), dense models, CUDA devices of compute capability 8.0 or newer,
//! flash attention on. Two versions:
//!
//! - [`Version::D99724f2`] (the `llama` profile): ggml at d99724f2 (2026-08-21), after PR
//!   #23907. A quantized cache's f16 copies of K and V live in the compute buffer, sized at
//!   startup for the whole context ([`startup_extra_bytes`]), not in the pool.
//! - [`Version::B8833`] (the `llama-b8833` profile, the Windows 7 report's build): the same
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
//!   `dst_tmp` and a `dst_tmp_meta` when it splits the KV length).
//!
//! Occupancy: ggml reads it from the compiled kernel (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`).
//! [`Device::occupancy`] gives it; by default the profile takes what that call returned for
//! d99724f2's kernels built for sm_90 on an H100 (`scripts/llama/fattn_occupancy.cu`,
//! docs/data/h100-2026-11-22-fattn-occupancy): 2 blocks per SM for every MMA configuration
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
//! Not modelled, refused with a message: f16 experts (MMF's expert path, or cuBLAS per expert
//! sized by the routing), head dimensions other than 64, 80, 96, 112, 128 and 256, and devices
//! before Ampere.

use super::graph::{self, LayerOps};
use super::{Device, EngineModel, Mla, Moe, OpCall, OpKind, Request, Setup, UbatchShape, Weights};
use crate::error::RuntimeError;
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

/// MMVQ serves batches up to this many columns (`MMVQ_MAX_BATCH_SIZE`).
const MMVQ_MAX_BATCH: usize = 8;
/// MMF serves f16 weights up to this many columns.
const MMF_MAX_BATCH: usize = 16;
/// MMF's row block (`MMF_ROWS_PER_BLOCK`) and its input granularity (a warp of half2).
const MMF_ROWS_PER_BLOCK: usize = 32;
const MMF_INPUT_MULTIPLE: usize = 64;
/// MMQ's row tile for q8_0 on NVIDIA GPUs with int8 tensor cores (`mmq-config-ampere.cuh`).
const MMQ_I: usize = 128;
/// Bytes of MMQ's q8_1 block of 128 values (`block_q8_1_mmq`).
const Q8_1_MMQ_BLOCK: usize = 144;
/// The column tiles `mmq-config-ampere.cuh` has for q8_0: all rows in whole tiles, and the
/// fallback kernel for a row count that is not a multiple of 128.
const MMQ_J: [usize; 11] = [8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128];
const MMQ_J_FALLBACK: [usize; 5] = [8, 16, 32, 64, 128];
/// The KV tile bounds from the mask, from this batch size on.
const KV_MAX_FROM: usize = 1024;
/// Compute capability of Ada Lovelace: from it on the MMA kernel always runs stream-k.
const CC_ADA: u32 = 890;

fn invalid(v: Version, what: String) -> RuntimeError {
    RuntimeError::Invalid(format!("the llama ({}) profile: {what}", v.commit()))
}

/// The requests of layer `l` of a ubatch.
pub fn layer(v: Version, s: &Setup, u: UbatchShape, l: usize) -> Result<Vec<OpCall>, RuntimeError> {
    check(v, &s.model, s.weights, u, s.dev)?;
    Ok(graph::layer(&Llama::of(v, s), &s.model, u, l))
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
    let n_kv = n_ctx.div_ceil(super::KV_PADDING) * super::KV_PADDING;
    let one = n_kv * m.kv_dim() * 2;
    2 * (one.div_ceil(128) * 128)
}

fn check(
    v: Version,
    m: &EngineModel,
    weights: Weights,
    u: UbatchShape,
    dev: Device,
) -> Result<(), RuntimeError> {
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

const MUL_MAT: &str = "MUL_MAT";
const MUL_MAT_ID: &str = "MUL_MAT_ID";

impl LayerOps for Llama {
    fn matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
        match self.weights {
            Weights::F16 => {
                let mmf = input % MMF_INPUT_MULTIPLE == 0 && output % MMF_ROWS_PER_BLOCK == 0;
                (n > 1 && !(mmf && n <= MMF_MAX_BATCH)).then(|| {
                    OpCall::new(
                        OpKind::MatMul,
                        vec![req(MUL_MAT, n * input * 2), req(MUL_MAT, n * output * 2)],
                        vec![],
                    )
                })
            }
            Weights::Q8_0 if n <= MMVQ_MAX_BATCH => Some(OpCall::new(
                OpKind::MatMul,
                vec![req(MUL_MAT, graph::q8_1_bytes(input, n))],
                vec![],
            )),
            Weights::Q8_0 => Some(self.mmq(input, output, n)),
        }
    }

    fn gate_up(&self, e: usize, n_ff: usize, n: usize) -> Vec<OpCall> {
        // One column: gate, up and the GLU are one fused vector op (`ggml_cuda_should_fuse_mul_mat_vec_q`).
        let fused = n == 1 && self.weights == Weights::Q8_0;
        let ops = if fused { 1 } else { 2 };
        (0..ops).filter_map(|_| self.matmul(e, n_ff, n)).collect()
    }

    fn mla_attention(&self, _: &EngineModel, _: Mla, _: usize, _: usize) -> Vec<OpCall> {
        vec![] // refused by `check`
    }

    fn experts(&self, m: &EngineModel, moe: Moe, n: usize) -> Vec<OpCall> {
        let (e, ff) = (m.n_embd, moe.n_ff_exp);
        let rows = n * moe.n_expert_used;
        if n <= MMVQ_MAX_BATCH {
            // MMVQ's expert path; one token's gate, up and GLU are one fused op.
            let gate_up = if n == 1 { 1 } else { 2 };
            let mut calls: Vec<OpCall> = (0..gate_up)
                .map(|_| {
                    let held = vec![req(MUL_MAT_ID, graph::q8_1_bytes(e, n))];
                    OpCall::new(OpKind::MatMul, held, vec![])
                })
                .collect();
            let held = vec![req(MUL_MAT_ID, graph::q8_1_bytes(ff, rows))];
            calls.push(OpCall::new(OpKind::MatMul, held, vec![]));
            return calls;
        }
        vec![
            self.mmq_id(e, ff, 1, moe, n),
            self.mmq_id(e, ff, 1, moe, n),
            self.mmq_id(ff, e, moe.n_expert_used, moe, n),
        ]
    }

    fn attention(&self, m: &EngineModel, n: usize, n_kv: usize) -> Option<OpCall> {
        let mut held = Vec::with_capacity(4);
        if self.v.kv_f16_from_pool() && self.kv != KvType::F16 {
            held.push(req("K_f16", n_kv * m.kv_dim() * 2));
            held.push(req("V_f16", n_kv * m.kv_dim() * 2));
        }
        if self.vector_kernel(m, n, n_kv) {
            held.extend(self.vector_split(m, n, n_kv));
        } else {
            held.extend(self.mma_stream_k(m, n, n_kv));
        }
        (!held.is_empty()).then_some(OpCall::new(OpKind::FlashAttention, held, vec![]))
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

    /// MMQ for `n` columns: the q8_1 activations held, a fixup when needed.
    fn mmq(&self, input: usize, output: usize, n: usize) -> OpCall {
        let fallback = output % MMQ_I != 0;
        let held = vec![req(
            MUL_MAT,
            graph::q8_1_bytes(input, n) + j_max(n, fallback) * Q8_1_MMQ_BLOCK,
        )];
        let inner = self.mmq_fixup(MUL_MAT, output, n, 1).into_iter().collect();
        OpCall::new(OpKind::MatMul, held, inner)
    }

    /// MMQ's expert path (`ggml_cuda_mul_mat_q` with ids) for `n` tokens: the routing
    /// (`ids_src1`, `ids_dst`, `expert_bounds`) and the activations of every routed row held, a
    /// fixup when needed. `ne11` is the input's rows per token (1 for up and gate, which read
    /// each token once; the used experts for down): the q8_1 tail is sized by it.
    fn mmq_id(&self, input: usize, output: usize, ne11: usize, moe: Moe, n: usize) -> OpCall {
        let rows = n * moe.n_expert_used;
        let fallback = output % MMQ_I != 0;
        let held = vec![
            req(MUL_MAT_ID, rows * 4),
            req(MUL_MAT_ID, rows * 4),
            req(MUL_MAT_ID, (moe.n_expert + 1) * 4),
            req(
                MUL_MAT_ID,
                graph::q8_1_bytes(input, rows) + j_max(ne11, fallback) * Q8_1_MMQ_BLOCK,
            ),
        ];
        let inner = self
            .mmq_fixup(MUL_MAT_ID, output, n, moe.n_expert)
            .into_iter()
            .collect();
        OpCall::new(OpKind::MatMul, held, inner)
    }

    /// `launch_mul_mat_q`'s stream-k fixup for `output` rows, `n` columns and `channels`
    /// matrices (experts): the tile `J` that needs the fewest passes over the columns, one
    /// block per tile when the tiles fill 90% of their waves over the SMs, else one per SM; a
    /// buffer only when the blocks do not divide the tiles.
    fn mmq_fixup(
        &self,
        name: &'static str,
        output: usize,
        n: usize,
        channels: usize,
    ) -> Option<Request> {
        let tiles: &[usize] = if output % MMQ_I != 0 {
            &MMQ_J_FALLBACK
        } else {
            &MMQ_J
        };
        // mul_mat_q_switch_J: the smallest tile that needs the fewest passes over the columns.
        let mut best = (usize::MAX, 0);
        for &j in tiles {
            if best.0 <= 1 {
                break;
            }
            let passes = n.div_ceil(j);
            if passes < best.0 {
                best = (passes, j);
            }
        }
        let (ntx, j) = best;
        let ntiles = output.div_ceil(MMQ_I) * ntx * channels;
        let nsm = self.dev.nsm;
        let waves = ntiles.div_ceil(nsm);
        let blocks = if 100 * ntiles / (nsm * waves) >= 90 {
            ntiles
        } else {
            nsm
        };
        (ntiles % blocks != 0).then(|| req(name, blocks * j * MMQ_I * 4))
    }

    /// ggml_cuda_get_best_fattn_kernel on a device with tensor cores: the vector kernel for one
    /// column (two with a quantized cache from Ada on), else the MMA kernel.
    fn vector_kernel(&self, m: &EngineModel, n: usize, n_kv: usize) -> bool {
        let d = m.head_dim;
        if d > 256 || d % 64 != 0 {
            return false;
        }
        let gqa = m.n_head / m.n_head_kv;
        let ada = self.dev.cc >= CC_ADA;
        let by_type = if self.kv == KvType::F16 {
            ada && n == 1 && !(gqa > 4 && n_kv >= 8192)
        } else if ada {
            n <= 2
        } else {
            n == 1
        };
        // The GQA-optimized MMA kernel needs a GQA ratio of 2 or more.
        by_type || (gqa < 2 && n == 1)
    }

    /// The MMA kernel's `KV_max` and stream-k `dst_tmp_meta`.
    fn mma_stream_k(&self, m: &EngineModel, n: usize, n_kv: usize) -> Vec<Request> {
        let gqa = m.n_head / m.n_head_kv;
        let ncols2 = match gqa {
            g if g > 4 => 8,
            g if g > 2 => 4,
            g if g > 1 => 2,
            _ => 1,
        };
        let ncols1 = [8, 16, 32]
            .into_iter()
            .map(|c| c / ncols2)
            .find(|&c| n <= c)
            .unwrap_or(64 / ncols2);
        let (occupancy, nbatch_fa) = mma_config(m.head_dim, ncols1 * ncols2);
        let occupancy = self.dev.occupancy.unwrap_or(occupancy);
        let ntiles_x = n.div_ceil(ncols1);
        let ntiles_dst = ntiles_x * gqa.div_ceil(ncols2) * m.n_head_kv;
        let mut out = Vec::with_capacity(2);
        if n >= KV_MAX_FROM {
            out.push(req("KV_max", ntiles_x * 4));
        }
        let max_blocks = occupancy * self.dev.nsm;
        let waves = ntiles_dst.div_ceil(max_blocks);
        let efficiency = 100 * ntiles_dst / (max_blocks * waves);
        let mut blocks = ntiles_dst;
        if self.dev.cc >= CC_ADA || efficiency < 75 {
            let raw = max_blocks.min(n_kv.div_ceil(nbatch_fa) * ntiles_dst);
            let rounded = raw / ntiles_dst * ntiles_dst;
            let loss = if rounded > 0 {
                100 * (raw - rounded) / raw
            } else {
                100
            };
            blocks = if loss <= 5 { rounded } else { raw };
        }
        if ntiles_dst % blocks != 0 {
            let dv = m.head_dim;
            out.push(req(
                "dst_tmp_meta",
                blocks * ncols1 * ncols2 * (2 + dv / 2) * 8,
            ));
        }
        out
    }

    /// The vector kernel's parallel blocks over the KV length: `dst_tmp` and `dst_tmp_meta`
    /// when it splits.
    fn vector_split(&self, m: &EngineModel, n: usize, n_kv: usize) -> Vec<Request> {
        let d = m.head_dim;
        let cols = if n == 1 { 1 } else { 2 };
        let ntiles_dst = n.div_ceil(cols) * m.n_head;
        let ntiles_kv = n_kv.div_ceil(d);
        let occupancy = self
            .dev
            .occupancy
            .unwrap_or_else(|| vec_occupancy(self.dev.cc, d, self.kv));
        let per_wave = self.dev.nsm * occupancy;
        let first = occupancy.min(ntiles_kv);
        let (mut pb, mut waves_best, mut eff_best) = (first, 0, 0);
        for test in first..=ntiles_kv {
            let total = ntiles_dst * test;
            let waves = total.div_ceil(per_wave);
            let eff = 100 * total / (waves * per_wave);
            if eff_best >= 95 && waves > waves_best {
                break;
            }
            if eff > eff_best {
                (waves_best, eff_best, pb) = (waves, eff, test);
            }
        }
        if pb <= 1 {
            return vec![];
        }
        vec![
            req("dst_tmp", pb * d * m.n_head * n * 4),
            req("dst_tmp_meta", pb * m.n_head * n * 8),
        ]
    }
}

/// The MMA kernel's launch bound (blocks per SM) and KV tile (`nbatch_fa`) on Ampere and newer
/// (`ggml_cuda_fattn_mma_get_config_ampere`), for the head sizes the profile accepts.
/// The vector kernel's blocks per SM: as measured on compute capability 9.0 (see the module
/// docs), else its launch bound.
fn vec_occupancy(cc: u32, head_dim: usize, kv: KvType) -> usize {
    match (cc, head_dim, kv) {
        (900, 128, KvType::F16) => 3,
        (900, 128, _) => 2,
        (900, 64, KvType::Q8_0) => 4,
        _ => 1,
    }
}

/// `ggml_cuda_mmq_get_J_max`: the largest column tile of at most `ne11` columns (capped at
/// 512), 0 below the smallest: the q8_1 buffer's tail is this many MMQ blocks.
fn j_max(ne11: usize, fallback: bool) -> usize {
    let tiles: &[usize] = if fallback { &MMQ_J_FALLBACK } else { &MMQ_J };
    let cap = ne11.min(512) / 8 * 8;
    tiles
        .iter()
        .copied()
        .filter(|&j| j <= cap)
        .max()
        .unwrap_or(0)
}

fn mma_config(head_dim: usize, ncols: usize) -> (usize, usize) {
    match (head_dim, ncols) {
        (256, 8) => (4, 64),
        (256, 16) => (4, 32),
        (256, _) => (2, 32),
        (_, 8) => (2, 128),
        _ => (2, 64),
    }
}

fn req(name: &'static str, bytes: usize) -> Request {
    Request { name, bytes }
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

    fn k(v: Version, weights: Weights, kv: KvType) -> Llama {
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
        let err = |r: Result<Vec<OpCall>, RuntimeError>| r.unwrap_err().to_string();
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
    fn mmq_follows_the_engine_s_tiles_and_fixup() {
        let q = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        // 512 columns, 4096 rows: J = 128 (4 passes), 32 × 4 = 128 tiles on 132 SMs fill 96%
        // of a wave: one block per tile, no fixup. The activations: 512 × 4096 × 36/32 plus
        // 128 × 144 of tail.
        let c = q.mmq(4096, 4096, 512);
        assert_eq!(c.held[0].bytes, 512 * 4096 * 36 / 32 + 128 * 144);
        assert!(c.inner.is_empty());
        // 1024 rows: 8 × 4 = 32 tiles fill 24%: 132 stream-k blocks, 32 % 132 ≠ 0: a fixup of
        // 132 × 128 × 128 floats.
        let c = q.mmq(4096, 1024, 512);
        assert_eq!(c.inner[0].bytes, 132 * 128 * 128 * 4);
        // 100 columns: J_max 96, J 112 (one pass). Fallback rows (32064 % 128 ≠ 0): J_max 64,
        // J 128.
        let c = q.mmq(3072, 3072, 100);
        assert_eq!(c.held[0].bytes, 100 * 3072 * 36 / 32 + 96 * 144);
        assert_eq!(c.inner[0].bytes, 132 * 112 * 128 * 4);
        let c = q.mmq(3072, 32064, 100);
        assert_eq!(c.held[0].bytes, 100 * 3072 * 36 / 32 + 64 * 144);
    }

    #[test]
    fn f16_weights_take_cublas_buffers_only_beyond_the_vector_kernels() {
        let f = k(Version::D99724f2, Weights::F16, KvType::Q8_0);
        assert!(f.matmul(4096, 4096, 1).is_none()); // MMVF
        assert!(f.matmul(4096, 4096, 16).is_none()); // MMF
        let c = f.matmul(4096, 1024, 17).unwrap();
        assert_eq!(c.held[0].bytes, 17 * 4096 * 2);
        assert_eq!(c.held[1].bytes, 17 * 1024 * 2);
        // MMF needs inputs in whole warps of half2: 3000 values go to cuBLAS.
        assert!(f.matmul(3000, 4096, 4).is_some());
    }

    #[test]
    fn the_two_versions_differ_only_in_the_kv_copies() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        for (n, n_kv) in [(512usize, 8192usize), (4096, 16384), (1, 4096), (3, 768)] {
            let old = k(Version::B8833, Weights::F16, KvType::Q8_0)
                .attention(&m, n, n_kv)
                .unwrap();
            let new = k(Version::D99724f2, Weights::F16, KvType::Q8_0).attention(&m, n, n_kv);
            let names: Vec<_> = old.held.iter().take(2).map(|r| r.name).collect();
            assert_eq!(names, ["K_f16", "V_f16"]);
            assert_eq!(old.held[0].bytes, n_kv * 1024 * 2);
            assert_eq!(
                old.held[2..],
                new.map(|c| c.held).unwrap_or_default()[..],
                "n {n}"
            );
        }
        // An f16 cache needs no copies in either.
        let old = k(Version::B8833, Weights::F16, KvType::F16).attention(&m, 512, 8192);
        let new = k(Version::D99724f2, Weights::F16, KvType::F16).attention(&m, 512, 8192);
        assert_eq!(old, new);
    }

    #[test]
    fn stream_k_meta_only_for_fractional_tiles() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let a = k(Version::D99724f2, Weights::F16, KvType::Q8_0);
        // 512 tokens, GQA 4: ncols2 4, ncols1 16, 32 × 8 = 256 tiles; 2 × 132 = 264 blocks,
        // rounded down to 256 loses 3%: one block per tile, no meta.
        assert!(a.mma_stream_k(&m, 512, 8192).is_empty());
        // 4096 tokens: 2048 tiles; 264 blocks do not divide them: meta for 264 × 64 columns,
        // and KV_max for the 256 column tiles.
        let r = a.mma_stream_k(&m, 4096, 8192);
        assert_eq!(r[0], req("KV_max", 256 * 4));
        assert_eq!(r[1], req("dst_tmp_meta", 264 * 64 * (2 + 64) * 8));
        // Phi-3 (no GQA, head 96): 512 tokens, 8 × 32 = 256 tiles, same rounding: none.
        let phi = EngineModel::preset("phi3-mini").unwrap();
        assert!(a.mma_stream_k(&phi, 512, 8192).is_empty());
        // A given occupancy changes the block count: 3 × 132 = 396 → rounded 256 loses 35%:
        // 396 blocks, meta.
        let mut b = k(Version::D99724f2, Weights::F16, KvType::Q8_0);
        b.dev.occupancy = Some(3);
        assert_eq!(
            b.mma_stream_k(&m, 512, 8192),
            [req("dst_tmp_meta", 396 * 64 * 66 * 8)]
        );
    }

    #[test]
    fn decode_goes_to_the_vector_kernel_where_ggml_sends_it() {
        let llama = EngineModel::preset("llama3-8b").unwrap();
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let q = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        assert!(q.vector_kernel(&llama, 1, 4096));
        assert!(q.vector_kernel(&llama, 2, 4096));
        assert!(!q.vector_kernel(&llama, 3, 4096));
        // Head 96: no vector instance.
        assert!(!q.vector_kernel(&phi, 1, 4096));
        // 32 heads, 4096 positions / 128 = 32 KV tiles, 2 blocks per SM (measured on an H100
        // for a q8_0 cache): 8 parallel blocks fill 97% of a wave.
        let r = q.vector_split(&llama, 1, 4096);
        assert_eq!(r[0], req("dst_tmp", 8 * 128 * 32 * 4));
        assert_eq!(r[1], req("dst_tmp_meta", 8 * 32 * 8));
        // At the launch bound (1 block per SM, as on another device) 4 fill 97% of a wave.
        let mut one = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        one.dev.occupancy = Some(1);
        let r = one.vector_split(&llama, 1, 4096);
        assert_eq!(r[0], req("dst_tmp", 4 * 128 * 32 * 4));
    }

    #[test]
    fn experts_take_mmvq_or_mmq_s_expert_path() {
        let m = EngineModel::preset("qwen3-30b-a3b").unwrap();
        let moe = m.moe.unwrap();
        let q = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        let bytes = |c: &OpCall| c.held.iter().map(|r| r.bytes).collect::<Vec<_>>();
        // One token: gate and up fused, then down over the 8 routed rows.
        let one = q.experts(&m, moe, 1);
        assert_eq!(
            one.iter().map(bytes).collect::<Vec<_>>(),
            [vec![2304], vec![8 * 1152]]
        );
        // Four tokens: gate and up each quantize the 4 tokens.
        let four = q.experts(&m, moe, 4);
        assert_eq!(four.len(), 3);
        assert_eq!(bytes(&four[0]), [4 * 2304]);
        assert_eq!(bytes(&four[2]), [32 * 1152]);
        // 512 tokens, 4096 routed rows: ids, bounds and the activations; the up/gate tail is
        // empty (one input row per token), down's is 8 columns. 6 × 4 × 128 and 16 × 4 × 128
        // tiles fill 96% and 98% of their waves: no fixup.
        let full = q.experts(&m, moe, 512);
        assert_eq!(
            bytes(&full[0]),
            [4096 * 4, 4096 * 4, 129 * 4, 4096 * 2048 * 36 / 32]
        );
        assert_eq!(
            bytes(&full[2]),
            [4096 * 4, 4096 * 4, 129 * 4, 4096 * 1024 * 36 / 32 + 8 * 144]
        );
        assert!(full.iter().all(|c| c.inner.is_empty()));
        // 100 tokens: J 112, 6 × 1 × 128 = 768 tiles fill 96% of 6 waves: none either. On an
        // A100's 108 SMs they fill 88% of 8: 108 stream-k blocks, and up and gate take a fixup.
        assert!(q.experts(&m, moe, 100).iter().all(|c| c.inner.is_empty()));
        let mut a100 = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        a100.dev = Device::new(800, 108);
        let c = a100.experts(&m, moe, 100);
        assert_eq!(c[0].inner, [req(MUL_MAT_ID, 108 * 112 * 128 * 4)]);
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
