//! A model's GGUF as llama.cpp's converter writes it: the metadata keys of its architecture
//! and its tensors with their shapes (ggml order: columns first).

use super::writer::{Writer, F32};

/// A model's numbers as its config gives them.
#[derive(Clone, Debug)]
pub struct Dims {
    pub arch: &'static str,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    /// The output matrix is the embedding's (no `output.weight`).
    pub tied: bool,
    /// Write `attention.key_length` (Qwen3 and DeepSeek files do; Llama and Phi-3 files not).
    pub key_length: bool,
    /// (experts, used per token, an expert's FFN width).
    pub moe: Option<(u64, u64, u64)>,
    pub n_dense_lead: u64,
    pub n_shared_experts: u64,
    /// (q_lora, kv_lora, rope, v_head).
    pub mla: Option<(u64, u64, u64, u64)>,
    /// MLA as mainline converts it since 2025: one KV head, the latent widths in
    /// `key_length`/`value_length`, the heads' in `*_mla`, K's and V's decompression split.
    pub mla_mqa: bool,
}

impl Dims {
    /// `[layers, embedding, heads, KV heads, head width, FFN width, vocabulary]`.
    pub fn dense(arch: &'static str, [l, e, h, kv, d, ff, v]: [u64; 7]) -> Self {
        Self {
            arch,
            n_layer: l,
            n_embd: e,
            n_head: h,
            n_head_kv: kv,
            head_dim: d,
            n_ff: ff,
            n_vocab: v,
            tied: false,
            key_length: false,
            moe: None,
            n_dense_lead: 0,
            n_shared_experts: 0,
            mla: None,
            mla_mqa: false,
        }
    }
}

/// The metadata and tensors of `d`, matrix weights of type `ty`; the tokenizer's tokens when
/// `tokens` (a real file has them; leaving them out keeps a property test's files small).
pub fn write(d: &Dims, ty: u32, tokens: bool) -> Writer {
    let mut w = Writer::new();
    let a = d.arch;
    let k = |s: &str| format!("{a}.{s}");
    w.str("general.architecture", a)
        .str("general.name", &format!("test {a}"));
    w.u32(&k("block_count"), d.n_layer as u32)
        .u32(&k("context_length"), 4096)
        .u32(&k("embedding_length"), d.n_embd as u32)
        .u32(&k("feed_forward_length"), d.n_ff as u32)
        .u32(&k("attention.head_count"), d.n_head as u32)
        .f32(&k("attention.layer_norm_rms_epsilon"), 1e-5);
    let (mut head_kv, mut kl, mut vl) = (d.n_head_kv, d.head_dim, d.head_dim);
    if let Some((q_lora, kv_lora, rope, v_head)) = d.mla {
        vl = v_head;
        if d.mla_mqa {
            w.u32(&k("attention.key_length_mla"), kl as u32)
                .u32(&k("attention.value_length_mla"), vl as u32);
            (head_kv, kl, vl) = (1, kv_lora + rope, kv_lora);
        }
        w.u32(&k("attention.q_lora_rank"), q_lora as u32)
            .u32(&k("attention.kv_lora_rank"), kv_lora as u32)
            .u32(&k("rope.dimension_count"), rope as u32)
            .u32(&k("leading_dense_block_count"), d.n_dense_lead as u32)
            .u32(&k("expert_shared_count"), d.n_shared_experts as u32);
    } else {
        w.u32(&k("rope.dimension_count"), d.head_dim as u32);
    }
    w.u32(&k("attention.head_count_kv"), head_kv as u32);
    if d.key_length || d.mla.is_some() {
        w.u32(&k("attention.key_length"), kl as u32)
            .u32(&k("attention.value_length"), vl as u32);
    }
    if let Some((n, used, ff)) = d.moe {
        w.u32(&k("expert_count"), n as u32)
            .u32(&k("expert_used_count"), used as u32)
            .u32(&k("expert_feed_forward_length"), ff as u32);
    }
    w.str("tokenizer.ggml.model", "gpt2");
    if tokens {
        w.tokens("tokenizer.ggml.tokens", d.n_vocab);
    }
    w.u32("general.file_type", 7);
    tensors(&mut w, d, ty);
    w
}

