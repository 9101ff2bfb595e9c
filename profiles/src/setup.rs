//! What a profile is asked about: the model (see `model`), how its weights are stored, the
//! cache's type and the device, and the shape of one ubatch.

use crate::model::EngineModel;
use cupool_kernels::KvType;

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

/// The device facts the kernels' launch choices read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    /// Compute capability as ggml writes it: 900 for 9.0.
    pub cc: u32,
    /// Streaming multiprocessors: stream-k kernels launch this many blocks.
    pub nsm: usize,
    /// Blocks per SM of mainline's flash-attention kernels, as the CUDA runtime reports for
    /// the engine's compiled kernel. `None`: as measured for compute capability 9.0, else the
    /// kernel's launch bound (see [`llama`](crate::llama)).
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
            Self::Q8_0 => KvType::Q8_0.row_bytes(n),
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
