//! Device memory an engine takes that neither its pool nor its start-up buffers (weights, KV
//! cache, compute buffer) count, term by term, each from its cause. A user knows the free
//! memory `nvidia-smi` shows before the engine starts; these terms are what lies between that
//! and the room the buffers and the pool share.
//!
//! Measured on an H100 (compute capability 9.0, driver 580.159.04, CUDA 13.0) with mainline
//! llama.cpp 0c1e5709 and 12 GiB free before start (`data/h100-2026-11-24-mainline-hold`, the
//! mainline section of docs/llama-cpp.md):
//!
//! - llama.cpp logs 11,762 MiB free once its CUDA context exists: 526 MiB for the context and
//!   ggml's set-up (`data/h100-2026-11-24-mainline-logs/verbose-12gib-p20992-completes.log`). (ik_llama.cpp on an H200 logged 11,765 MiB free of 12,288, 523 MiB: the
//!   driver's, whichever engine.)
//! - A context's computes then take, outside every ggml buffer and pool, 164 MiB with f16
//!   weights (cuBLAS GEMMs) and 66 MiB with q8_0 weights (MMQ, no cuBLAS), as the shim counts
//!   them (free memory before and after the first compute, its own allocations excluded). The
//!   q8_0 run loads ggml's kernel modules alone: 66 MiB. The f16 run adds cuBLAS's 32 MiB
//!   workspace (`cublas_handle()`: cuBLAS's default on compute capability 9.0 and newer, 4 MiB
//!   before) and cuBLAS's own modules: 164 − 66 − 32 = 66 MiB.
//! - With `GGML_POOL` set, mainline's shim holds `CUPOOL_HOLD` (auto: the workspace plus
//!   144 MiB) from the context's creation to its first compute.
//! - Without an engine (`scripts/llama/outside_probe.cu`, `data/h100-2026-11-27-outside-probe`):
//!   the context alone takes 526.8 MiB, and `cublasCreate` 68 MiB (one 1024³ f16 GEMM then
//!   adds nothing; llama.cpp's GEMMs take the 98 MiB above). Eager module loading makes the
//!   handle 458 MiB.
//!
//! With more than one GPU visible, ik_llama.cpp 8337e4cd also makes NCCL communicators at
//! start-up ([`ik_nccl_communicators`], [`Outside::on_gpus`]); measured on two H100s (NVLink)
//! in `data/h100x2-2026-11-26-ik-two-gpus` (the two-GPU section of docs/llama-cpp.md).

use crate::engine_kind::EngineKind;
use cupool_profiles::{EngineModel, Profile, Weights};

const MIB: usize = 1 << 20;

