//! llama.cpp's flash attention (`fattn.cu`, `fattn-common.cuh` `launch_fattn`): which kernel a
//! call goes to (the MMA kernel, stream-k, or the vector kernel), its blocks per SM, and the
//! buffers each takes from the pool (see the module docs of `llama`).

use super::Llama;
use crate::model::EngineModel;
use crate::op::{req, OpCall, OpKind, Request};
use cupool_kernels::KvType;

/// The KV tile bounds from the mask, from this batch size on.
const KV_MAX_FROM: usize = 1024;
/// Compute capability of Ada Lovelace: from it on the MMA kernel always runs stream-k.
const CC_ADA: u32 = 890;

impl Llama {
    /// Flash attention of `n` tokens over a padded KV length of `n_kv`
    /// (`ggml_cuda_flash_attn_ext`): a quantized cache's f16 copies where the version takes
    /// them from the pool and the kernel reads f16, then the kernel's own buffers; `None` where
    /// it takes nothing. The vector kernel reads the cache as it is (`fattn-vec.cuh` asks for f16
    /// only of an f16 cache, and the default build compiles its q8_0 and f16 instances,
    /// `GGML_CUDA_FA_QUANTS`), the MMA kernel reads f16 only.
    pub(super) fn flash_attn_ext(&self, m: &EngineModel, n: usize, n_kv: usize) -> Option<OpCall> {
        let mut held = Vec::with_capacity(4);
        let vector = self.vector_kernel(m, n, n_kv);
        if self.v.kv_f16_from_pool() && self.kv != KvType::F16 && !vector {
            held.push(req("K_f16", n_kv * m.kv_dim() * 2));
            held.push(req("V_f16", n_kv * m.kv_dim() * 2));
        }
        if vector {
            held.extend(self.vector_split(m, n, n_kv));
        } else {
            held.extend(self.mma_stream_k(m, n, n_kv));
        }
        (!held.is_empty()).then_some(OpCall::new(OpKind::FlashAttention, held, vec![]))
    }

    /// ggml_cuda_get_best_fattn_kernel on a device with tensor cores: the vector kernel for one
    /// column (two with a quantized cache from Ada on), else the MMA kernel.
    fn vector_kernel(&self, m: &EngineModel, n: usize, n_kv: usize) -> bool {
        let d = m.head_dim;
        if d > 256 || d % 64 != 0 {
            return false;
        }
        let gqa = m.n_head / m.n_head_kv;
        let ada = self.dev.cc >= CC_ADA;
        let by_type = if self.kv == KvType::F16 {
            ada && n == 1 && !(gqa > 4 && n_kv >= 8192)
        } else if ada {
            n <= 2
        } else {
            n == 1
        };
        // The GQA-optimized MMA kernel needs a GQA ratio of 2 or more.
        by_type || (gqa < 2 && n == 1)
    }

    /// The MMA kernel's `KV_max` and stream-k `dst_tmp_meta`.
    fn mma_stream_k(&self, m: &EngineModel, n: usize, n_kv: usize) -> Vec<Request> {
        let gqa = m.n_head / m.n_head_kv;
        let ncols2 = match gqa {
            g if g > 4 => 8,
            g if g > 2 => 4,
            g if g > 1 => 2,
            _ => 1,
        };
        let ncols1 = [8, 16, 32]
            .into_iter()
            .map(|c| c / ncols2)
            .find(|&c| n <= c)
            .unwrap_or(64 / ncols2);
        let (occupancy, nbatch_fa) = mma_config(m.head_dim, ncols1 * ncols2);
        let occupancy = self.dev.occupancy.unwrap_or(occupancy);
        let ntiles_x = n.div_ceil(ncols1);
        let ntiles_dst = ntiles_x * gqa.div_ceil(ncols2) * m.n_head_kv;
        let mut out = Vec::with_capacity(2);
        if n >= KV_MAX_FROM {
            out.push(req("KV_max", ntiles_x * 4));
        }
        let max_blocks = occupancy * self.dev.nsm;
        let waves = ntiles_dst.div_ceil(max_blocks);
        let efficiency = 100 * ntiles_dst / (max_blocks * waves);
        let mut blocks = ntiles_dst;
        if self.dev.cc >= CC_ADA || efficiency < 75 {
            let raw = max_blocks.min(n_kv.div_ceil(nbatch_fa) * ntiles_dst);
            let rounded = raw / ntiles_dst * ntiles_dst;
            let loss = if rounded > 0 {
                100 * (raw - rounded) / raw
            } else {
                100
            };
            blocks = if loss <= 5 { rounded } else { raw };
        }
        if ntiles_dst % blocks != 0 {
            let dv = m.head_dim;
            out.push(req(
                "dst_tmp_meta",
                blocks * ncols1 * ncols2 * (2 + dv / 2) * 8,
            ));
        }
        out
    }

