//! What a model's weights take on the device, from the real sizes of ggml's types: the
//! engines keep every tensor on the GPU (`-ngl 99`) except the token embedding, which
//! llama.cpp and ik_llama.cpp load into host memory (their logs: `CPU buffer size` is the
//! embedding, `CUDA0 buffer size` the rest). The tensors are those of the GGUF models the
//! measurements ran on (`scripts/llama/gen_model.py`): matrices in the chosen type, norms and
//! the mixture-of-experts router in f32. Phi-3-mini in f16 comes to 7,100.64 MiB, the
//! `CUDA0 buffer size` ik_llama.cpp logged for that model.

use cupool_profiles::{Arch, EngineModel, Weights};

/// A ggml storage type of weight matrices: its name, the values in one block and the bytes
/// the block takes (ggml's `type_traits`), and the path the engines take for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightType {
    /// ggml's name.
    pub name: &'static str,
    /// Values per block.
    pub block: usize,
    /// Bytes per block.
    pub block_bytes: usize,
}

/// Every type `--weight-type` accepts, with ggml's block sizes.
pub const WEIGHT_TYPES: [WeightType; 11] = [
    WeightType::new("f32", 1, 4),
    WeightType::new("f16", 1, 2),
    WeightType::new("bf16", 1, 2),
    WeightType::new("q8_0", 32, 34),
    WeightType::new("q6_k", 256, 210),
    WeightType::new("q5_k", 256, 176),
    WeightType::new("q5_1", 32, 24),
    WeightType::new("q5_0", 32, 22),
    WeightType::new("q4_k", 256, 144),
    WeightType::new("q4_1", 32, 20),
    WeightType::new("q4_0", 32, 18),
];

impl WeightType {
    const fn new(name: &'static str, block: usize, block_bytes: usize) -> Self {
        Self {
            name,
            block,
            block_bytes,
        }
    }

    /// The type of this name, or `None`.
    pub fn parse(s: &str) -> Option<Self> {
        WEIGHT_TYPES.iter().copied().find(|t| t.name == s)
    }

    /// The accepted names, for errors and help.
    pub fn names() -> String {
        WEIGHT_TYPES.map(|t| t.name).join(", ")
    }

    /// Whether the type is a float type (cuBLAS GEMMs) rather than a quantized one (MMQ).
    pub fn is_float(self) -> bool {
        self.block == 1
    }

    /// The engines' path for matrices of this type: float types go through cuBLAS as f16 does,
    /// quantized types through MMQ as q8_0 does (the profiles model those two paths).
    pub fn path(self) -> Weights {
        if self.is_float() {
            Weights::F16
        } else {
            Weights::Q8_0
        }
    }

    /// Bytes of `n` values (rounded up to whole blocks).
    pub fn bytes(self, n: usize) -> usize {
        n.div_ceil(self.block) * self.block_bytes
    }
}

