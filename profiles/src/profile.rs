//! Engine profiles: the pool requests a real engine makes for one ubatch, op by op, in its
//! order, derived from its sources and checked against traces recorded inside it.
//!
//! A profile answers "what does ggml take from its per-device pool for this ubatch?" for one
//! upstream commit. The answer is a list of [`OpCall`]s: each op takes its [`OpCall::held`]
//! buffers in order and keeps them to its end, takes and returns each of its
//! [`OpCall::inner`] buffers one at a time meanwhile (a stream-k fixup per kernel launch), then
//! returns the held ones in reverse, as ggml's `ggml_cuda_pool_alloc` destructors do. That
//! order decides what a best-fit pool strands, so it is part of the answer, not a detail.
//!
//! Profiles ([`Profile`], dense models): `ik_llama` (ik_llama.cpp 8337e4cd, [`ik_llama`]),
//! `llama-b8833` and `llama` (llama.cpp before and after PR #23907, [`llama`]). Every profile
//! builds a layer in the same op order ([`graph`]); they differ in what each op's kernel takes.

mod graph;
pub mod ik_llama;
mod ik_mla;
pub mod llama;
mod sweep;

use crate::error::RuntimeError;
use cupool_kernels::KvType;
pub use sweep::{sweep_step, SweepStep, KV_PADDING};

/// Whose pool traffic a run takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// cupool's runtime: the flash-attention scratch (its own split heuristic) and the GEMM workspace.
    #[default]
    Cupool,
    /// A real engine's profile: every op's requests, on a device of `cc`, for the run's weight
    /// type.
    Profile {
        /// Which engine.
        profile: Profile,
        /// Compute capability (900 for 9.0); the SM count is the run's `sms`.
        cc: u32,
    },
}

impl EngineKind {
    /// `cupool`, or the profile's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cupool => "cupool",
            Self::Profile { profile, .. } => profile.name(),
        }
    }
}

/// A real engine, at the commit its profile models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Profile {
    /// ik_llama.cpp 8337e4cd (the seeds' engine; K/V f16 copies from the pool).
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
    /// `llama-b8833` is modelled as the report's build, which died in the legacy pool's malloc.
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
    /// ik_llama.cpp's logged buffers at `-ub 512` (docs/data): llama3-8b 266.50 MiB and
    /// qwen3-30b-a3b 304.75 MiB exactly (this stage is their peak); phi3-mini's 80.00 MiB and
    /// deepseek-v3's 388.13 MiB peak inside a layer instead.
    pub fn output_stage_bytes(self, m: &EngineModel, n_ubatch: usize) -> usize {
        (m.n_vocab + 2 * m.n_embd) * n_ubatch * 4
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
    pub fn layer(self, s: &Setup, u: UbatchShape, l: usize) -> Result<Vec<OpCall>, RuntimeError> {
        match self.version() {
            None => ik_llama::layer(s, u, l),
            Some(v) => llama::layer(v, s, u, l),
        }
    }

    /// The output matrix's requests (none without an output row or where its kernel takes
    /// nothing).
    pub fn output(self, s: &Setup, u: UbatchShape) -> Option<OpCall> {
        match self.version() {
            None => ik_llama::output(s, u),
            Some(v) => llama::output(v, s, u),
        }
    }

    /// The requests of a whole ubatch: every layer, then the output matrix.
    pub fn ubatch(self, s: &Setup, u: UbatchShape) -> Result<Vec<OpCall>, RuntimeError> {
        let mut calls = Vec::with_capacity(s.model.n_layer * 8 + 1);
        for l in 0..s.model.n_layer {
            calls.extend(self.layer(s, u, l)?);
        }
        calls.extend(self.output(s, u));
        Ok(calls)
    }

    fn version(self) -> Option<llama::Version> {
        match self {
            Self::IkLlama => None,
            Self::LlamaB8833 => Some(llama::Version::B8833),
            Self::Llama => Some(llama::Version::D99724f2),
        }
    }
}

/// What a profile is asked about: the model, how its weights are stored, the cache's type and
/// the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// The model.
    pub model: EngineModel,
    /// Its weights' type.
    pub weights: Weights,
    /// The KV cache's type.
    pub kv: KvType,
    /// The GPU.
    pub dev: Device,
}

/// The shape of one ubatch: its tokens, the (padded) cache positions they attend to, and the
/// rows that produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UbatchShape {
    /// Tokens.
    pub n_tokens: usize,
    /// Padded KV length.
    pub n_kv: usize,
    /// Output rows (0 for all but a prompt's last ubatch).
    pub n_outputs: usize,
}