    /// The vector kernel's parallel blocks over the KV length: `dst_tmp` and `dst_tmp_meta`
    /// when it splits.
    fn vector_split(&self, m: &EngineModel, n: usize, n_kv: usize) -> Vec<Request> {
        let d = m.head_dim;
        let cols = if n == 1 { 1 } else { 2 };
        let ntiles_dst = n.div_ceil(cols) * m.n_head;
        let ntiles_kv = n_kv.div_ceil(d);
        let occupancy = self
            .dev
            .occupancy
            .unwrap_or_else(|| vec_occupancy(self.dev.cc, d, self.kv));
        let per_wave = self.dev.nsm * occupancy;
        let first = occupancy.min(ntiles_kv);
        let (mut pb, mut waves_best, mut eff_best) = (first, 0, 0);
        for test in first..=ntiles_kv {
            let total = ntiles_dst * test;
            let waves = total.div_ceil(per_wave);
            let eff = 100 * total / (waves * per_wave);
            if eff_best >= 95 && waves > waves_best {
                break;
            }
            if eff > eff_best {
                (waves_best, eff_best, pb) = (waves, eff, test);
            }
        }
        if pb <= 1 {
            return vec![];
        }
        vec![
            req("dst_tmp", pb * d * m.n_head * n * 4),
            req("dst_tmp_meta", pb * m.n_head * n * 8),
        ]
    }
}

/// The vector kernel's blocks per SM: as measured on compute capability 9.0 (see `llama`'s module
/// docs), else its launch bound.
fn vec_occupancy(cc: u32, head_dim: usize, kv: KvType) -> usize {
    match (cc, head_dim, kv) {
        (900, 128, KvType::F16) => 3,
        (900, 128, _) => 2,
        (900, 64, KvType::Q8_0) => 4,
        _ => 1,
    }
}

