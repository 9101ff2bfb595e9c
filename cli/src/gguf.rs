//! `--gguf FILE`: a model read from a GGUF file's header instead of a preset. The file gives
//! the shape (the engines' model and the runtime's shape, derived from one another as the
//! presets are), the matmul path of its weights, and the exact bytes of the tensors the
//! engines keep on the device.

use cupool::gguf::GgufModel;
use cupool::runtime::planner::weights::WeightType;
use cupool::runtime::profile::{EngineModel, Profile, Weights};
use cupool::runtime::ModelShape;
use std::path::Path;

/// What a command takes from a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufInput {
    /// The runtime's shape (named after the file).
    pub shape: ModelShape,
    /// The engines' model.
    pub engine: EngineModel,
    /// The type most matrix weights have: its path (cuBLAS or MMQ) and its name.
    pub weight_type: WeightType,
    /// The bytes of the tensors the engines keep on the device.
    pub device_bytes: usize,
}

/// Reads `path`'s header; the reader's error as it gives it, after the file's name.
pub fn read(path: &Path) -> Result<GgufInput, String> {
    let at = |e: String| format!("--gguf {}: {e}", path.display());
    let g = GgufModel::read(path).map_err(|e| at(e.to_string()))?;
    let ty = g.weight_type.name();
    let weight_type = WeightType::parse(&ty.to_ascii_lowercase()).ok_or_else(|| {
        at(format!(
            "its matrix weights are mostly {ty}; accepted are {}",
            WeightType::names()
        ))
    })?;
    let engine = g.to_model();
    let name = path
        .file_name()
        .map_or_else(|| "gguf".into(), |n| n.to_string_lossy().into_owned());
    let device_bytes = device_bytes(&g).map_err(at)?;
    Ok(GgufInput {
        shape: shape_of(&name, &engine, device_bytes),
        engine,
        weight_type,
        device_bytes,
    })
}

/// The tensors the engines load onto the device: all but the token embedding, which llama.cpp
/// and ik_llama.cpp keep in host memory (their `CPU buffer size` line). A model without an
/// output matrix uses the embedding as one: the engines then load a copy of it onto the device.
fn device_bytes(g: &GgufModel) -> Result<usize, String> {
    let embd = g.file.tensor("token_embd.weight").map_or(0, |t| t.bytes);
    let tied = g.file.tensor("output.weight").is_none();
    let bytes = if tied {
        g.weight_bytes
    } else {
        g.weight_bytes - embd.min(g.weight_bytes)
    };
    usize::try_from(bytes)
        .map_err(|_| format!("its weights of {bytes} bytes exceed this machine's address space"))
}

/// The runtime's shape of an engine model, as the presets relate the two: multi-head latent
/// attention as flash attention sees it (one cache head of the compressed row and its rotary
/// part, V a view of K), and for experts the width a token's FFN runs (the routed experts'
/// and the shared one's).
pub fn shape_of(name: &str, m: &EngineModel, weights_bytes: usize) -> ModelShape {
    let (n_head_kv, head_dim_k, head_dim_v, v_is_k) = match m.mla {
        Some(mla) => (1, mla.kv_lora + mla.rope, mla.kv_lora, true),
        None => (m.n_head_kv, m.head_dim, m.head_dim, false),
    };
    let n_ff = match m.moe {
        Some(moe) => moe.n_expert_used * moe.n_ff_exp + m.n_ff_shared,
        None => m.n_ff,
    };
    ModelShape {
        name: name.into(),
        n_layer: m.n_layer,
        n_embd: m.n_embd,
        n_head: m.n_head,
        n_head_kv,
        head_dim_k,
        head_dim_v,
        v_is_k,
        n_ff,
        weights_bytes,
    }
}

/// The file's weights under `profile`: refused where the profile does not model them (float
/// experts: one call per expert, sized by the routing), as for the presets.
pub fn check_weights(g: &GgufInput, profile: Option<Profile>) -> Result<(), String> {
    match profile {
        Some(p) if g.engine.moe.is_some() && g.weight_type.path() == Weights::F16 => Err(format!(
            "--gguf: {} is a mixture-of-experts model with {} experts, and the {} profile does not model float experts (one call per expert, sized by the routing): accepted is a file of quantized experts, such as q8_0",
            g.shape.name,
            g.weight_type.name,
            crate::values::engine_name(p)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preset_s_engine_model_has_the_preset_s_shape() {
        for name in EngineModel::PRESETS {
            let m = EngineModel::preset(name).unwrap();
            let want = ModelShape::preset(name).unwrap();
            let got = shape_of(name, &m, want.weights_bytes);
            assert_eq!(got, want, "{name}");
        }
    }
}