/// The CUDA context and the engine's set-up before its first buffer: 12,288 − 11,762 MiB
/// (mainline on an H100, its `free` log line before loading the model).
pub const CUDA_CONTEXT_BYTES: usize = 526 * MIB;
/// ggml's kernel modules, loaded lazily at their first launch (CUDA's default lazy loading):
/// what a q8_0 model's computes took outside every buffer and pool.
pub const GGML_MODULES_BYTES: usize = 66 * MIB;
/// cuBLAS's own kernel modules, loaded with the handle: an f16 model's 164 MiB less ggml's
/// modules and the workspace.
pub const CUBLAS_MODULES_BYTES: usize = (164 - 66 - 32) * MIB;
/// cuBLAS's modules under ik_llama.cpp 8337e4cd. Its first compute took, beside its pool's
/// pages, 64 MiB with q8_0 Llama-3 (no cuBLAS), 160 MiB with f16 Phi-3 and 158 with the MoE on
/// an H200, the same on an H100 (`data/h200-2026-11-28-ik-heldout*`,
/// `data/h100-2026-11-27-ik-warmup`: 72.5 and 167.5 MiB less the 8.5 and 7.5 MiB of pages of
/// the pool's first blocks); the MoE without CUDA graphs took 32 MiB less
/// (`data/h100-2026-11-27-ik-graphs`). The f16 figure is ggml's modules, the workspace, the
/// warm-up graph's workspace ([`Outside::after_warm_up`]) and these: 160 − 64 − 32 − 32 = 32
/// MiB. The plan counts ggml's modules at mainline's 66 MiB for ik_llama.cpp too, and these at
/// 34: what the context and the engine's set-up before the weights took varied by 2 MiB
/// (522.4 MiB at the shim's first line on the H200, 523.4 on the H100; then 2 or 4 MiB while
/// the weights load), and the plan's room stays at or below the engine's in every recorded run
/// (a Llama-3 run at 10 GiB on the H100 got one block less than a plan 2 MiB less careful).
pub const IK_CUBLAS_MODULES_BYTES: usize = (164 - 66 - 32 - 32) * MIB;
/// What the shim's `CUPOOL_HOLD=auto` holds beside the workspace.
pub const HOLD_ALLOWANCE_BYTES: usize = 144 * MIB;
/// What one NCCL communicator over two GPUs takes on each of them: its rank's device memory
/// (channel buffers, work queues) and NCCL's own kernel module. Measured in every ik_llama.cpp
/// run on two H100s over NVLink (driver 580.159.04, CUDA 13.0, the system's NCCL): the shim's
/// `cuda-init` line (before `ggml_cuda_init` made the communicator; 0.1 MiB) against the
/// engine's `using device` line (after it; whole MiB, rounded down) put it in 393.2–394.2 MiB
/// on device 0 (80,552.2 → 80,158) and 393.6–394.6 MiB on device 1 (7,156.6 → 6,762 under
/// the ballast): 393.6–394.2 MiB on both, and the driver hands out whole 2 MiB pages, so
/// 394 MiB. Another GPU pair, interconnect or NCCL version may take another amount.
pub const NCCL_COMMUNICATOR_BYTES: usize = 394 * MIB;

/// The terms, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outside {
    /// The CUDA context and the engine's set-up, taken before any buffer.
    pub cuda_context: usize,
    /// cuBLAS's workspace, made with the handle at the first cuBLAS call (none where the engine
    /// never calls cuBLAS, or where it hands cuBLAS a workspace from its pool).
    pub cublas_workspace: usize,
    /// Kernel modules loaded at their first launch: the engine's and, where it calls cuBLAS,
    /// cuBLAS's.
    pub kernel_modules: usize,
    /// The shim's start-up hold: held from the context's creation to the first compute, then
    /// given back for the workspace and modules that compute loads.
    pub shim_hold: usize,
    /// The engine's output (logits) buffer on the device: none, since llama.cpp and
    /// ik_llama.cpp keep it in pinned host memory (`CUDA_Host output buffer` in their logs)
    /// and cupool's runtime computes no logits.
    pub output_buffer: usize,
    /// NCCL communicators the engine makes at start-up over every visible GPU, before any
    /// buffer ([`Outside::on_gpus`]; none on one GPU).
    pub nccl_communicators: usize,
    /// A second cuBLAS workspace, graph memory the warm-up's captured decode took
    /// ([`Outside::after_warm_up`]): taken at the first compute, and given back by the driver
    /// to an allocation that would fail, so room the pool has.
    pub given_back: usize,
}

/// How many NCCL communicators ik_llama.cpp 8337e4cd makes that include GPU `device` of
/// `visible_gpus`: `ggml_cuda_init` (`ggml/src/ggml-cuda.cu`, the `#ifdef GGML_USE_NCCL`
/// block after the device loop) runs at the backend's first use, whatever the split mode, and
/// when it sees more than one device calls `ncclCommInitAll` over all of them (the main
/// communicator); with 3 devices it adds the pairs {0,1} and {0,2}, with 4 the pairs {0,1},
/// {2,3}, {0,2} and {1,3}. Only a build that found NCCL (`GGML_NCCL`, on by default) does this;
/// `CUDA_VISIBLE_DEVICES` of one device makes none. Mainline llama.cpp 0c1e5709 makes its
/// communicators only for `-sm tensor`'s meta backend (`ggml_backend_cuda_comm_init_nccl`),
/// not modelled: none with `-sm layer`.
pub fn ik_nccl_communicators(device: usize, visible_gpus: usize) -> usize {
    if device >= visible_gpus {
        return 0;
    }
    let pairs: &[(usize, usize)] = match visible_gpus {
        3 => &[(0, 1), (0, 2)],
        4 => &[(0, 1), (2, 3), (0, 2), (1, 3)],
        _ => &[],
    };
    let main = usize::from(visible_gpus > 1);
    main + pairs
        .iter()
        .filter(|&&(a, b)| a == device || b == device)
        .count()
}