/// The MMA kernel's launch bound (blocks per SM) and KV tile (`nbatch_fa`) on Ampere and newer
/// (`ggml_cuda_fattn_mma_get_config_ampere`), for the head sizes the profile accepts.
fn mma_config(head_dim: usize, ncols: usize) -> (usize, usize) {
    match (head_dim, ncols) {
        (256, 8) => (4, 64),
        (256, 16) => (4, 32),
        (256, _) => (2, 32),
        (_, 8) => (2, 128),
        _ => (2, 64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::LayerOps;
    use crate::llama::tests::k;
    use crate::llama::Version;
    use crate::setup::Weights;

    #[test]
    fn the_two_versions_differ_only_in_the_kv_copies() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        for (n, n_kv) in [(512usize, 8192usize), (4096, 16384), (3, 768)] {
            let old = k(Version::B8833, Weights::F16, KvType::Q8_0)
                .attention(&m, n, n_kv)
                .unwrap();
            let new = k(Version::D99724f2, Weights::F16, KvType::Q8_0).attention(&m, n, n_kv);
            let names: Vec<_> = old.held.iter().take(2).map(|r| r.name).collect();
            assert_eq!(names, ["K_f16", "V_f16"]);
            assert_eq!(old.held[0].bytes, n_kv * 1024 * 2);
            assert_eq!(
                old.held[2..],
                new.map(|c| c.held).unwrap_or_default()[..],
                "n {n}"
            );
        }
        // The vector kernel (one or two tokens, head 128) reads the q8_0 cache itself: no
        // copies in either; Phi-3's head of 96 has no vector instance, and its one token goes
        // to the MMA kernel with copies.
        for n in [1, 2] {
            let old = k(Version::B8833, Weights::Q8_0, KvType::Q8_0).attention(&m, n, 4096);
            let new = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0).attention(&m, n, 4096);
            assert_eq!(old, new, "n {n}");
            assert!(old.unwrap().held.iter().all(|r| !r.name.ends_with("_f16")));
        }
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let old = k(Version::B8833, Weights::F16, KvType::Q8_0)
            .attention(&phi, 1, 4096)
            .unwrap();
        assert_eq!(old.held[0], req("K_f16", 4096 * 3072 * 2));
        // An f16 cache needs no copies in either.
        let old = k(Version::B8833, Weights::F16, KvType::F16).attention(&m, 512, 8192);
        let new = k(Version::D99724f2, Weights::F16, KvType::F16).attention(&m, 512, 8192);
        assert_eq!(old, new);
    }

    #[test]
    fn stream_k_meta_only_for_fractional_tiles() {
        let m = EngineModel::preset("llama3-8b").unwrap();
        let a = k(Version::D99724f2, Weights::F16, KvType::Q8_0);
        // 512 tokens, GQA 4: ncols2 4, ncols1 16, 32 × 8 = 256 tiles; 2 × 132 = 264 blocks,
        // rounded down to 256 loses 3%: one block per tile, no meta.
        assert!(a.mma_stream_k(&m, 512, 8192).is_empty());
        // 4096 tokens: 2048 tiles; 264 blocks do not divide them: meta for 264 × 64 columns,
        // and KV_max for the 256 column tiles.
        let r = a.mma_stream_k(&m, 4096, 8192);
        assert_eq!(r[0], req("KV_max", 256 * 4));
        assert_eq!(r[1], req("dst_tmp_meta", 264 * 64 * (2 + 64) * 8));
        // Phi-3 (no GQA, head 96): 512 tokens, 8 × 32 = 256 tiles, same rounding: none.
        let phi = EngineModel::preset("phi3-mini").unwrap();
        assert!(a.mma_stream_k(&phi, 512, 8192).is_empty());
        // A given occupancy changes the block count: 3 × 132 = 396 → rounded 256 loses 35%:
        // 396 blocks, meta.
        let mut b = k(Version::D99724f2, Weights::F16, KvType::Q8_0);
        b.dev.occupancy = Some(3);
        assert_eq!(
            b.mma_stream_k(&m, 512, 8192),
            [req("dst_tmp_meta", 396 * 64 * 66 * 8)]
        );
    }

    #[test]
    fn decode_goes_to_the_vector_kernel_where_ggml_sends_it() {
        let llama = EngineModel::preset("llama3-8b").unwrap();
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let q = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        assert!(q.vector_kernel(&llama, 1, 4096));
        assert!(q.vector_kernel(&llama, 2, 4096));
        assert!(!q.vector_kernel(&llama, 3, 4096));
        // Head 96: no vector instance.
        assert!(!q.vector_kernel(&phi, 1, 4096));
        // 32 heads, 4096 positions / 128 = 32 KV tiles, 2 blocks per SM (measured on an H100
        // for a q8_0 cache): 8 parallel blocks fill 97% of a wave.
        let r = q.vector_split(&llama, 1, 4096);
        assert_eq!(r[0], req("dst_tmp", 8 * 128 * 32 * 4));
        assert_eq!(r[1], req("dst_tmp_meta", 8 * 32 * 8));
        // At the launch bound (1 block per SM, as on another device) 4 fill 97% of a wave.
        let mut one = k(Version::D99724f2, Weights::Q8_0, KvType::Q8_0);
        one.dev.occupancy = Some(1);
        let r = one.vector_split(&llama, 1, 4096);
        assert_eq!(r[0], req("dst_tmp", 4 * 128 * 32 * 4));
    }
}