use cupool_pool::trace::TraceEvent;

/// The device facts the kernels' launch choices read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    /// Compute capability as ggml writes it: 900 for 9.0.
    pub cc: u32,
    /// Streaming multiprocessors: stream-k kernels launch this many blocks.
    pub nsm: usize,
    /// Blocks per SM of mainline's flash-attention kernels, as the CUDA runtime reports for
    /// the engine's compiled kernel. `None`: as measured for compute capability 9.0, else the
    /// kernel's launch bound (see [`llama`]).
    /// ik_llama.cpp does not read it.
    pub occupancy: Option<usize>,
}

impl Device {
    /// An H100 SXM or H200 (132 SMs, compute capability 9.0).
    pub const H100_SXM: Device = Device {
        cc: 900,
        nsm: 132,
        occupancy: None,
    };

    /// A device of compute capability `cc` with `nsm` SMs.
    pub fn new(cc: u32, nsm: usize) -> Self {
        Self {
            cc,
            nsm,
            occupancy: None,
        }
    }
}

/// How an engine's weight matrices are stored: it decides the matrix-multiply path. In cupool's
/// runtime, q8_0 weights are converted to f16 (`src0_f16`, from the pool) before each cuBLAS
/// GEMM, as ggml's cuBLAS path converts a quantized `src0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Weights {
    /// f16: cuBLAS, with the activations converted to f16 and an f16 result converted back.
    #[default]
    F16,
    /// q8_0: MMQ for batches above 8 (activations quantized to q8_1, stream-k fixup), MMVQ below.
    Q8_0,
}

impl Weights {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
        }
    }

    /// Bytes of a row of `n` weights (`n` a multiple of 32 for q8_0).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            Self::F16 => n * 2,
            Self::Q8_0 => cupool_kernels::KvType::Q8_0.row_bytes(n),
        }
    }

    /// `f16` or `q8_0`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(Self::F16),
            "q8_0" => Some(Self::Q8_0),
            _ => None,
        }
    }
}

/// How the model's graph is built: which projections are one matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Phi-3: one QKV matrix, one gate-and-up matrix (`2 × n_ff` wide).
    Phi3,
    /// Llama: Q, K, V, gate and up matrices of their own.
    Llama,
    /// Qwen3-MoE: Llama's projections; ik_llama.cpp's graph for it keeps a lone token's row
    /// through the last layer whether or not it asks for logits.
    Qwen3Moe,
}

/// The mixture of experts of a model's feed-forward layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token is routed to.
    pub n_expert_used: usize,
    /// An expert's FFN width.
    pub n_ff_exp: usize,
}

/// DeepSeek's multi-head latent attention: the cache holds a compressed KV row per token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mla {
    /// Rank of Q's low-rank projection.
    pub q_lora: usize,
    /// Rank of the compressed KV (the cache row, before the rotary part).
    pub kv_lora: usize,
    /// The rotary part of a K head (the rest of `head_dim` has none).
    pub rope: usize,
    /// A V head.
    pub v_head: usize,
    /// ik_llama.cpp's `-amb` (attention max batch, MiB): the prompt path decompresses the cache
    /// in head chunks whose f32 K/V fits it; 0: no limit. 256 in llama-cli, llama-server and
    /// llama-sweep-bench, 0 in llama-bench.
    pub attn_max_batch_mib: usize,
}

/// A model as an engine's graph sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineModel {
    /// Graph shape.
    pub arch: Arch,
    /// Layers.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension (K, V and Q alike).
    pub head_dim: usize,
    /// FFN width (dense layers).
    pub n_ff: usize,
    /// Vocabulary: the output matrix's rows.
    pub n_vocab: usize,
    /// The experts, for a mixture-of-experts model (the FFN of every layer from `n_dense_lead`).
    pub moe: Option<Moe>,
    /// Layers before the first expert layer (dense FFN of `n_ff`).
    pub n_dense_lead: usize,
    /// Width of the shared experts run beside the routed ones (0: none).
    pub n_ff_shared: usize,
    /// Multi-head latent attention (`head_dim` is then a K head: rotary part included).
    pub mla: Option<Mla>,
}

