//! What the runtime tests share.
use cupool_pool::{PoolConfig, PoolKind};
use cupool_runtime::{ModelShape, RunConfig};

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

/// The small model over a 1024-token context in ubatches of 64 (batches of 128), on 4 SMs so that
/// short ubatches still split the KV range, with a pool of `kind` and a GEMM workspace to the
/// model's scale (32 KiB: cuBLAS runs with any size).
#[allow(dead_code)] // not every test binary uses it
pub fn small_cfg(kind: PoolKind) -> RunConfig {
    let mut c = RunConfig::new(small_model(), 1024);
    c.n_batch = 128;
    c.n_ubatch = 64;
    c.sms = 4;
    c.pool = PoolConfig::default().kind(kind);
    c.gemm_workspace_bytes = 32 << 10;
    c
}
