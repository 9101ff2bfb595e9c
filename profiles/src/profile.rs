//! The engines profiled ([`Profile`]): which commit each models, what each asks of the pool
//! for a ubatch, and the device memory each takes beside its pool (startup reservations, the
//! compute buffer's lower bound, cuBLAS's workspace).

use crate::error::ProfileError;
use crate::model::{Arch, EngineModel};
use crate::op::OpCall;
use crate::setup::{Setup, UbatchShape, Weights};
use crate::{ik_llama, llama};
use cupool_kernels::KvType;

/// A real engine, at the commit its profile models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Profile {
    /// ik_llama.cpp 8337e4cd (whose 12 GiB-card prefill runs out in its legacy pool; K/V f16
    /// copies from the pool).
    #[default]
    IkLlama,
    /// llama.cpp before PR #23907 (b8833, the Windows 7 report): K/V f16 copies from the pool.
    LlamaB8833,
    /// llama.cpp after PR #23907 (ggml d99724f2): K/V f16 copies in the compute buffer, legacy
    /// pool flushes and retries on OOM (PR #22155).
    Llama,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 3] = [Self::IkLlama, Self::LlamaB8833, Self::Llama];

    /// `ik_llama`, `llama-b8833` or `llama`.
    pub fn name(self) -> &'static str {
        match self {
            Self::IkLlama => "ik_llama",
            Self::LlamaB8833 => "llama-b8833",
            Self::Llama => "llama",
        }
    }

    /// The upstream commit (or release) it models.
    pub fn commit(self) -> &'static str {
        match self {
            Self::IkLlama => ik_llama::COMMIT,
            Self::LlamaB8833 => llama::Version::B8833.commit(),
            Self::Llama => llama::Version::D99724f2.commit(),
        }
    }

    /// By name (`ik-llama` and `llama_b8833` too).
    pub fn parse(s: &str) -> Option<Self> {
        match s.replace('-', "_").as_str() {
            "ik_llama" => Some(Self::IkLlama),
            "llama_b8833" => Some(Self::LlamaB8833),
            "llama" => Some(Self::Llama),
            _ => None,
        }
    }

    /// Whether the engine's legacy pool flushes its cache and retries once when the device is
    /// out of memory (ggml PR #22155): mainline's does; ik_llama.cpp's has no such path, and
    /// `llama-b8833` is modelled as build b8833, which dies in the legacy pool's malloc.
    pub fn legacy_flush_and_retry(self) -> bool {
        self == Self::Llama
    }

    /// Bytes the engine's startup reservation adds to the compute buffer for flash attention
    /// over a context of `n_ctx` (mainline after #23907: the f16 copies of a quantized cache).
    pub fn startup_extra_bytes(self, m: &EngineModel, kv: KvType, n_ctx: usize) -> usize {
        match self {
            Self::IkLlama => 0,
            Self::LlamaB8833 => llama::startup_extra_bytes(llama::Version::B8833, m, kv, n_ctx),
            Self::Llama => llama::startup_extra_bytes(llama::Version::D99724f2, m, kv, n_ctx),
        }
    }

    /// A lower bound of the engine's compute buffer for ubatches of `n_ubatch` tokens: ggml
    /// reserves it for the worst-case graph, in which every row asks for logits, so it holds
    /// the f32 logits of all rows beside the final norm's input and output when the output
    /// matrix runs. The runtime takes the larger of this and its own compute layout. Against
    /// ik_llama.cpp's logged buffers at `-ub 512` (profiles/tests/data): llama3-8b 266.50 MiB
    /// and qwen3-30b-a3b 304.75 MiB exactly (this stage is their peak); phi3-mini's 80.00 MiB
    /// ([`Profile::layer_stage_bytes`]) and deepseek-v3's 388.13 MiB peak inside a layer
    /// instead.
    pub fn output_stage_bytes(self, m: &EngineModel, n_ubatch: usize) -> usize {
        (m.n_vocab + 2 * m.n_embd) * n_ubatch * 4
    }

    /// Another lower bound of ik_llama.cpp's compute buffer, where Phi-3's peak lies: the
    /// feed-forward stage of a layer beside the flash-attention mask. The worst-case graph's
    /// mask is a graph input every layer reads, so it lives through them all: f16, `n_ctx`
    /// wide and `n_ubatch` rows padded to `GGML_KQ_MASK_PAD` (16) (`build_inp_KQ_mask`). At
    /// the feed-forward stage the residual and the normed input (f32, `n_embd` wide) sit beside
    /// the gate-and-up matrix's output (`2 × n_ff`) and the activation's (`n_ff`). Against the
    /// buffers ik_llama.cpp logged for phi3-mini f16 at `-ub 512`: 80.00 MiB at 20,480
    /// positions and 84.00 MiB at 24,576 (data/h100-2026-11-27-ik-warmup), exactly. Only for
    /// Phi-3 (its one gate-and-up matrix); 0 for the other models and engines, whose peak this
    /// stage does not reach at the contexts checked (the output stage's, above).
    pub fn layer_stage_bytes(self, m: &EngineModel, n_ubatch: usize, n_ctx: usize) -> usize {
        if self != Self::IkLlama || m.arch != Arch::Phi3 || m.moe.is_some() || m.mla.is_some() {
            return 0;
        }
        let mask = n_ctx * n_ubatch.next_multiple_of(16) * 2;
        (2 * m.n_embd + 3 * m.n_ff) * n_ubatch * 4 + mask
    }

    /// Device memory the engine takes outside its pool and its startup buffers, which no
    /// reservation of its own counts: the workspace cuBLAS allocates with the handle ggml
    /// creates on the first cuBLAS call of a (device, stream), 32 MiB on Hopper and newer and
    /// 4 MiB before (cuBLAS's defaults). Taken where the engine calls cuBLAS: f16 weights
    /// (above 16 tokens on mainline, always on ik_llama.cpp), an f32 router (mixture of
    /// experts), MLA's decompression.
    pub fn outside_pool_bytes(self, m: &EngineModel, weights: Weights, cc: u32) -> usize {
        let cublas = weights == Weights::F16 || m.moe.is_some() || m.mla.is_some();
        match (cublas, cc >= 900) {
            (false, _) => 0,
            (true, true) => 32 << 20,
            (true, false) => 4 << 20,
        }
    }

    /// The requests of layer `l` of ubatch `u`.
    pub fn layer(self, s: &Setup, u: UbatchShape, l: usize) -> Result<Vec<OpCall>, ProfileError> {
        match self.llama_version() {
            None => ik_llama::layer(s, u, l),
            Some(v) => llama::layer(v, s, u, l),
        }
    }

    /// [`Profile::layer`] in parts: the requests of layer `l` before its attention and after
    /// it, for a ubatch of `n_tokens` tokens and `n_outputs` output rows. Only the attention
    /// sees the KV length, so a run's ubatches of one size share these; [`Profile::attention`]
    /// goes between them, and refuses what [`Profile::layer`] refuses (these are unchecked).
    pub fn layer_around(
        self,
        s: &Setup,
        n_tokens: usize,
        n_outputs: usize,
        l: usize,
    ) -> (Vec<OpCall>, Vec<OpCall>) {
        match self.llama_version() {
            None => ik_llama::around(s, n_tokens, n_outputs, l),
            Some(v) => llama::around(v, s, n_tokens, n_outputs, l),
        }
    }

    /// The attention's requests in a layer of ubatch `u`, between [`Profile::layer_around`]'s
    /// parts.
    pub fn attention(self, s: &Setup, u: UbatchShape) -> Result<Vec<OpCall>, ProfileError> {
        match self.llama_version() {
            None => ik_llama::attention(s, u),
            Some(v) => llama::attention(v, s, u),
        }
    }

    /// The output matrix's requests (none without an output row or where its kernel takes
    /// nothing).
    pub fn output(self, s: &Setup, u: UbatchShape) -> Option<OpCall> {
        match self.llama_version() {
            None => ik_llama::output(s, u),
            Some(v) => llama::output(v, s, u),
        }
    }

    /// The requests of a whole ubatch: every layer, then the output matrix.
    pub fn ubatch(self, s: &Setup, u: UbatchShape) -> Result<Vec<OpCall>, ProfileError> {
        let mut calls = Vec::with_capacity(s.model.n_layer * 8 + 1);
        for l in 0..s.model.n_layer {
            calls.extend(self.layer(s, u, l)?);
        }
        calls.extend(self.output(s, u));
        Ok(calls)
    }

    /// The decode the engine's tools run before the first real one (unless `--no-warmup`), as
    /// the setup and ubatch it runs: `None` where the profile models none.
    ///
    /// ik_llama.cpp's tools all decode the BOS token alone at position 0 (`test_prompt(ctx, 1,
    /// ...)` in llama-bench, `llama_init_from_gpt_params` for llama-server and llama-cli, with
    /// its logits; sweep-bench's own warm-up without, so `n_outputs` is 1 or 0), and a first
    /// decode of one BOS token routes every token to every expert (`llm_build_context`'s
    /// `n_expert_used` while `is_warming_up`). The shim marks no ubatch end after a one-token
    /// decode, so its requests share the first ubatch's phase; in a legacy pool that is never
    /// purged its blocks stay (3.1–3.4 MiB of the dense llama-bench runs' reserve, 13.4 MiB of
    /// the MoE sweeps', data/h100x2-2026-11-27-ik-predict).
    ///
    /// Mainline's profiles model none: their plans are checked against `llama-bench`, whose
    /// warm-up runs the whole prompt, and the measured pass takes the same blocks again.
    pub fn warm_up(self, s: &Setup, n_outputs: usize) -> Option<(Setup, UbatchShape)> {
        if self != Self::IkLlama {
            return None;
        }
        let mut warm = s.clone();
        if let Some(moe) = &mut warm.model.moe {
            moe.n_expert_used = moe.n_expert;
        }
        let u = UbatchShape {
            n_tokens: 1,
            n_kv: crate::sweep::KV_PADDING,
            n_outputs: n_outputs.min(1),
        };
        Some((warm, u))
    }

    /// The mainline build a mainline profile models; `None` for ik_llama.cpp.
    pub fn llama_version(self) -> Option<llama::Version> {
        match self {
            Self::IkLlama => None,
            Self::LlamaB8833 => Some(llama::Version::B8833),
            Self::Llama => Some(llama::Version::D99724f2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;
    use cupool_kernels::KvType;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// A layer is the ops around its attention with the attention between them, for every
        /// profile, preset, type and ubatch, refusals included; the parts around it are the same
        /// whatever the KV length.
        #[test]
        fn a_layer_is_its_attention_between_the_ops_around_it(
            profile in prop::sample::select(Profile::ALL.to_vec()),
            model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
            weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
            kv in prop::sample::select(vec![KvType::Q8_0, KvType::F16]),
            n_layer in 1usize..8,
            l in any::<usize>(),
            n_tokens in 0usize..3000,
            n_outputs in 0usize..3,
            n_kv in 0usize..400_000,
            other_kv in 0usize..400_000,
            nsm in prop::sample::select(vec![0usize, 66, 132]),
        ) {
            let mut model = EngineModel::preset(model).unwrap();
            model.n_layer = n_layer;
            model.n_dense_lead = model.n_dense_lead.min(n_layer.saturating_sub(1));
            let s = Setup {
                model,
                weights,
                kv,
                dev: Device { cc: 900, nsm, occupancy: None },
            };
            let l = l % n_layer;
            let u = UbatchShape { n_tokens, n_kv, n_outputs };
            // The parts are asked only of a ubatch the attention accepts (they are unchecked).
            let attention = match profile.attention(&s, u) {
                Ok(a) => a,
                Err(e) => {
                    prop_assert_eq!(Err(e), profile.layer(&s, u, l));
                    return Ok(());
                }
            };
            let (before, after) = profile.layer_around(&s, n_tokens, n_outputs, l);
            let parts = [before.clone(), attention, after.clone()].concat();
            prop_assert_eq!(Ok(parts), profile.layer(&s, u, l));
            let other = UbatchShape { n_kv: other_kv, ..u };
            if let (Ok(_), Ok(whole)) = (profile.attention(&s, other), profile.layer(&s, other, l)) {
                prop_assert_eq!(&whole[..before.len()], &before[..]);
                prop_assert_eq!(&whole[whole.len() - after.len()..], &after[..]);
            }
        }
    }

    #[test]
    fn the_cublas_workspace_counts_where_the_engine_calls_cublas() {
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let qwen = EngineModel::preset("qwen3-30b-a3b").unwrap();
        let ds = EngineModel::preset("deepseek-v3").unwrap();
        for p in Profile::ALL {
            assert_eq!(p.outside_pool_bytes(&phi, Weights::F16, 900), 32 << 20);
            assert_eq!(p.outside_pool_bytes(&phi, Weights::F16, 860), 4 << 20);
            // q8_0 dense layers run MMQ/MMVQ only; the router of experts is f32 (cuBLAS), and
            // MLA decompresses its cache through cuBLAS.
            assert_eq!(p.outside_pool_bytes(&phi, Weights::Q8_0, 900), 0);
            assert_eq!(p.outside_pool_bytes(&qwen, Weights::Q8_0, 900), 32 << 20);
            assert_eq!(p.outside_pool_bytes(&ds, Weights::Q8_0, 900), 32 << 20);
        }
        assert_eq!(Profile::parse("ik-llama"), Some(Profile::IkLlama));
        assert_eq!(Profile::parse("llama_b8833"), Some(Profile::LlamaB8833));
        assert_eq!(Profile::parse("vllm"), None);
        assert!(Profile::ALL
            .iter()
            .all(|p| Profile::parse(p.name()) == Some(*p)));
    }

    /// Phi-3's feed-forward stage beside the mask is the buffer ik_llama.cpp logged at two
    /// contexts (data/h100-2026-11-27-ik-warmup); no other model or engine has it.
    #[test]
    fn phi3_s_layer_stage_is_the_engine_s_buffer() {
        let phi = EngineModel::preset("phi3-mini").unwrap();
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        assert_eq!(
            mib(Profile::IkLlama.layer_stage_bytes(&phi, 512, 20480)),
            80.0
        );
        assert_eq!(
            mib(Profile::IkLlama.layer_stage_bytes(&phi, 512, 24576)),
            84.0
        );
        // Rows of the mask padded to 16.
        let padded = Profile::IkLlama.layer_stage_bytes(&phi, 500, 1000);
        assert_eq!(padded, (2 * 3072 + 3 * 8192) * 500 * 4 + 1000 * 512 * 2);
        for name in ["llama3-8b", "qwen3-30b-a3b", "deepseek-v3"] {
            let m = EngineModel::preset(name).unwrap();
            assert_eq!(
                Profile::IkLlama.layer_stage_bytes(&m, 512, 20480),
                0,
                "{name}"
            );
        }
        for p in [Profile::Llama, Profile::LlamaB8833] {
            assert_eq!(p.layer_stage_bytes(&phi, 512, 20480), 0);
        }
    }
}