impl EngineModel {
    /// The presets profiles model: `phi3-mini`, `llama3-8b` (dense), `qwen3-30b-a3b` (128
    /// experts, 8 per token; its Q/K norms take nothing from the pool) and `deepseek-v3` (MLA,
    /// 3 dense layers, then 256 experts, 8 per token, and a shared one).
    pub fn preset(name: &str) -> Option<Self> {
        if name == "deepseek-v3" {
            return Some(Self {
                arch: Arch::Llama,
                n_layer: 61,
                n_embd: 7168,
                n_head: 128,
                n_head_kv: 128,
                head_dim: 192,
                n_ff: 18432,
                n_vocab: 129280,
                moe: Some(Moe {
                    n_expert: 256,
                    n_expert_used: 8,
                    n_ff_exp: 2048,
                }),
                n_dense_lead: 3,
                n_ff_shared: 2048,
                mla: Some(Mla {
                    q_lora: 1536,
                    kv_lora: 512,
                    rope: 64,
                    v_head: 128,
                    attn_max_batch_mib: 256,
                }),
            });
        }
        let (arch, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, moe) = match name {
            "phi3-mini" => (Arch::Phi3, 32, 3072, 32, 32, 96, 8192, 32064, None),
            "llama3-8b" => (Arch::Llama, 32, 4096, 32, 8, 128, 14336, 128256, None),
            "qwen3-30b-a3b" => {
                let moe = Moe {
                    n_expert: 128,
                    n_expert_used: 8,
                    n_ff_exp: 768,
                };
                (
                    Arch::Qwen3Moe,
                    48,
                    2048,
                    32,
                    4,
                    128,
                    6144,
                    151936,
                    Some(moe),
                )
            }
            _ => return None,
        };
        Some(Self {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            moe,
            n_dense_lead: 0,
            n_ff_shared: 0,
            mla: None,
        })
    }

    /// The presets' names.
    pub const PRESETS: [&'static str; 4] =
        ["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"];

    /// Whether layer `l`'s FFN is the experts.
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.is_some() && l >= self.n_dense_lead
    }

    /// K (or V) values of one token across the KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Q values of one token across the heads (the attention output's width).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}

/// One buffer an op takes from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// ggml's name for it where the engine gives one (`K_f16`), else the op's (`MUL_MAT`).
    pub name: &'static str,
    /// Bytes asked for.
    pub bytes: usize,
}

/// What an op is, for an engine that runs its own kernels between the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A matrix multiply (or a fused pair).
    MatMul,
    /// Flash attention: its held buffers start with `K_f16` and `V_f16` for a quantized cache.
    FlashAttention,
}

/// The pool traffic of one op (see the module docs for the order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCall {
    /// What the op is.
    pub kind: OpKind,
    /// Taken in order, returned in reverse at the op's end.
    pub held: Vec<Request>,
    /// Each taken and returned in turn while `held` is live.
    pub inner: Vec<Request>,
    /// Steps of the op that run after `inner` while `held` is live, each with buffers of its
    /// own (ik_llama.cpp's fused expert op: the up/gate results, then the down projection's).
    pub nested: Vec<OpCall>,
    /// How many times the op runs in a row (MLA's head chunks): 1 for most.
    pub repeat: usize,
}

impl OpCall {
    /// An op that holds `held` and takes each of `inner` in turn.
    pub fn new(kind: OpKind, held: Vec<Request>, inner: Vec<Request>) -> Self {
        Self {
            kind,
            held,
            inner,
            nested: vec![],
            repeat: 1,
        }
    }

    /// Request sizes as `Purge::KeepFor` takes them: each held one, the largest inner one,
    /// and those of the nested steps (counted together: at least what the op holds at once).
    pub fn request_bytes(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.held.iter().map(|r| r.bytes).collect();
        out.extend(self.inner.iter().map(|r| r.bytes).max());
        for n in &self.nested {
            out.extend(n.request_bytes());
        }
        out
    }
}

/// The calls as trace events (allocations numbered from `first_id`, stream 0), the format
/// libcupool records and `repro-prefill replay` reads; returns the next free id.
pub fn trace_events(calls: &[OpCall], first_id: u64, out: &mut Vec<TraceEvent>) -> u64 {
    let mut id = first_id;
    let alloc = |id: &mut u64, r: &Request, out: &mut Vec<TraceEvent>| {
        out.push(TraceEvent::Alloc {
            id: *id,
            size: r.bytes,
            stream: 0,
            name: Some(r.name.to_string()),
        });
        *id += 1;
        *id - 1
    };
    for c in calls {
        for _ in 0..c.repeat {
            let held: Vec<u64> = c.held.iter().map(|r| alloc(&mut id, r, out)).collect();
            for r in &c.inner {
                let i = alloc(&mut id, r, out);
                out.push(TraceEvent::Free { id: i });
            }
            id = trace_events(&c.nested, id, out);
            for i in held.into_iter().rev() {
                out.push(TraceEvent::Free { id: i });
            }
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
