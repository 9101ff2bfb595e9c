//! A model is its shape, not its weights.

use crate::error::RuntimeError;
use cupool_kernels::fa::{AttnShape, MAX_D_K, MAX_D_V};
use cupool_kernels::{KvType, QK8_0};

/// The dimensions that decide memory and maths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Preset name, or "custom".
    pub name: String,
    /// Transformer layers.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// K (and Q) head dimension.
    pub head_dim_k: usize,
    /// V head dimension.
    pub head_dim_v: usize,
    /// V is a view of K's first `head_dim_v` dimensions (MLA as ggml runs it).
    pub v_is_k: bool,
    /// FFN width (the active width for mixture-of-experts models).
    pub n_ff: usize,
    /// Resident weights of the real model in bytes, as a quantized GGUF would hold them.
    pub weights_bytes: usize,
}

const GIB: f64 = (1u64 << 30) as f64;

/// The most layers a model may have.
pub const MAX_LAYERS: usize = 1 << 12;
/// The most attention heads (query or KV) a model may have.
pub const MAX_HEADS: usize = 1 << 12;
/// The widest a model dimension (embedding, FFN, head) may be.
pub const MAX_WIDTH: usize = 1 << 20;

/// The presets' names.
pub const PRESETS: &[&str] = &["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"];

impl ModelShape {
    /// A public model's shape (from its published configuration). Weights are a Q8_0-sized estimate.
    pub fn preset(name: &str) -> Result<Self, RuntimeError> {
        let (n_layer, n_embd, n_head, n_head_kv, dk, dv, v_is_k, n_ff, gib) = match name {
            "phi3-mini" => (32, 3072, 32, 32, 96, 96, false, 8192, 3.8),
            "llama3-8b" => (32, 4096, 32, 8, 128, 128, false, 14336, 7.95),
            "qwen3-30b-a3b" => (48, 2048, 32, 4, 128, 128, false, 6144, 30.3),
            "deepseek-v3" => (61, 7168, 128, 1, 576, 512, true, 18432, 665.0),
            _ => {
                return Err(RuntimeError::Invalid(format!(
                    "unknown model preset {name:?}: accepted presets are {}",
                    PRESETS.join(", ")
                )))
            }
        };
        Ok(Self {
            name: name.to_string(),
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim_k: dk,
            head_dim_v: dv,
            v_is_k,
            n_ff,
            weights_bytes: (gib * GIB) as usize,
        })
    }

    /// Checks every dimension; the error says which and what is accepted.
    pub fn validate(&self, kv: KvType) -> Result<(), RuntimeError> {
        let bad = |what: String| Err(RuntimeError::Invalid(what));
        // Bounds far above any published model, low enough that no layout size can overflow
        // (every product of them below stays under 2^63 bytes).
        for (name, v, max) in [
            ("n_layer", self.n_layer, MAX_LAYERS),
            ("n_embd", self.n_embd, MAX_WIDTH),
            ("n_head", self.n_head, MAX_HEADS),
            ("n_head_kv", self.n_head_kv, MAX_HEADS),
            ("head_dim_k", self.head_dim_k, MAX_WIDTH),
            ("head_dim_v", self.head_dim_v, MAX_WIDTH),
            ("n_ff", self.n_ff, MAX_WIDTH),
        ] {
            if v == 0 || v > max {
                return bad(format!("{name} is {v}: it must be from 1 to {max}"));
            }
        }
        for (name, v) in [
            ("n_head * head_dim_k", self.n_head * self.head_dim_k),
            ("n_head * head_dim_v", self.n_head * self.head_dim_v),
        ] {
            if v > MAX_WIDTH {
                return bad(format!("{name} is {v}: it must be at most {MAX_WIDTH}"));
            }
        }
        if self.n_head % self.n_head_kv != 0 {
            return bad(format!("n_head {} is not a multiple of n_head_kv {}: grouped-query attention needs whole groups", self.n_head, self.n_head_kv));
        }
        if self.head_dim_k > MAX_D_K || self.head_dim_v > MAX_D_V {
            return bad(format!(
                "head dims {}/{} exceed the supported {MAX_D_K}/{MAX_D_V}",
                self.head_dim_k, self.head_dim_v
            ));
        }
        if self.v_is_k && self.head_dim_v > self.head_dim_k {
            return bad(format!(
                "V as a view of K needs head_dim_v ({}) <= head_dim_k ({})",
                self.head_dim_v, self.head_dim_k
            ));
        }
        if kv == KvType::Q8_0 && (self.kv_dim_k() % QK8_0 != 0 || self.kv_dim_v() % QK8_0 != 0) {
            return bad(format!("a q8_0 KV cache needs n_head_kv*head_dim to be a multiple of {QK8_0} (K: {}, V: {})", self.kv_dim_k(), self.kv_dim_v()));
        }
        Ok(())
    }

    /// The attention shape.
    pub fn attn(&self) -> AttnShape {
        AttnShape {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            d_k: self.head_dim_k,
            d_v: self.head_dim_v,
            v_is_k: self.v_is_k,
        }
    }

    /// Width of Q (all heads).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of a K cache row.
    pub fn kv_dim_k(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Width of a V cache row (V's own, even when V is a view of K).
    pub fn kv_dim_v(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Width of the attention output (all heads).
    pub fn out_dim(&self) -> usize {
        self.n_head * self.head_dim_v
    }
}
