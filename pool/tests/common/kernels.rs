//! The GPU tests' kernels: `fill` writes a pattern, `check` counts the words that differ from it.
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use cupool_pool::driver::cuda::CudaDriver;
use cupool_pool::PoolBuffer;
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

/// Launches on the kernels' stream, for tests whose blocks are `PoolBuffer<u32>`.
#[allow(dead_code)]
impl Kernels {
    pub fn fill(&self, buf: &PoolBuffer<u32>, tag: u32) {
        let n = buf.len() as u64;
        let mut b = self.stream.launch_builder(&self.fill);
        b.arg(buf).arg(&tag).arg(&n);
        // SAFETY: writes `n` u32 into a live buffer of exactly that length.
        unsafe { b.launch(cfg(buf.len())) }.unwrap();
    }

    pub fn check(&self, buf: &PoolBuffer<u32>, tag: u32, bad: &cudarc::driver::CudaSlice<u32>) {
        let n = buf.len() as u64;
        let mut b = self.stream.launch_builder(&self.check);
        b.arg(buf).arg(&tag).arg(&n).arg(bad);
        // SAFETY: reads `n` u32 from a live buffer of that length, adds to a one-element counter.
        unsafe { b.launch(cfg(buf.len())) }.unwrap();
    }
}
