//! A mixture-of-experts layer's feed-forward network as mainline 0c1e5709's `build_moe_ffn`
//! (`src/llama-graph.cpp`) builds it for qwen3moe: softmax gating, the top `n_expert_used`
//! experts, their weights normalized (`norm_w`), no weight scale, separate gate and up
//! experts, SwiGLU, the weighted down projection summed over the used experts by views and
//! adds. The tensors, their sources and the two `ggml_build_forward_expand` calls the engine
//! makes (the routing weights, then the weighted experts, then each view and add) are the
//! engine's, so that ggml-alloc and the CUDA backend's fusion matching (`fusion.rs`) see its
//! nodes in its order.

use super::cgraph::{Ctx, Home, Op, Ty};
use crate::model::Moe;

/// The experts' output (`ffn_moe_out`, f32 `[n_embd, n_tokens]`) for `cur`, the layer's
/// normed FFN input, on device `dev`.
pub(crate) fn ffn(c: &mut Ctx, moe: Moe, dev: usize, cur: usize) -> usize {
    let [e, n, ..] = c.t[cur].ne;
    let (n_exp, used, ff) = (moe.n_expert, moe.n_expert_used, moe.n_ff_exp);
    let w = |c: &mut Ctx, ne: [usize; 4]| c.new_tensor(Home::Weight(dev), Ty::F16, ne);
    // the router: logits, softmax, the top experts (an argsort viewed to its first columns)
    let gate_inp = w(c, [e, n_exp, 1, 1]);
    let logits = c.mul_mat(gate_inp, cur);
    let probs = c.unary(Op::SoftMax, logits, &[logits]);
    let sorted = c.op(Op::ArgSort, Ty::I32, [n_exp, n, 1, 1], &[probs]);
    let nb = c.t[sorted].nb;
    let selected = c.view_at(sorted, [used, n, 1, 1], nb, 0);
    // the selected experts' probabilities, normalized to sum to one per token
    let probs3 = c.reshape(probs, [1, n_exp, n, 1]);
    let weights = c.op(Op::GetRows, Ty::F32, [1, used, n, 1], &[probs3, selected]);
    let weights = c.reshape(weights, [used, n, 1, 1]);
    let sum = c.op(Op::SumRows, Ty::F32, [1, n, 1, 1], &[weights]);
    let sum = c.unary(Op::Clamp, sum, &[sum]);
    let weights = c.unary(Op::Div, weights, &[weights, sum]);
    let weights = c.reshape(weights, [1, used, n, 1]);
    // "call early so that topk-moe can be used"
    c.expand(weights);
    let x = c.reshape(cur, [e, 1, n, 1]);
    let up_exps = w(c, [e, ff, n_exp, 1]);
    let up = c.mul_mat_id(up_exps, x, selected);
    let gate_exps = w(c, [e, ff, n_exp, 1]);
    let gate = c.mul_mat_id(gate_exps, x, selected);
    let glu = c.unary(Op::Glu, gate, &[gate, up]);
    let down_exps = w(c, [ff, e, n_exp, 1]);
    let down = c.mul_mat_id(down_exps, glu, selected);
    let experts = c.unary(Op::Mul, down, &[down, weights]);
    c.expand(experts);
    // each used expert's rows as a view, the views expanded before the adds
    let nb = c.t[experts].nb;
    let views: Vec<usize> = (0..used)
        .map(|i| {
            let v = c.view_at(
                experts,
                [e, n, 1, 1],
                [nb[0], nb[2], nb[2] * n, nb[2] * n],
                i * nb[1],
            );
            c.expand(v);
            v
        })
        .collect();
    let mut out = views[0];
    for &v in &views[1..] {
        out = c.unary(Op::Add, out, &[out, v]);
        c.expand(out);
    }
    out
}
