//! A model as an engine's graph sees it: its graph shape, dimensions, experts and latent
//! attention, and the presets the profiles model.

/// How the model's graph is built: which projections are one matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Phi-3: one QKV matrix, one gate-and-up matrix (`2 × n_ff` wide).
    Phi3,
    /// Llama: Q, K, V, gate and up matrices of their own.
    Llama,
    /// Qwen3-MoE: Llama's projections; ik_llama.cpp's graph for it keeps a lone token's row
    /// through the last layer whether or not it asks for logits.
    Qwen3Moe,
}

/// The mixture of experts of a model's feed-forward layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token is routed to.
    pub n_expert_used: usize,
    /// An expert's FFN width.
    pub n_ff_exp: usize,
}

/// DeepSeek's multi-head latent attention: the cache holds a compressed KV row per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mla {
    /// Rank of Q's low-rank projection.
    pub q_lora: usize,
    /// Rank of the compressed KV (the cache row, before the rotary part).
    pub kv_lora: usize,
    /// The rotary part of a K head (the rest of `head_dim` has none).
    pub rope: usize,
    /// A V head.
    pub v_head: usize,
    /// ik_llama.cpp's `-amb` (attention max batch, MiB): the prompt path decompresses the cache
    /// in head chunks whose f32 K/V fits it; 0: no limit. 256 in llama-cli, llama-server and
    /// llama-sweep-bench, 0 in llama-bench.
    pub attn_max_batch_mib: usize,
}

/// A model as an engine's graph sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineModel {
    /// Graph shape.
    pub arch: Arch,
    /// Layers.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension (K, V and Q alike).
    pub head_dim: usize,
    /// FFN width (dense layers).
    pub n_ff: usize,
    /// Vocabulary: the output matrix's rows.
    pub n_vocab: usize,
    /// The experts, for a mixture-of-experts model (the FFN of every layer from `n_dense_lead`).
    pub moe: Option<Moe>,
    /// Layers before the first expert layer (dense FFN of `n_ff`).
    pub n_dense_lead: usize,
    /// Width of the shared experts run beside the routed ones (0: none).
    pub n_ff_shared: usize,
    /// Multi-head latent attention (`head_dim` is then a K head: rotary part included).
    pub mla: Option<Mla>,
}

impl EngineModel {
    /// The presets profiles model: `phi3-mini`, `llama3-8b` (dense), `qwen3-30b-a3b` (128
    /// experts, 8 per token; its Q/K norms take nothing from the pool) and `deepseek-v3` (MLA,
    /// 3 dense layers, then 256 experts, 8 per token, and a shared one).
    pub fn preset(name: &str) -> Option<Self> {
        if name == "deepseek-v3" {
            return Some(Self {
                arch: Arch::Llama,
                n_layer: 61,
                n_embd: 7168,
                n_head: 128,
                n_head_kv: 128,
                head_dim: 192,
                n_ff: 18432,
                n_vocab: 129280,
                moe: Some(Moe {
                    n_expert: 256,
                    n_expert_used: 8,
                    n_ff_exp: 2048,
                }),
                n_dense_lead: 3,
                n_ff_shared: 2048,
                mla: Some(Mla {
                    q_lora: 1536,
                    kv_lora: 512,
                    rope: 64,
                    v_head: 128,
                    attn_max_batch_mib: 256,
                }),
            });
        }
        let (arch, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, moe) = match name {
            "phi3-mini" => (Arch::Phi3, 32, 3072, 32, 32, 96, 8192, 32064, None),
            "llama3-8b" => (Arch::Llama, 32, 4096, 32, 8, 128, 14336, 128256, None),
            "qwen3-30b-a3b" => {
                let moe = Moe {
                    n_expert: 128,
                    n_expert_used: 8,
                    n_ff_exp: 768,
                };
                (
                    Arch::Qwen3Moe,
                    48,
                    2048,
                    32,
                    4,
                    128,
                    6144,
                    151936,
                    Some(moe),
                )
            }
            _ => return None,
        };
        Some(Self {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            moe,
            n_dense_lead: 0,
            n_ff_shared: 0,
            mla: None,
        })
    }

    /// The presets' names.
    pub const PRESETS: [&'static str; 4] =
        ["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"];

    /// Whether layer `l`'s FFN is the experts.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.is_some() && l >= self.n_dense_lead
    }

    /// K (or V) values of one token across the KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Q values of one token across the heads (the attention output's width).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