impl Outside {
    /// Nothing outside: a driver whose free memory is already what the buffers and pool share.
    pub const NONE: Self = Self {
        cuda_context: 0,
        cublas_workspace: 0,
        kernel_modules: 0,
        shim_hold: 0,
        output_buffer: 0,
        nccl_communicators: 0,
        given_back: 0,
    };

    /// The terms for `engine` running `model` (when it is a preset the profiles know) with
    /// weights on `path`, on a GPU of compute capability `cc` (900 for 9.0).
    pub fn of(engine: EngineKind, model: Option<&EngineModel>, path: Weights, cc: u32) -> Self {
        let workspace = if cc >= 900 { 32 * MIB } else { 4 * MIB };
        match engine {
            // cupool's runtime calls cuBLAS for every GEMM but hands it a workspace from its
            // pool (the run counts it there); its own kernels are NVRTC modules, loaded at start.
            EngineKind::Cupool => Self {
                cuda_context: CUDA_CONTEXT_BYTES,
                kernel_modules: CUBLAS_MODULES_BYTES,
                ..Self::NONE
            },
            EngineKind::Profile { profile, .. } => {
                // Where ggml calls cuBLAS (f16 weights, an f32 router, MLA's decompression)
                // it makes the handle's workspace, as the profile says, and loads cuBLAS's
                // modules.
                let cublas_workspace = match model {
                    Some(m) => profile.outside_pool_bytes(m, path, cc),
                    None if path == Weights::F16 => workspace,
                    None => 0,
                };
                let cublas_modules = match (cublas_workspace > 0, profile) {
                    (false, _) => 0,
                    (true, Profile::IkLlama) => IK_CUBLAS_MODULES_BYTES,
                    (true, _) => CUBLAS_MODULES_BYTES,
                };
                // The hold is mainline's patch (ggml/llama.cpp.patch), with GGML_POOL set.
                let shim_hold = if profile == Profile::Llama {
                    workspace + HOLD_ALLOWANCE_BYTES
                } else {
                    0
                };
                Self {
                    cuda_context: CUDA_CONTEXT_BYTES,
                    cublas_workspace,
                    kernel_modules: GGML_MODULES_BYTES + cublas_modules,
                    shim_hold,
                    ..Self::NONE
                }
            }
        }
    }

    /// The terms on GPU `device` when the engine sees `visible_gpus` GPUs: [`Outside::of`]'s
    /// (which plans one) with the NCCL communicators that engine makes at start-up
    /// ([`ik_nccl_communicators`]: ik_llama.cpp; none for mainline and cupool's runtime), each
    /// [`NCCL_COMMUNICATOR_BYTES`]. Only the two-GPU communicator is measured: larger ones are
    /// counted at its cost.
    pub fn on_gpus(self, engine: EngineKind, device: usize, visible_gpus: usize) -> Self {
        let n = match engine {
            EngineKind::Profile {
                profile: Profile::IkLlama,
                ..
            } => ik_nccl_communicators(device, visible_gpus),
            _ => 0,
        };
        Self {
            nccl_communicators: n * NCCL_COMMUNICATOR_BYTES,
            ..self
        }
    }

