//! ik_llama.cpp's ggml at 8337e4cd: the matrix-multiply paths (cuBLAS for f16 weights, MMQ and
//! MMVQ for q8_0, the fused up-gate and expert ops) and the MMQ/MMVQ constants they read. The
//! dense layers and multi-head latent attention both take them from here.

use crate::graph;
use crate::model::Moe;
use crate::op::{req, OpCall, OpKind, Request};
use crate::setup::{Device, Weights};

/// Bytes of MMQ's q8_1 block of 128 values (`block_q8_1_mmq`).
const Q8_1_MMQ_BLOCK: usize = 144;
/// MMQ's largest column tile and its row tile on NVIDIA GPUs with int8 tensor cores.
const MMQ_X_MAX: usize = 128;
pub(super) const MMQ_Y: usize = 128;
/// The tail MMQ's q8_1 activations carry: a block for each of the largest tile's columns.
pub(super) const MMQ_TAIL: usize = MMQ_X_MAX * Q8_1_MMQ_BLOCK;
/// MMVQ serves batches up to this many columns.
pub(super) const MMVQ_MAX_BATCH: usize = 8;

const MUL_MAT: &str = "MUL_MAT";
const FUSED_UP_GATE: &str = "FUSED_UP_GATE";
const MOE: &str = "MOE_FUSED_UP_GATE";

/// The matrix-multiply paths of one weight type on one device.
pub(super) struct MatMul {
    weights: Weights,
    dev: Device,
}

impl MatMul {
    /// The paths of `weights` on `dev`.
    pub(super) fn new(weights: Weights, dev: Device) -> Self {
        Self { weights, dev }
    }

    /// `n` columns of `input` values through a matrix of `output` rows.
    pub(super) fn single(&self, input: usize, output: usize, n: usize) -> OpCall {
        match self.weights {
            Weights::F16 => OpCall::new(
                OpKind::MatMul,
                vec![req(MUL_MAT, n * input * 2), req(MUL_MAT, n * output * 2)],
                vec![],
            ),
            Weights::Q8_0 => self.quantized(MUL_MAT, input, 1, n),
        }
    }

    /// `launches` matrices over the same activations, quantized once (Q, K and V).
    pub(super) fn shared_input(&self, input: usize, launches: usize, n: usize) -> OpCall {
        self.quantized(MUL_MAT, input, launches, n)
    }

    /// Gate and up as one op: an f32 result of `n × n_ff` held beside the activations.
    pub(super) fn fused_up_gate(&self, input: usize, n_ff: usize, n: usize) -> OpCall {
        let mut c = self.quantized(FUSED_UP_GATE, input, 2, n);
        c.held.insert(0, req(FUSED_UP_GATE, n * n_ff * 4));
        c
    }

    /// `MOE_FUSED_UP_GATE` (`ggml_cuda_moe_up_gate_unary`) with the down projection that
    /// follows it fused in. Up to 8 tokens: the activations quantized for MMVQ, then the
    /// up/gate result quantized for the down projection. Beyond, on MMQ's expert path: the
    /// routing ids (`ids_src1`, `ids_dst`, `expert_bounds` in one buffer) and the activations
    /// quantized once per routed row held over the op; inside it, first the up and gate results
    /// (f32, a stream-k fixup per launch), then the down projection's own ids and quantized
    /// input (`ggml_cuda_mul_mat_q_id` without precomputed ones) and its fixup.
    pub(super) fn fused_experts(&self, e: usize, moe: Moe, n: usize) -> OpCall {
        let used = moe.n_expert_used;
        let rows = n * used;
        if n <= MMVQ_MAX_BATCH {
            return OpCall::new(
                OpKind::MatMul,
                vec![req(MOE, graph::q8_1_bytes(e, n))],
                vec![req(MOE, graph::q8_1_bytes(moe.n_ff_exp, rows))],
            );
        }
        let tail = MMQ_X_MAX * Q8_1_MMQ_BLOCK;
        let fixup = |out: usize| self.id_fixup(out, moe.n_expert, n);
        let up_gate = OpCall::new(
            OpKind::MatMul,
            vec![req(MOE, rows * moe.n_ff_exp * 4); 2],
            [fixup(moe.n_ff_exp), fixup(moe.n_ff_exp)]
                .into_iter()
                .flatten()
                .collect(),
        );
        let down = OpCall::new(
            OpKind::MatMul,
            vec![
                req(MOE, rows * 4),
                req(MOE, rows * 4),
                req(MOE, (moe.n_expert + 1) * 4),
                req(MOE, graph::q8_1_bytes(moe.n_ff_exp, rows) + tail),
            ],
            fixup(e).into_iter().collect(),
        );
        let mut op = OpCall::new(
            OpKind::MatMul,
            vec![
                req(MOE, (2 * rows + moe.n_expert + 1) * 4),
                req(MOE, graph::q8_1_bytes(e, rows) + tail),
            ],
            vec![],
        );
        op.nested = vec![up_gate, down];
        op
    }

    /// The stream-k fixup of one MMQ expert launch (`launch_mul_mat_q_id`): `nsm` blocks, and
    /// a buffer only when they do not divide the tiles (column tiles × row tiles × experts).
    fn id_fixup(&self, out: usize, n_expert: usize, n: usize) -> Option<Request> {
        let x = mmq_x(n);
        let tiles = n.div_ceil(x) * out.div_ceil(MMQ_Y) * n_expert;
        (tiles % self.dev.nsm != 0).then(|| req(MOE, self.dev.nsm * x * MMQ_Y * 4))
    }

    fn quantized(&self, name: &'static str, input: usize, launches: usize, n: usize) -> OpCall {
        let act = graph::q8_1_bytes(input, n);
        if n <= MMVQ_MAX_BATCH {
            return OpCall::new(OpKind::MatMul, vec![req(name, act)], vec![]);
        }
        let fixup = self.dev.nsm * mmq_x(n) * MMQ_Y * 4;
        OpCall::new(
            OpKind::MatMul,
            vec![req(name, act + MMQ_X_MAX * Q8_1_MMQ_BLOCK)],
            vec![req(name, fixup); launches],
        )
    }
}

/// MMQ's column tile for `n` columns: the smallest (in steps of 8, of 16 from 48 on) that needs
/// no more passes over the columns than the largest tile.
pub(super) fn mmq_x(n: usize) -> usize {
    let mut best = (usize::MAX, 0);
    let mut x = 8;
    while x <= MMQ_X_MAX && best.0 > 1 {
        let granularity = if x >= 48 { 16 } else { 8 };
        if x % granularity == 0 {
            let parts = n.div_ceil(x);
            if parts < best.0 {
                best = (parts, x);
            }
        }
        x += 8;
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmq_tiles_follow_the_engine_s_search() {
        assert_eq!(mmq_x(512), 128);
        assert_eq!(mmq_x(1), 8);
        assert_eq!(mmq_x(100), 112); // one pass: the first tile of at least 100 in steps of 16
        assert_eq!(mmq_x(129), 80); // two passes: 80 is the first tile that needs only two
        assert_eq!(mmq_x(40), 40);
    }
}
