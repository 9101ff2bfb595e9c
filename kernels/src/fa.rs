//! What one flash-attention call takes from the pool, as ggml's `launch_fattn` sizes it.
//!
//! | buffer | when | elements |
//! |---|---|---|
//! | `K_f16` | K cache not f16 | D_K · n_kv · n_head_kv halves |
//! | `V_f16` | V cache not f16 and V is not a view of K | D_V · n_kv · n_head_kv halves |
//! | `dst_tmp` | split-KV (parallel_blocks > 1) | parallel_blocks · D_V · n_head · n_tokens floats |
//! | `dst_tmp_meta` | same | parallel_blocks · n_head · n_tokens float2 |
//!
//! They are taken in that order and returned in reverse when the call ends.

use crate::KvType;
use std::mem::size_of;

/// Element type of `K_f16` and `V_f16`: the one definition, which the pool buffers and the
/// byte sizes below (and so the planner and the purge policy) all use.
pub type KvHalf = half::f16;
/// Element type of `dst_tmp`: a split's partial output.
pub type Partial = f32;
/// Element type of `dst_tmp_meta`: a split's running (max, sum).
pub type Meta = [f32; 2];

/// Queries one block of the CUDA kernel handles (`QPB` in `fattn.cu`).
pub const QUERIES_PER_BLOCK: usize = 32;
/// Keys per tile (`BK` in `fattn.cu`).
pub const KEYS_PER_TILE: usize = 32;
/// The KV length ggml pads to.
pub const KV_PAD: usize = 256;
/// Largest supported head dimensions.
pub const MAX_D_K: usize = 576;
/// Largest supported V head dimension.
pub const MAX_D_V: usize = 512;

/// The attention shape of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (n_head is a multiple).
    pub n_head_kv: usize,
    /// K (and Q) head dimension.
    pub d_k: usize,
    /// V head dimension.
    pub d_v: usize,
    /// V is the first D_V dimensions of K (MLA as ggml runs it).
    pub v_is_k: bool,
}

/// The scratch one call takes, in elements of each buffer's type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaScratch {
    /// Splits of the KV range; 1 means no split.
    pub parallel_blocks: usize,
    /// `K_f16` halves (0: not taken).
    pub k_f16: usize,
    /// `V_f16` halves (0: not taken).
    pub v_f16: usize,
    /// `dst_tmp` floats (0: not taken).
    pub dst_tmp: usize,
    /// `dst_tmp_meta` float pairs (0: not taken).
    pub dst_meta: usize,
}

impl FaScratch {
    /// The byte sizes of the buffers taken, in allocation order.
    pub fn request_bytes(&self) -> Vec<usize> {
        [
            self.k_f16 * size_of::<KvHalf>(),
            self.v_f16 * size_of::<KvHalf>(),
            self.dst_tmp * size_of::<Partial>(),
            self.dst_meta * size_of::<Meta>(),
        ]
        .into_iter()
        .filter(|&b| b > 0)
        .collect()
    }

    /// All scratch bytes of one call.
    pub fn total_bytes(&self) -> usize {
        self.request_bytes().iter().sum()
    }
}

/// The KV length a call sees: the used length padded to 256, at most the context.
pub fn n_kv(kv_used: usize, n_ctx: usize) -> usize {
    kv_used
        .next_multiple_of(KV_PAD)
        .min(n_ctx)
        .max(kv_used.min(n_ctx))
}

/// How many splits of the KV range keep `sms` multiprocessors busy, as ggml's split-KV does:
/// none when the query tiles alone fill the device twice over.
pub fn parallel_blocks(shape: &AttnShape, n_tokens: usize, n_kv: usize, sms: usize) -> usize {
    let blocks = n_tokens.div_ceil(QUERIES_PER_BLOCK) * shape.n_head;
    let want = 2 * sms.max(1);
    if blocks >= want {
        return 1;
    }
    want.div_ceil(blocks.max(1))
        .min(n_kv.div_ceil(KV_PAD))
        .clamp(1, 32)
}

/// The scratch of one flash-attention call.
pub fn scratch(
    shape: &AttnShape,
    kv: KvType,
    n_tokens: usize,
    n_kv: usize,
    sms: usize,
) -> FaScratch {
    let quantized = kv != KvType::F16;
    let pb = parallel_blocks(shape, n_tokens, n_kv, sms);
    FaScratch {
        parallel_blocks: pb,
        k_f16: if quantized {
            shape.d_k * n_kv * shape.n_head_kv
        } else {
            0
        },
        v_f16: if quantized && !shape.v_is_k {
            shape.d_v * n_kv * shape.n_head_kv
        } else {
            0
        },
        dst_tmp: if pb > 1 {
            pb * shape.d_v * shape.n_head * n_tokens
        } else {
            0
        },
        dst_meta: if pb > 1 {
            pb * shape.n_head * n_tokens
        } else {
            0
        },
    }
}

