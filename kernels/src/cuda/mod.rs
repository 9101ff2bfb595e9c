//! The CUDA kernels: sources, NVRTC compilation, and launches.
//!
//! Sources are compiled once per context ([`Kernels::load`]); the tensor-core flash attention
//! is a template compiled per head shape on first use (most models use one). Every launch takes
//! raw device addresses, so pool buffers ([`cupool_pool::PoolBuffer`] pushes its pointer) and
//! plain allocations are passed alike.
//!
//! The files: `compile.rs` (the sources and their NVRTC compilation, cached per process), this
//! one ([`Kernels`]: the compiled modules loaded on one context and stream), and the launches
//! by kernel family, beside their sources: `quant.rs` (the KV cache's rows), `fattn.rs` (flash
//! attention on either kernel, and the split combine), `layer.rs` (embedding, norm, GEMM,
//! SwiGLU, weight initialisation).

mod compile;
mod error;
mod fattn;
mod layer;
mod quant;

pub use compile::{compile, compile_fa_mma, fa_mma_entry, fa_mma_source, nvrtc_available, sources};
pub use error::KernelError;
pub use fattn::{FaKernel, FaPtrs};

use crate::fa::MmaConfig;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The loaded kernels of one context.
#[derive(Debug)]
pub struct Kernels {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    arch: &'static str,
    /// Compute capability major version (tensor-core kernels need 8).
    cc_major: i32,
    /// The most dynamic shared memory a block may opt in to.
    max_shared: usize,
    /// Tensor-core flash attention, compiled on first use per (D_K, D_V, configuration).
    fa_mma: Mutex<HashMap<(usize, usize, MmaConfig), CudaFunction>>,
    quantize_q8_0: CudaFunction,
    store_f16: CudaFunction,
    dequantize_q8_0: CudaFunction,
    fattn: CudaFunction,
    fattn_combine: CudaFunction,
    embed: CudaFunction,
    rms_norm: CudaFunction,
    matmul: CudaFunction,
    swiglu: CudaFunction,
    init_weights: CudaFunction,
    init_weights_q8_0: CudaFunction,
}

fn grid(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(threads as u64).max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Kernels {
    /// Compiles the sources for the context's compute capability and loads them.
    pub fn load(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self, KernelError> {
        if !nvrtc_available() {
            return Err(KernelError::Compile("libnvrtc could not be loaded".into()));
        }
        let (major, minor) = ctx.compute_capability()?;
        let arch: &'static str = match (major, minor) {
            (9, _) => "compute_90",
            (8, 9) => "compute_89",
            (8, 6) => "compute_86",
            (8, _) => "compute_80",
            (10, _) => "compute_100",
            (12, _) => "compute_120",
            _ => "compute_75",
        };
        let mut modules = HashMap::new();
        for (name, ptx) in compile(arch)? {
            modules.insert(name, ctx.load_module(ptx)?);
        }
        let f = |m: &str, name: &str| -> Result<CudaFunction, KernelError> {
            let module = modules
                .get(m)
                .ok_or_else(|| KernelError::Compile(format!("no module {m} was compiled")))?;
            Ok(module.load_function(name)?)
        };
        let fattn = f("fattn", "fattn")?;
        let max_smem = crate::fa::shared_bytes(crate::fa::MAX_D_K, crate::fa::MAX_D_V) as i32;
        fattn.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            max_smem,
        )?;
        let max_shared = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        Ok(Self {
            ctx: ctx.clone(),
            arch,
            cc_major: major,
            max_shared: max_shared.max(0) as usize,
            fa_mma: Mutex::new(HashMap::new()),
            quantize_q8_0: f("quant", "quantize_q8_0")?,
            store_f16: f("quant", "store_f16")?,
            dequantize_q8_0: f("quant", "dequantize_q8_0")?,
            fattn,
            fattn_combine: f("fattn", "fattn_combine")?,
            embed: f("layer", "embed")?,
            rms_norm: f("layer", "rms_norm")?,
            matmul: f("layer", "matmul")?,
            swiglu: f("layer", "swiglu")?,
            init_weights: f("layer", "init_weights")?,
            init_weights_q8_0: f("layer", "init_weights_q8_0")?,
            stream,
        })
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}
