//! Command-line arguments: the subcommands and their options, with their help and defaults.
//! The values of the library's enums are parsed from its tables ([`crate::values`]).

use crate::values::{self, Engine};
use clap::{Args, Parser, Subcommand, ValueEnum};
use cupool::kernels::KvType;
use cupool::pool::{PoolKind, PurgePolicy};
use cupool::runtime::profile::Profile;
use cupool::runtime::BudgetMode;
use std::path::PathBuf;

/// Reproduces the long-context prefill OOM of llama.cpp-style engines and shows each fix.
///
/// With no pool chosen (no --pool, no GGML_POOL), runs the default scenario (a Phi-3-mini
/// shaped model with f16 weights, a 20,000-token prompt, q8_0 KV cache, -b 2048 -ub 512, on a
/// 12 GiB card such as an RTX 3060) once per configuration (legacy/never, legacy/always, legacy/auto, vmm, managed, vmm with the
/// planned budget) and prints a table. Exit codes: 0 success (a comparison that ran, even
/// if some configurations ran out of memory), 1 error, 2 bad arguments, 3 does not fit: a
/// single run that ran out of memory, a comparison none of whose configurations fit the card
/// at startup, or a plan that does not fit.
#[derive(Parser, Debug)]
#[command(
    name = "repro-prefill",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true,
    allow_negative_numbers = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a prefill (the default).
    #[command(allow_negative_numbers = true)]
    Run(RunArgs),
    /// Print the memory budget without running, from the free memory before the engine starts
    /// (--free): weights, KV, compute buffer, what lies outside them, the pool's reserve over
    /// the prefill, whether it fits, where a run dies if not, the peak device memory, the
    /// largest context that fits, and what to do.
    #[command(
        allow_negative_numbers = true,
        mut_arg("vram", |a| a.hide(true)),
        // A run's options that a plan has no use for: out of its help, refused if given.
        mut_arg("compute", |a| a.hide(true)),
        mut_arg("budget", |a| a.hide(true)),
        mut_arg("fallback_managed", |a| a.hide(true)),
        mut_arg("plot", |a| a.hide(true)),
        mut_arg("trace", |a| a.hide(true)),
        mut_arg("yes", |a| a.hide(true))
    )]
    Plan(RunArgs),
    /// Replay an allocation trace (JSON lines, plain or gzipped) through a pool on the simulated
    /// device.
    #[command(allow_negative_numbers = true)]
    Replay(ReplayArgs),
    /// Predict what a real engine asks of its pool for a prefill (its profile's requests, op by
    /// op, replayed through a pool on the simulated device): peak reserve, driver calls, and with
    /// --free GiB free before the engine starts, the token where the engine runs out.
    #[command(allow_negative_numbers = true)]
    Predict(PredictArgs),
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    /// The engine (and commit) whose requests to predict.
    #[arg(long, value_parser = values::engine_profile(), default_value = "ik-llama")]
    pub engine: Profile,
    /// Model preset: phi3-mini, llama3-8b; qwen3-30b-a3b, deepseek-v3 (q8_0 weights).
    #[arg(long, default_value = "phi3-mini")]
    pub model: String,
    /// A GGUF model file: its header gives the model's shape, its weights' type and their
    /// bytes (the tensors the engines keep on the device), in place of --model and
    /// --weight-type. Only the header is read.
    #[arg(long, conflicts_with_all = ["model", "weight_type"])]
    pub gguf: Option<PathBuf>,
    /// ik_llama.cpp's `-amb` (MiB) for deepseek-v3: the prompt path decompresses the cache in
    /// head chunks whose f32 K/V fits it; 0: no limit (llama-bench's default).
    #[arg(long, default_value_t = 256)]
    pub amb: usize,
    /// Weight type, any of ggml's f32, f16, bf16, q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1,
    /// q4_0: its size gives the weights' bytes; float types take the cuBLAS path, quantized
    /// ones MMQ (default: f16; q8_0 for the mixture-of-experts presets, whose float experts the
    /// profiles do not model).
    #[arg(long)]
    pub weight_type: Option<String>,
    /// KV cache type.
    #[arg(long, value_parser = values::kv_type(), default_value = "q8_0")]
    pub kv_type: KvType,
    /// Prompt tokens (logits for each batch's last one, as llama-cli and llama-bench ask).
    #[arg(long, default_value_t = 20000)]
    pub prompt: usize,
    /// Tokens per batch (`-b`).
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// Tokens per ubatch.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// Instead of a prompt, llama-sweep-bench -n 1 over this many steps.
    #[arg(long)]
    pub sweep: Option<usize>,
    /// Leave out the engine's warm-up decode, as the engines' own `--no-warmup` does
    /// (ik_llama.cpp decodes the BOS token alone first, every expert of a mixture of experts
    /// routed; its blocks stay in a legacy pool that is never purged; where it multiplies
    /// through cuBLAS, its captured graph takes a second workspace the driver gives back to
    /// the pool: the first compute then needs 32 MiB less, the pool's room is the same).
    #[arg(long)]
    pub no_warmup: bool,
    /// The GPU's streaming multiprocessors (132: H100 SXM, H200).
    #[arg(long, default_value_t = 132)]
    pub sm: usize,
    /// The GPU's compute capability.
    #[arg(long, default_value = "9.0")]
    pub cc: String,
    /// Blocks per SM of mainline's flash-attention kernel, as the engine's binary reports it
    /// (default: as measured for sm_90 on an H100 at compute capability 9.0, else the launch bound).
    #[arg(long)]
    pub fa_occupancy: Option<usize>,
    /// Pool (default vmm, libcupool's on a device with VMM: what llama.cpp gets with GGML_POOL
    /// set).
    #[arg(long, value_parser = values::pool_kind(), ignore_case = true, default_value = "vmm")]
    pub pool: PoolKind,
    /// Purge policy at ubatch boundaries (default auto, libcupool's CUPOOL_PURGE default: what
    /// the next ubatch asks for first stays).
    #[arg(long, value_parser = values::purge(), default_value = "auto")]
    pub purge: PurgePolicy,
    /// Context length (`-c`): the KV cache and the engine's compute buffer are sized for it
    /// (default: the prompt, or the sweep's steps, rounded up to 256).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Free device memory in GiB before the engine starts, as nvidia-smi shows it: the weights,
    /// the KV cache, the compute buffer and what lies outside them (CUDA context, cuBLAS
    /// workspace, kernel modules, mainline's start-up hold) come out of it; the pool gets the
    /// rest (default: a card the pool never fills).
    #[arg(long)]
    pub free: Option<f64>,
    /// Write the predicted requests to this file as a trace (`replay` reads it).
    #[arg(long)]
    pub trace_out: Option<PathBuf>,
    /// Output format (csv: a header line and one row).
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
    /// Only the result and errors on stderr (a predicted out-of-memory is a result).
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// CUDA when a GPU is usable, else the simulated device.
    Auto,
    Cuda,
    Sim,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ComputeArg {
    /// No maths: allocations only (the default on the simulated device).
    DryRun,
    /// Reference maths on the simulated device (small shapes).
    Cpu,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Table,
    Json,
    Csv,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Device: cuda, the simulated device, or auto (cuda when usable).
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceArg,
    /// Maths on the simulated device.
    #[arg(long, value_enum)]
    pub compute: Option<ComputeArg>,
    /// Model preset: phi3-mini, llama3-8b, qwen3-30b-a3b, deepseek-v3.
    #[arg(long, default_value = "phi3-mini")]
    pub model: String,
    /// A GGUF model file: its header gives the model's shape, its weights' type and their
    /// bytes (the tensors the engines keep on the device), in place of --model, --weight-type
    /// and the dimensions' overrides. Only the header is read.
    #[arg(long, conflicts_with_all = [
        "model", "weight_type", "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k",
        "head_dim_v", "v_is_k", "n_ff",
    ])]
    pub gguf: Option<PathBuf>,
    /// Layers (overrides the preset).
    #[arg(long)]
    pub n_layer: Option<usize>,
    /// Embedding width.
    #[arg(long)]
    pub n_embd: Option<usize>,
    /// Query heads.
    #[arg(long)]
    pub n_head: Option<usize>,
    /// KV heads.
    #[arg(long)]
    pub n_head_kv: Option<usize>,
    /// K head dimension.
    #[arg(long)]
    pub head_dim_k: Option<usize>,
    /// V head dimension.
    #[arg(long)]
    pub head_dim_v: Option<usize>,
    /// V is a view of K (MLA).
    #[arg(long)]
    pub v_is_k: bool,
    /// FFN width.
    #[arg(long)]
    pub n_ff: Option<usize>,
    /// KV cache type.
    #[arg(long, value_parser = values::kv_type(), default_value = "q8_0")]
    pub kv_type: KvType,
    /// Whose pool traffic: cupool (the runtime's flash-attention scratch and GEMM buffers), or
    /// an engine profile: ik-llama (ik_llama.cpp 8337e4cd), llama-b8833 or llama (llama.cpp
    /// before and after PR #23907), their requests op by op as `predict` models them (dense
    /// presets; in plan, and in runs on the simulated device that compute nothing).
    #[arg(long, value_parser = values::engine(), default_value = "cupool")]
    pub engine: Engine,
    /// Blocks per SM of mainline's flash-attention kernel (llama profiles; default: as
    /// measured for sm_90 on an H100 at compute capability 9.0, else the launch bound).
    #[arg(long)]
    pub fa_occupancy: Option<usize>,
    /// The weights' type, any of ggml's f32, f16, bf16, q8_0, q6_k, q5_k, q5_1, q5_0, q4_k,
    /// q4_1, q4_0: its size gives the weights' bytes (all but the token embedding, which the
    /// engines keep in host memory); float types take the cuBLAS path, quantized ones the q8_0
    /// path (cupool's runtime converts to f16 for each GEMM, in a pool buffer). Default: f16;
    /// with an engine profile, q8_0 for the mixture-of-experts presets.
    #[arg(long)]
    pub weight_type: Option<String>,
    /// Context length.
    #[arg(long, default_value_t = 20480)]
    pub ctx: usize,
    /// Prompt tokens (default: 20000, or the context if shorter; `plan`: the context).
    #[arg(long)]
    pub prompt: Option<usize>,
    /// Logical batch.
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// Physical batch (ubatch).
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// With an engine profile: leave out the engine's warm-up decode, as the engines' own
    /// `--no-warmup` does (ik_llama.cpp decodes the BOS token alone first, every expert of a
    /// mixture of experts routed; its blocks stay in a legacy pool that is never purged; where
    /// it multiplies through cuBLAS, its captured graph takes a second workspace the driver
    /// gives back to the pool: the first compute then needs 32 MiB less, the room is the same).
    #[arg(long)]
    pub no_warmup: bool,
    /// Resident weights in GiB (default: the model's tensors in --weight-type on the device,
    /// e.g. 6.93 GiB for Phi-3-mini in f16).
    #[arg(long)]
    pub weights: Option<f64>,
    /// The card's size in GiB: the simulated device's (default 12, an RTX 3060's); on cuda, a
    /// smaller card the run's allocations are limited to (default: the whole GPU). Not the
    /// room of the pool: that is derived from --free.
    #[arg(long)]
    pub vram: Option<f64>,
    /// Free device memory in GiB before the engine starts, as nvidia-smi shows it (run:
    /// default the whole card; plan: default 12). What the engine takes outside its buffers and
    /// pool comes out of it first (CUDA context, cuBLAS workspace, kernel modules, mainline's
    /// start-up hold: `plan` lists them); the buffers and the pool share the rest.
    #[arg(long)]
    pub free: Option<f64>,
    /// The GPU's compute capability, MAJOR.MINOR (cuBLAS's workspace and the profiles read it;
    /// on cuda the GPU's own).
    #[arg(long, default_value = "9.0")]
    pub cc: String,
    /// Pool (default: GGML_POOL; without it, `run` compares every configuration and `plan`
    /// takes libcupool's default, vmm where the device supports VMM, else legacy).
    #[arg(long, value_parser = values::pool_kind(), ignore_case = true)]
    pub pool: Option<PoolKind>,
    /// Purge policy at prefill ubatch boundaries (default auto, libcupool's CUPOOL_PURGE
    /// default: what llama.cpp gets with GGML_POOL set).
    #[arg(long, value_parser = values::purge(), default_value = "auto")]
    pub purge: PurgePolicy,
    /// With --purge auto: return memory only while the device's free memory is below this:
    /// `ubatch` (twice what the ubatch just ended held at once), a number of MiB, or `inf`
    /// (at every boundary with something to return). As libcupool's CUPOOL_AUTO_HEADROOM.
    #[arg(long, default_value = "ubatch")]
    pub auto_headroom: String,
    /// Budget mode.
    #[arg(long, value_parser = values::budget(), default_value = "ggml")]
    pub budget: BudgetMode,
    /// Serve allocations from managed memory when the device is full.
    #[arg(long)]
    pub fallback_managed: bool,
    /// Output format (csv: run, a row per ubatch of each configuration; plan, a header line
    /// and one row).
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
    /// Write the timeline of the pool's memory to this file: PNG or SVG, by its extension.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Record the pool's allocation trace (JSON lines).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Start a --compute cpu run estimated to take longer than 10 minutes (refused without it).
    #[arg(long)]
    pub yes: bool,
    /// Only the result and errors on stderr: no notes, no progress, no warnings, and an
    /// out-of-memory that a configuration runs into is a result, not an error.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The trace file: JSON lines, or JSON lines compressed with gzip (`.jsonl.gz`).
    pub trace: PathBuf,
    /// Pool (default vmm, libcupool's; torch: PyTorch's native caching allocator, to see what it
    /// would reserve).
    #[arg(long, value_parser = values::pool_kind(), ignore_case = true, default_value = "vmm")]
    pub pool: PoolKind,
    /// Purge policy at prefill phase ends (default auto, libcupool's CUPOOL_PURGE default).
    #[arg(long, value_parser = values::purge(), default_value = "auto")]
    pub purge: PurgePolicy,
    /// The simulated card's size in GiB, the trace's pool alone on it (default: large enough
    /// never to run out).
    #[arg(long)]
    pub vram: Option<f64>,
    /// The VMM pool rounds requests above 1 MiB up to this many bytes (a power of two;
    /// default CUPOOL_VMM_ROUND_LARGE, else 128; libcupool uses 2097152).
    #[arg(long)]
    pub round_large: Option<usize>,
    /// Size classes with a pool each: byte bounds separated by commas, or none (default
    /// CUPOOL_SIZE_CLASSES, else none; libcupool uses 1048576 for vmm).
    #[arg(long)]
    pub size_classes: Option<String>,
    /// VMM page recycling: on (libcupool's default, for a framework's traffic) or off (the
    /// library's default, ggml's mapping: what `repro-prefill run` simulates). Default
    /// CUPOOL_VMM_RECYCLE, else on.
    #[arg(long, value_parser = ["on", "off"])]
    pub recycle: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: FormatArg,
    /// Write the replay's timeline (live and reserved bytes after each event) to this file:
    /// PNG or SVG, by its extension.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Where the pool's memory comes from: the simulated card (sim, the default) or GPU 0
    /// (cuda: real driver calls, no kernels; the report adds the wall time and the time in
    /// each driver call, what the pool costs the run that recorded the trace).
    #[arg(long, value_parser = ["sim", "cuda"], default_value = "sim")]
    pub device: String,
    /// Only errors on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl RunArgs {
    /// The prompt: `--prompt`, else 20000 tokens (the context if shorter); for `plan`, the
    /// whole context.
    pub fn prompt_tokens(&self, plan: bool) -> usize {
        match self.prompt {
            Some(p) => p,
            None if plan => self.ctx,
            None => self.ctx.min(20000),
        }
    }
}
