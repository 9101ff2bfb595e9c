//! The op order of a layer as llama.cpp-style graphs build it (attention or latent attention,
//! then a dense feed-forward or the experts), shared by every profile: the engines differ in
//! what each op takes from the pool, not in which ops run.

use crate::model::{Arch, EngineModel, Mla, Moe};
use crate::op::OpCall;
use crate::setup::UbatchShape;

/// What one engine's kernels take from the pool for the ops of a layer. A `None` is an op
/// whose kernel takes nothing (ggml's vector kernels, for instance).
pub(crate) trait LayerOps {
    /// `n` columns of `input` values through one matrix of `output` rows.
    fn matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall>;

    /// A projection whose result the residual add takes next, with no op between: the
    /// attention output projection (in every layer but the last, whose rows go through
    /// `inp_out_ids` first) and the feed-forward's down projection. An engine that fuses the
    /// multiply with that add says so here; by default it is [`Self::matmul`].
    fn residual_matmul(&self, input: usize, output: usize, n: usize) -> Option<OpCall> {
        self.matmul(input, output, n)
    }

    /// Llama's Q, K and V projections (Phi-3 has one fused matrix and goes to [`Self::matmul`]).
    fn qkv(&self, m: &EngineModel, n: usize) -> Vec<OpCall> {
        let e = m.n_embd;
        [m.q_dim(), m.kv_dim(), m.kv_dim()]
            .into_iter()
            .filter_map(|out| self.matmul(e, out, n))
            .collect()
    }

    /// Llama's gate and up projections of width `n_ff` (Phi-3 has one matrix of `2 × n_ff`).
    fn gate_up(&self, e: usize, n_ff: usize, n: usize) -> Vec<OpCall> {
        (0..2).filter_map(|_| self.matmul(e, n_ff, n)).collect()
    }

    /// Multi-head latent attention from the normed input to the output projection (the
    /// profiles that model none return nothing; they refuse such models first).
    fn mla_attention(&self, m: &EngineModel, mla: Mla, n: usize, n_kv: usize) -> Vec<OpCall>;

    /// Flash attention of `n` tokens over a padded KV length of `n_kv`.
    fn attention(&self, m: &EngineModel, n: usize, n_kv: usize) -> Option<OpCall>;

    /// The experts of `n` tokens: up, gate and down projections of the experts each token is
    /// routed to. The router (an f32 matrix) and the top-k selection take nothing from the
    /// pool in the engines profiled: cuBLAS reads f32 operands in place, and the selection
    /// kernels are fused (mainline's `topk_moe`) or work in registers (ik_llama.cpp).
    fn experts(&self, m: &EngineModel, moe: Moe, n: usize) -> Vec<OpCall>;

    /// The rows the last layer's feed-forward and the output matrix run on, for a ubatch of
    /// `n_tokens` tokens and `n_outputs` output rows: the output rows (`inp_out_ids`), unless
    /// the engine's graph keeps every row for this ubatch.
    fn rows_after_attention(&self, _m: &EngineModel, _n_tokens: usize, n_outputs: usize) -> usize {
        n_outputs
    }
}

/// Layer `l` of a ubatch: QKV, attention, output projection, then the feed-forward network
/// (dense, or the experts) on the rows that go on: after the last layer's attention only the
/// output rows (`inp_out_ids`); a ubatch without any skips the rest, as ggml skips ops on empty
/// tensors. The ops around the attention, then the attention between them.
pub(crate) fn layer(k: &impl LayerOps, m: &EngineModel, u: UbatchShape, l: usize) -> Vec<OpCall> {
    let (mut calls, after) = around(k, m, u.n_tokens, u.n_outputs, l);
    calls.extend(attention(k, m, u.n_tokens, u.n_kv));
    calls.extend(after);
    calls
}

/// Layer `l`'s ops before its attention and after it, for `n` tokens and `n_outputs` output
/// rows: everything but the attention, which alone sees the KV length (so a run's ubatches of
/// one size share these).
pub(crate) fn around(
    k: &impl LayerOps,
    m: &EngineModel,
    n: usize,
    n_outputs: usize,
    l: usize,
) -> (Vec<OpCall>, Vec<OpCall>) {
    let e = m.n_embd;
    let mut before = Vec::with_capacity(3);
    match (m.mla, m.arch) {
        // Latent attention runs from the normed input: nothing before it.
        (Some(_), _) => {}
        (None, Arch::Phi3) => before.extend(k.matmul(e, m.q_dim() + 2 * m.kv_dim(), n)),
        (None, Arch::Llama | Arch::Qwen3Moe) => before.extend(k.qkv(m, n)),
    }
    let mut calls = Vec::with_capacity(6);
    if m.mla.is_none() {
        if l + 1 == m.n_layer {
            calls.extend(k.matmul(m.q_dim(), e, n));
        } else {
            calls.extend(k.residual_matmul(m.q_dim(), e, n));
        }
    }
    let n = if l + 1 == m.n_layer {
        k.rows_after_attention(m, n, n_outputs)
    } else {
        n
    };
    if n == 0 {
        return (before, calls);
    }
    if let Some(moe) = m.moe.filter(|_| m.is_moe_layer(l)) {
        calls.extend(k.experts(m, moe, n));
        if m.n_ff_shared > 0 {
            calls.extend(k.gate_up(e, m.n_ff_shared, n));
            calls.extend(k.matmul(m.n_ff_shared, e, n));
        }
        return (before, calls);
    }
    match m.arch {
        Arch::Phi3 => calls.extend(k.matmul(e, 2 * m.n_ff, n)),
        Arch::Llama | Arch::Qwen3Moe => calls.extend(k.gate_up(e, m.n_ff, n)),
    }
    calls.extend(k.residual_matmul(m.n_ff, e, n));
    (before, calls)
}

/// A layer's attention of `n` tokens over a padded KV length of `n_kv` (latent attention from
/// the normed input to its output projection).
pub(crate) fn attention(k: &impl LayerOps, m: &EngineModel, n: usize, n_kv: usize) -> Vec<OpCall> {
    match m.mla {
        Some(mla) => k.mla_attention(m, mla, n, n_kv),
        None => k.attention(m, n, n_kv).into_iter().collect(),
    }
}

/// The output matrix on the output rows (nothing without any).
pub(crate) fn output(k: &impl LayerOps, m: &EngineModel, u: UbatchShape) -> Option<OpCall> {
    match k.rows_after_attention(m, u.n_tokens, u.n_outputs) {
        0 => None,
        rows => k.matmul(m.n_embd, m.n_vocab, rows),
    }
}

/// Bytes of `n` columns of `input` values quantized to q8_1 blocks of 32, rows padded to 512
/// values (`MATRIX_ROW_PADDING`): what MMVQ and MMQ quantize the activations into.
pub(crate) fn q8_1_bytes(input: usize, n: usize) -> usize {
    const ROW_PADDING: usize = 512;
    const Q8_1_BLOCK: usize = 36;
    n * input.div_ceil(ROW_PADDING) * ROW_PADDING * Q8_1_BLOCK / 32
}
