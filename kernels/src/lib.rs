//! The runtime's kernels: CUDA C compiled at run time with NVRTC ([`cuda`]), GEMMs through
//! cuBLAS ([`blas`]), a CPU reference of each ([`cpu`]), the flash-attention scratch sizes that every executor and the planner
//! share ([`fa`]), the arguments of a call bundled per call ([`args`]), and what launch choices
//! read from the device ([`device`]).
#![warn(missing_docs)]

pub mod args;
pub mod blas;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod fa;

pub use args::{GemmArgs, KvStore, NormArgs};
pub use device::DeviceFacts;

pub use half;

/// Values per q8_0 block.
pub const QK8_0: usize = 32;
/// Bytes per q8_0 block: an f16 scale and 32 int8.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// How the KV cache stores K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    /// Half precision: flash attention reads it directly, no scratch.
    F16,
    /// ggml's q8_0: flash attention first converts to f16 scratch (`K_f16`, `V_f16`).
    Q8_0,
}

impl KvType {
    /// Every type.
    pub const ALL: [KvType; 2] = [KvType::F16, KvType::Q8_0];

    /// Bytes of a row of `n` values (`n` a multiple of 32 for q8_0).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => n * 2,
            KvType::Q8_0 => n / QK8_0 * Q8_0_BLOCK_BYTES,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses `f16` or `q8_0`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(KvType::F16),
            "q8_0" => Some(KvType::Q8_0),
            _ => None,
        }
    }
}
