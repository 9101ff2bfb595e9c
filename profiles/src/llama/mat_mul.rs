//! llama.cpp's matrix multiplies (`ggml_cuda_mul_mat`, `ggml_cuda_mul_mat_id`): which kernel a
//! multiply goes to (MMVF, MMF, cuBLAS, MMVQ, MMQ) and what that kernel takes from the pool, for
//! the dense projections and the experts (see the module docs of `llama`).

use super::Llama;
use crate::graph;
use crate::model::{EngineModel, Moe};
use crate::op::{req, OpCall, OpKind, Request};
use crate::setup::Weights;

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

const MUL_MAT: &str = "MUL_MAT";
const MUL_MAT_ID: &str = "MUL_MAT_ID";
/// The name of a fused group's requests: none. ggml runs a fused group from
/// `ggml_cuda_graph_evaluate_and_capture` itself, not through `ggml_cuda_compute_forward`,
/// where the op being computed names what the pool is asked for (a recorded trace has no
/// name on them).
const FUSED: &str = "";

/// `call` run as part of a fused group: its requests carry no op name.
pub(super) fn fused(mut call: OpCall) -> OpCall {
    for r in call.held.iter_mut().chain(call.inner.iter_mut()) {
        r.name = FUSED;
    }
    call
}

impl Llama {
    /// `n` columns of `input` values through one matrix of `output` rows (`ggml_cuda_mul_mat`);
    /// `None` where the kernel takes nothing from the pool.
    pub(super) fn mul_mat(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
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

    /// The experts of `n` tokens (`ggml_cuda_mul_mat_id`): gate, up and down over the routed rows.
    pub(super) fn mul_mat_id(&self, m: &EngineModel, moe: Moe, n: usize) -> Vec<OpCall> {
        let (e, ff) = (m.n_embd, moe.n_ff_exp);
        let rows = n * moe.n_expert_used;
        if n <= MMVQ_MAX_BATCH {
            // MMVQ's expert path; one token's gate, up and GLU are one fused op.
            let one = || {
                let held = vec![req(MUL_MAT_ID, graph::q8_1_bytes(e, n))];
                OpCall::new(OpKind::MatMul, held, vec![])
            };
            let mut calls = if n == 1 {
                vec![fused(one())]
            } else {
                vec![one(), one()]
            };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::LayerOps;
    use crate::llama::tests::k;
    use crate::llama::Version;
    use crate::setup::Device;
    use cupool_kernels::KvType;

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
}
