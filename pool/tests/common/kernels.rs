//! The GPU tests' kernels: `fill` writes a pattern, `check` counts the words that differ from it.
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use cupool_pool::driver::cuda::CudaDriver;
use std::sync::Arc;

const SRC: &str = r#"
extern "C" __global__ void fill(unsigned int *p, unsigned int v, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = v ^ (unsigned int)i;
}
extern "C" __global__ void check(const unsigned int *p, unsigned int v, unsigned long long n, unsigned int *bad) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        if (p[i] != (v ^ (unsigned int)i)) atomicAdd(bad, 1u);
}
"#;

pub fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(256).clamp(1, 4096), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub struct Kernels {
    pub stream: Arc<CudaStream>,
    pub fill: CudaFunction,
    pub check: CudaFunction,
}

pub fn kernels(drv: &CudaDriver) -> Kernels {
    let ptx = compile_ptx_with_opts(
        SRC,
        CompileOptions {
            arch: Some("compute_90"),
            ..Default::default()
        },
    )
    .unwrap();
    let module = drv.context().load_module(ptx).unwrap();
    Kernels {
        stream: drv.context().default_stream(),
        fill: module.load_function("fill").unwrap(),
        check: module.load_function("check").unwrap(),
    }
}
