//! The arguments of one kernel call on device addresses, bundled by call as [`crate::cpu::FaParams`]
//! and [`crate::cuda::FaPtrs`] bundle flash attention's: the CUDA launches, cuBLAS and the
//! runtime's executors all take these, so a shape or a pointer is named at the call instead of
//! being the fifth of seven integers.

use crate::KvType;

/// `y (+)= x · w` on row-major matrices: `x` is `m×k`, `w` is `k×n` f16, `y` is `m×n` f32.
///
/// `x`'s element type is the callee's: f32 for the CUDA-core kernel
/// ([`crate::cuda::Kernels::matmul`]), f16 for cuBLAS ([`crate::blas::Gemm::f16_f32`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmArgs {
    /// The input, `m×k`.
    pub x: u64,
    /// The weights, `k×n` halves.
    pub w: u64,
    /// The output, `m×n` floats.
    pub y: u64,
    /// Rows of `x` and `y`.
    pub m: usize,
    /// Columns of `w` and `y`.
    pub n: usize,
    /// Columns of `x`, rows of `w`.
    pub k: usize,
    /// Add to `y` instead of overwriting it.
    pub accumulate: bool,
}

/// RMS norm of `rows` rows of `n` floats at `x`, weighted by `n` halves at `w`, into `y`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormArgs {
    /// The input, `rows×n` floats.
    pub x: u64,
    /// The weights, `n` halves.
    pub w: u64,
    /// The output, `rows×n` floats.
    pub y: u64,
    /// Rows.
    pub rows: usize,
    /// Floats per row.
    pub n: usize,
    /// Added to the mean square before its root.
    pub eps: f32,
}

/// One write of new K (or V) rows into the cache: `rows` f32 rows of `row_len` at `src`,
/// stored as `kv` into rows `[pos0, pos0 + rows)` of the cache at `cache`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvStore {
    /// How the cache stores its rows.
    pub kv: KvType,
    /// The new rows, `rows×row_len` floats.
    pub src: u64,
    /// The cache's first row (of this layer's K or V).
    pub cache: u64,
    /// Rows written.
    pub rows: usize,
    /// Values per row (a multiple of 32 for q8_0).
    pub row_len: usize,
    /// The cache row the first new row goes to.
    pub pos0: usize,
}

impl KvStore {
    /// The address of cache row `pos0`, where the write starts.
    pub fn dst(&self) -> u64 {
        self.cache + (self.pos0 * self.kv.row_bytes(self.row_len)) as u64
    }
}