/// Dynamic shared memory the CUDA kernel needs for these head dimensions.
pub fn shared_bytes(d_k: usize, d_v: usize) -> usize {
    let kv = KEYS_PER_TILE * (d_k + 2) * 2 + KEYS_PER_TILE * d_v * 2;
    kv.next_multiple_of(4) + QUERIES_PER_BLOCK * d_k * 4
}

/// How the tensor-core kernel (`fattn_mma.cu`) splits a block's 4 warps for one head shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaConfig {
    /// 16-row m-tiles each warp owns: two let every K/V fragment read from shared memory feed
    /// twice the tensor-core work, but leave no registers for Q's fragments; one m-tile with
    /// 128-key tiles measured fastest for heads up to 128 (docs/benchmarks.md §5).
    pub m_tiles: usize,
    /// Warps that split one row group's keys (of S) and dimensions (of O): wide heads do not
    /// fit one warp's registers otherwise.
    pub col_warps: usize,
    /// Keys per K/V tile (32, 64 or 128; a multiple of 16 × `col_warps`).
    pub keys_per_tile: usize,
}

/// Warps of a tensor-core block.
pub const MMA_WARPS: usize = 4;

/// The head shapes the tensor-core kernel is built for, with their configuration; every other
/// shape (and devices before compute capability 8.0) runs the CUDA-core kernel.
pub const MMA_SHAPES: &[(usize, usize, MmaConfig)] = &[
    (
        64,
        64,
        MmaConfig {
            m_tiles: 1,
            col_warps: 1,
            keys_per_tile: 128,
        },
    ),
    (
        80,
        80,
        MmaConfig {
            m_tiles: 1,
            col_warps: 1,
            keys_per_tile: 128,
        },
    ),
    (
        96,
        96,
        MmaConfig {
            m_tiles: 1,
            col_warps: 1,
            keys_per_tile: 128,
        },
    ),
    (
        112,
        112,
        MmaConfig {
            m_tiles: 1,
            col_warps: 1,
            keys_per_tile: 128,
        },
    ),
    (
        128,
        128,
        MmaConfig {
            m_tiles: 1,
            col_warps: 1,
            keys_per_tile: 128,
        },
    ),
    (
        256,
        256,
        MmaConfig {
            m_tiles: 1,
            col_warps: 2,
            keys_per_tile: 64,
        },
    ),
    (
        576,
        512,
        MmaConfig {
            m_tiles: 1,
            col_warps: 4,
            keys_per_tile: 64,
        },
    ),
];

/// The tensor-core configuration of a head shape, if it has one.
pub fn mma_config(d_k: usize, d_v: usize) -> Option<MmaConfig> {
    MMA_SHAPES
        .iter()
        .find(|&&(k, v, _)| k == d_k && v == d_v)
        .map(|&(_, _, c)| c)
}

/// Every configuration the kernel is built and tested in for a head shape: the chosen one first,
/// then, for shapes one warp's registers hold, the other m-tile and tile-length trade-offs (the
/// benchmark times them all, so the choice in [`MMA_SHAPES`] stays measured).
pub fn mma_candidates(d_k: usize, d_v: usize) -> Vec<MmaConfig> {
    let Some(chosen) = mma_config(d_k, d_v) else {
        return Vec::new();
    };
    let mut out = vec![chosen];
    if chosen.col_warps == 1 {
        for (m_tiles, keys_per_tile) in [(1, 128), (1, 64), (2, 64), (2, 32)] {
            let c = MmaConfig {
                m_tiles,
                col_warps: 1,
                keys_per_tile,
            };
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

impl MmaConfig {
    /// Rows (token, head-of-group pairs) one block covers.
    pub fn rows_per_block(&self) -> usize {
        16 * self.m_tiles * (MMA_WARPS / self.col_warps)
    }

    /// Dynamic shared memory of one block: Q, the K tile, the V tile unless V is read from the
    /// K tile, P and the row exchange when warps split columns. Rows are padded by 8 halves.
    pub fn shared_bytes(&self, d_k: usize, d_v: usize, v_in_k: bool) -> usize {
        let rows = self.rows_per_block();
        let keys = self.keys_per_tile;
        let mut halves = rows * (d_k + 8) + keys * (d_k + 8);
        if !v_in_k {
            halves += keys * (d_v + 8);
        }
        let mut bytes = halves * 2;
        if self.col_warps > 1 {
            bytes += rows * (keys + 8) * 2 + rows * self.col_warps * 4;
        }
        bytes
    }
}
