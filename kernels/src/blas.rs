//! GEMMs through cuBLAS (loaded at run time, as cudarc loads every CUDA library), with the
//! workspace cuBLAS asks for handed in by the caller: the runtime takes it from the pool, as
//! PyTorch takes its cuBLAS workspace from its caching allocator, so it shows in the pool's
//! numbers instead of hiding inside the library.

use crate::args::GemmArgs;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cublasSetWorkspace_v2, cudaDataType,
};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::CudaStream;
use std::ffi::c_void;
use std::sync::Arc;

/// The workspace cuBLAS is given on compute capability 9.x: the size its documentation
/// recommends for Hopper, and the size PyTorch allocates there (`:4096:8`, 8 chunks of 4 MiB).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Why a GEMM could not run.
#[derive(Debug)]
pub struct BlasError(pub String);

impl std::fmt::Display for BlasError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuBLAS: {}", self.0)
    }
}

impl std::error::Error for BlasError {}

/// Whether libcublas can be loaded on this machine.
pub fn cublas_available() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// A cuBLAS handle on one stream.
#[derive(Debug)]
pub struct Gemm {
    blas: CudaBlas,
}

impl Gemm {
    /// A handle on `stream`, or `None` when libcublas is not on the loader path.
    pub fn new(stream: Arc<CudaStream>) -> Result<Option<Self>, BlasError> {
        if !cublas_available() {
            return Ok(None);
        }
        let blas =
            CudaBlas::new(stream).map_err(|e| BlasError(format!("creating a handle: {e:?}")))?;
        Ok(Some(Self { blas }))
    }

    /// Points cuBLAS at `bytes` of device memory at `at` for the GEMMs that follow (0 bytes: no
    /// workspace). The memory must stay allocated until those GEMMs have run on the stream.
    pub fn set_workspace(&mut self, at: u64, bytes: usize) -> Result<(), BlasError> {
        let ptr = if bytes == 0 { 0 } else { at };
        // SAFETY: the handle is live; the caller keeps `bytes` at `at` allocated while the
        // stream's GEMMs use it (stream order: returning it to the pool afterwards is safe).
        unsafe { cublasSetWorkspace_v2(*self.blas.handle(), ptr as *mut c_void, bytes) }
            .result()
            .map_err(|e| BlasError(format!("setting a {bytes}-byte workspace: {e:?}")))
    }

    /// `y (+)= x · w` with `x` an `m×k` f16 matrix (row-major), `w` a `k×n` f16 matrix
    /// (row-major) and `y` an `m×n` f32 matrix (row-major); f32 accumulation on tensor cores.
    pub fn f16_f32(&self, g: &GemmArgs) -> Result<(), BlasError> {
        let GemmArgs {
            x,
            w,
            y,
            m,
            n,
            k,
            accumulate,
        } = *g;
        let dims = [m, n, k].map(i32::try_from);
        let [Ok(mm), Ok(nn), Ok(kk)] = dims else {
            return Err(BlasError(format!(
                "GEMM {m}x{n}x{k}: every dimension must fit a 32-bit int"
            )));
        };
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // Row-major y = x·w is column-major yᵀ = wᵀ·xᵀ, and a row-major matrix is its own
        // transpose in column-major: so C = yᵀ (n×m, ld n), A = wᵀ (n×k, ld n), B = xᵀ (k×m, ld k).
        // SAFETY: the caller's x, w, y hold m·k halves, k·n halves and m·n floats; alpha and
        // beta live on the host for the call (host pointer mode, the default).
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_N,
                cublasOperation_t::CUBLAS_OP_N,
                nn,
                mm,
                kk,
                (&alpha as *const f32).cast(),
                w as *const c_void,
                cudaDataType::CUDA_R_16F,
                nn,
                x as *const c_void,
                cudaDataType::CUDA_R_16F,
                kk,
                (&beta as *const f32).cast(),
                y as *mut c_void,
                cudaDataType::CUDA_R_32F,
                nn,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .map_err(|e| BlasError(format!("GEMM {m}x{n}x{k}: {e:?}")))
    }
}
