//! What the runtime tests share.
use cupool_runtime::ModelShape;

/// Two layers, 4 query heads over 2 KV heads of 32 dimensions: fast on the CPU executor.
pub fn small_model() -> ModelShape {
    ModelShape {
        name: "small".into(),
        n_layer: 2,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim_k: 32,
        head_dim_v: 32,
        v_is_k: false,
        n_ff: 128,
        weights_bytes: 0,
    }
}
