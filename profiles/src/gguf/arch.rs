//! The GGUF architectures the profiles model, and the graph shape each maps to.

use crate::model::Arch;

/// A `general.architecture` the profiles model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufArch {
    /// `llama`: Llama 1 to 3 and their fine-tunes (dense).
    Llama,
    /// `phi3`: Phi-3 (fused QKV and gate-up matrices).
    Phi3,
    /// `qwen3`: Qwen3 dense (Llama's projections plus Q/K norms, which take nothing from the
    /// pool).
    Qwen3,
    /// `qwen3moe`: Qwen3's mixture of experts.
    Qwen3Moe,
    /// `deepseek2`: DeepSeek V2 and V3 (multi-head latent attention, leading dense layers,
    /// routed and shared experts).
    Deepseek2,
}

impl GgufArch {
    /// Every supported architecture.
    pub const ALL: [GgufArch; 5] = [
        Self::Llama,
        Self::Phi3,
        Self::Qwen3,
        Self::Qwen3Moe,
        Self::Deepseek2,
    ];

    /// The name GGUF files use (`general.architecture`, and the prefix of its keys).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Phi3 => "phi3",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Deepseek2 => "deepseek2",
        }
    }

    /// By its GGUF name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The graph shape the profiles build for it. Qwen3 dense builds Llama's graph: its Q/K
    /// norms take nothing from the pool. DeepSeek's graph is Llama's with latent attention
    /// (the model's `mla`) and experts.
    pub fn graph(self) -> Arch {
        match self {
            Self::Phi3 => Arch::Phi3,
            Self::Qwen3Moe => Arch::Qwen3Moe,
            Self::Llama | Self::Qwen3 | Self::Deepseek2 => Arch::Llama,
        }
    }

    /// Whether its feed-forward layers are experts.
    pub fn has_experts(self) -> bool {
        matches!(self, Self::Qwen3Moe | Self::Deepseek2)
    }
}