/// Bytes of the weights the engine keeps on the device for `m` with matrices of `ty`: every
/// tensor but the token embedding.
pub fn device_weight_bytes(m: &EngineModel, ty: WeightType) -> usize {
    let f32s = |n: usize| n * 4;
    let mat = |k: usize, n: usize| ty.bytes(k * n);
    let e = m.n_embd;
    let kv = m.kv_dim();
    // The output norm and the output matrix.
    let mut total = f32s(e) + mat(e, m.n_vocab);
    for l in 0..m.n_layer {
        // The attention and FFN norms.
        total += f32s(2 * e);
        total += match (m.mla, m.arch) {
            (Some(mla), _) => {
                let nope = m.head_dim - mla.rope;
                f32s(mla.q_lora + mla.kv_lora)
                    + mat(e, mla.q_lora)
                    + mat(mla.q_lora, m.n_head * m.head_dim)
                    + mat(e, mla.kv_lora + mla.rope)
                    + mat(mla.kv_lora, m.n_head * (nope + mla.v_head))
                    + mat(m.n_head * mla.v_head, e)
            }
            (None, Arch::Phi3) => mat(e, m.q_dim() + 2 * kv) + mat(m.q_dim(), e),
            (None, Arch::Qwen3Moe) => {
                mat(e, m.q_dim()) + 2 * mat(e, kv) + f32s(2 * m.head_dim) + mat(m.q_dim(), e)
            }
            (None, Arch::Llama) => mat(e, m.q_dim()) + 2 * mat(e, kv) + mat(m.q_dim(), e),
        };
        total += match m.moe {
            Some(moe) if m.is_moe_layer(l) => {
                let experts = 3 * moe.n_expert * mat(e, moe.n_ff_exp);
                // The router (and DeepSeek's expert bias) stay f32, as published GGUFs keep them.
                let router = f32s(e * moe.n_expert)
                    + if m.mla.is_some() {
                        f32s(moe.n_expert)
                    } else {
                        0
                    };
                experts + router + 3 * mat(e, m.n_ff_shared)
            }
            // Phi-3's gate and up are one matrix of twice the width: the same bytes.
            _ => 3 * mat(e, m.n_ff),
        };
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = (1u64 << 20) as f64;

    #[test]
    fn the_measured_models_weigh_what_the_engines_logged() {
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let f16 = WeightType::parse("f16").unwrap();
        // ik_llama.cpp: `CUDA0 buffer size = 7100.64 MiB` for the f16 Phi-3-mini model.
        let mib = device_weight_bytes(&phi, f16) as f64 / MIB;
        assert!((mib - 7100.64).abs() < 0.01, "{mib}");
        // Mainline's start-up report for the q8_0 Llama-3-8B model at -c 56832: 382.6 MiB free
        // of 12,288 after the CUDA context (526 MiB) and 3,774.0 MiB of KV cache.
        let llama = EngineModel::preset("llama3-8b").unwrap();
        let q8 = WeightType::parse("q8_0").unwrap();
        let mib = device_weight_bytes(&llama, q8) as f64 / MIB;
        assert!(
            (mib - (12288.0 - 526.0 - 3774.0 - 382.6)).abs() < 1.0,
            "{mib}"
        );
    }

    #[test]
    fn bytes_scale_with_the_type_size() {
        for name in EngineModel::PRESETS {
            let m = EngineModel::preset(name).unwrap();
            let by = |t: &str| device_weight_bytes(&m, WeightType::parse(t).unwrap()) as f64;
            // Matrices dominate: f32 twice f16, f16 = bf16, q8_0 34/64 of f16, q4_0 18/64.
            assert!((by("f32") / by("f16") - 2.0).abs() < 0.01, "{name}");
            assert_eq!(by("f16"), by("bf16"), "{name}");
            assert!(
                (by("q8_0") / by("f16") - 34.0 / 64.0).abs() < 0.01,
                "{name}"
            );
            assert!(
                (by("q4_0") / by("f16") - 18.0 / 64.0).abs() < 0.01,
                "{name}"
            );
            assert!(by("q4_k") < by("q5_k") && by("q5_k") < by("q6_k") && by("q6_k") < by("q8_0"));
        }
        let llama = EngineModel::preset("llama3-8b").unwrap();
        let f16 = device_weight_bytes(&llama, WeightType::parse("f16").unwrap()) as f64;
        // Llama-3-8B: 8.03 B parameters, 0.53 B of them the host-side embedding.
        assert!((f16 / (1u64 << 30) as f64 - 13.98).abs() < 0.05, "{f16}");
    }

    #[test]
    fn every_type_parses_by_its_name_and_maps_to_a_modelled_path() {
        for t in WEIGHT_TYPES {
            assert_eq!(WeightType::parse(t.name), Some(t));
            assert_eq!(t.path() == Weights::F16, t.is_float());
        }
        assert_eq!(WeightType::parse("q3_k"), None);
        assert!(WeightType::names().starts_with("f32, f16, bf16, q8_0"));
    }
}