    /// The terms where the engine's warm-up ran first (`warm_up`: its tools' default, unless
    /// `--no-warmup`). ik_llama.cpp 8337e4cd captures the warm-up's one-token decode as a CUDA
    /// graph (its graphs are on by default) and makes cuBLAS's handle at that decode's first
    /// product through cuBLAS (`cublas_handle()`): cuBLAS 12.2 and later take the workspace
    /// with `cudaMallocAsync`, which inside a capture is graph memory, 32 MiB more than the
    /// same first compute without graphs (`data/h100-2026-11-27-ik-graphs`: 278 against 246
    /// MiB), and the driver hands it to a `cudaMalloc` that would fail otherwise. Measured on
    /// an H200 with `scripts/llama/reclaim_probe.cu` (`data/h200-2026-11-29-reclaim-cublas-graph`:
    /// a one-column product captured with the handle made inside the capture; a later
    /// `cudaMalloc` got the whole 32 MiB), and in the engine: the MoE at 10 GiB completing one
    /// ubatch above the plan without it, and Phi-3 f16 at 12 GiB granted its first block of
    /// the failing ubatch with 32 MiB returned (docs/repro-prefill.md). Once given, the memory
    /// stays with the pool for the prefill; a decode step launching the graph again would need
    /// it back, which a plan of a prefill does not model. With `GGML_CUDA_DISABLE_GRAPHS=1`
    /// the workspace is not taken at all, the same room. Mainline makes its handle outside any
    /// capture (its warm-up runs the whole prompt in llama-bench) and is left as it is.
    pub fn after_warm_up(self, engine: EngineKind, warm_up: bool) -> Self {
        let ik = matches!(
            engine,
            EngineKind::Profile {
                profile: Profile::IkLlama,
                ..
            }
        );
        Self {
            given_back: if ik && warm_up {
                self.cublas_workspace
            } else {
                0
            },
            ..self
        }
    }

    /// The pool's room on a card of `free` usable bytes beside start-up buffers of `buffers`
    /// bytes: what the terms from the first compute on leave, with what the driver gives back;
    /// `None` where the first compute does not fit.
    pub fn room(&self, free: usize, buffers: usize) -> Option<usize> {
        let left = free.checked_sub(buffers + self.at_compute())?;
        Some(left + self.given_back)
    }

    /// What these terms hold beside a pool whose device allocations held `pool_peak` bytes at
    /// most in its `room` ([`Outside::room`]; the planner passes their whole pages, as the
    /// room is counted): [`Outside::at_compute`], less what of the given-back memory the pool
    /// took. A run that stopped before its pool asked for anything (`room` `None`) got nothing
    /// back.
    pub fn held_beside(&self, pool_peak: usize, room: Option<usize>) -> usize {
        let took = match room {
            Some(r) => pool_peak.saturating_sub(r.saturating_sub(self.given_back)),
            None => 0,
        };
        self.at_compute() - took.min(self.given_back)
    }

    /// What must be free beside the start-up buffers while they are made: the context, NCCL's
    /// communicators and the hold.
    pub fn at_startup(&self) -> usize {
        self.cuda_context + self.nccl_communicators + self.shim_hold
    }

    /// What lies beside the buffers and the pool at the first compute (what the driver gives
    /// back later included).
    pub fn at_compute(&self) -> usize {
        self.cuda_context
            + self.nccl_communicators
            + self.cublas_workspace
            + self.given_back
            + self.kernel_modules
            + self.output_buffer
    }

    /// Each term with its name, for the plan's table.
    pub fn terms(&self) -> [(&'static str, usize); 7] {
        [
            ("CUDA context", self.cuda_context),
            ("NCCL communicators", self.nccl_communicators),
            ("cuBLAS workspace", self.cublas_workspace),
            ("kernel modules", self.kernel_modules),
            ("start-up hold (until 1st compute)", self.shim_hold),
            ("output buffer (host memory)", self.output_buffer),
            ("graph workspace (given back)", self.given_back),
        ]
    }
}

#[cfg(test)]
#[path = "outside_tests.rs"]
mod tests;
