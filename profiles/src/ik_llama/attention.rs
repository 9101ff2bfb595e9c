//! ik_llama.cpp's flash attention for dense models (`fattn.cu` → `fattn-mma-f16.cuh`
//! `launch_fattn_mma`, stream-k): a quantized cache's f16 copies, the KV tile bounds and the
//! stream-k `dst_tmp_meta` (see the module docs of `ik_llama`).

use crate::model::EngineModel;
use crate::op::{req, OpCall, OpKind};
use crate::setup::Device;
use cupool_kernels::KvType;

/// The flash-attention mask lets KV tiles be skipped from this batch size on.
const KV_MIN_MAX_FROM: usize = 1024;

/// Flash attention of `n` tokens over `n_kv` cache positions.
pub(super) fn flash_attention(
    m: &EngineModel,
    kv: KvType,
    n: usize,
    n_kv: usize,
    dev: Device,
) -> OpCall {
    let mut held = Vec::with_capacity(4);
    if kv == KvType::Q8_0 {
        held.push(req("K_f16", n_kv * m.kv_dim() * 2));
        held.push(req("V_f16", n_kv * m.kv_dim() * 2));
    }
    let gqa = m.n_head / m.n_head_kv;
    let ncols2 = [8, 4, 2, 1].into_iter().find(|c| gqa % c == 0).unwrap_or(1);
    let ncols1 = [8, 16, 32, 64]
        .into_iter()
        .map(|c| c / ncols2)
        .find(|&c| n <= c)
        .unwrap_or(64 / ncols2)
        .max(1);
    let ntiles_x = n.div_ceil(ncols1);
    if n >= KV_MIN_MAX_FROM {
        held.push(req("KV_min_max", ntiles_x * 8));
    }
    let ntiles = ntiles_x * (m.n_head / ncols2);
    let max_blocks = if n > 1 { 2 * dev.nsm } else { dev.nsm };
    let waves = ntiles.div_ceil(max_blocks);
    let efficiency = 100 * ntiles / (max_blocks * waves);
    let blocks = if efficiency < 75 || n > 2048 {
        max_blocks
    } else {
        ntiles
    };
    held.push(req(
        "dst_tmp_meta",
        blocks * ncols1 * ncols2 * (4 + m.head_dim) * 4 * 8,
    ));
    OpCall::new(OpKind::FlashAttention, held, vec![])
}