fn tensors(w: &mut Writer, d: &Dims, ty: u32) {
    let (e, v) = (d.n_embd, d.n_vocab);
    w.tensor("token_embd.weight", &[e, v], ty);
    w.tensor("output_norm.weight", &[e], F32);
    if !d.tied {
        w.tensor("output.weight", &[e, v], ty);
    }
    let q = d.n_head * d.head_dim;
    let kv = d.n_head_kv * d.head_dim;
    for l in 0..d.n_layer {
        let t = |s: &str| format!("blk.{l}.{s}.weight");
        w.tensor(&t("attn_norm"), &[e], F32)
            .tensor(&t("ffn_norm"), &[e], F32);
        if let Some((q_lora, kv_lora, rope, v_head)) = d.mla {
            let nope = d.head_dim - rope;
            w.tensor(&t("attn_q_a_norm"), &[q_lora], F32)
                .tensor(&t("attn_kv_a_norm"), &[kv_lora], F32)
                .tensor(&t("attn_q_a"), &[e, q_lora], ty)
                .tensor(&t("attn_q_b"), &[q_lora, q], ty)
                .tensor(&t("attn_kv_a_mqa"), &[e, kv_lora + rope], ty)
                .tensor(&t("attn_output"), &[d.n_head * v_head, e], ty);
            if d.mla_mqa {
                w.tensor(&t("attn_k_b"), &[nope, kv_lora, d.n_head], ty)
                    .tensor(&t("attn_v_b"), &[kv_lora, v_head, d.n_head], ty);
            } else {
                w.tensor(&t("attn_kv_b"), &[kv_lora, d.n_head * (nope + v_head)], ty);
            }
        } else if d.arch == "phi3" {
            w.tensor(&t("attn_qkv"), &[e, q + 2 * kv], ty)
                .tensor(&t("attn_output"), &[q, e], ty);
        } else {
            w.tensor(&t("attn_q"), &[e, q], ty)
                .tensor(&t("attn_k"), &[e, kv], ty)
                .tensor(&t("attn_v"), &[e, kv], ty)
                .tensor(&t("attn_output"), &[q, e], ty);
            if d.arch.starts_with("qwen3") {
                w.tensor(&t("attn_q_norm"), &[d.head_dim], F32).tensor(
                    &t("attn_k_norm"),
                    &[d.head_dim],
                    F32,
                );
            }
        }
        match d.moe {
            Some((n, _, ff)) if l >= d.n_dense_lead => {
                w.tensor(&t("ffn_gate_inp"), &[e, n], F32)
                    .tensor(&t("ffn_gate_exps"), &[e, ff, n], ty)
                    .tensor(&t("ffn_up_exps"), &[e, ff, n], ty)
                    .tensor(&t("ffn_down_exps"), &[ff, e, n], ty);
                if d.mla.is_some() {
                    w.tensor(&format!("blk.{l}.exp_probs_b.bias"), &[n], F32);
                }
                if d.n_shared_experts > 0 {
                    let s = ff * d.n_shared_experts;
                    w.tensor(&t("ffn_gate_shexp"), &[e, s], ty)
                        .tensor(&t("ffn_up_shexp"), &[e, s], ty)
                        .tensor(&t("ffn_down_shexp"), &[s, e], ty);
                }
            }
            _ if d.arch == "phi3" => {
                w.tensor(&t("ffn_up"), &[e, 2 * d.n_ff], ty).tensor(
                    &t("ffn_down"),
                    &[d.n_ff, e],
                    ty,
                );
            }
            _ => {
                w.tensor(&t("ffn_gate"), &[e, d.n_ff], ty)
                    .tensor(&t("ffn_up"), &[e, d.n_ff], ty)
                    .tensor(&t("ffn_down"), &[d.n_ff, e], ty);
            }
        }
    }
}
