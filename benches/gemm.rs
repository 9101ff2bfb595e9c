//! The runtime's GEMMs on prefill shapes (GPU): a 512-token ubatch through each weight matrix of
//! Phi-3-mini and Llama-3-8B. Timed with CUDA events, median of 20 calls:
//! - `cupool` — what the runtime's CUDA executor runs: the f32 input converted to f16 in the
//!   compute buffer, then cuBLAS with f32 output (`Executor::matmul`);
//! - `cupool-q8_0` — the same with q8_0 weights: converted to f16 first (`src0_f16`);
//! - `cupool-simt` — the CUDA-core kernel used without libcublas.
//!
//! `scripts/gemm_bench.py` times PyTorch's f16 `matmul` on the same shapes. One JSON line per
//! shape and implementation.
use cudarc::driver::result;
use cupool::kernels::args::GemmArgs;
use cupool::kernels::blas::{Gemm, WORKSPACE_BYTES};
use cupool::kernels::cuda::Kernels;

/// One timed call.
type Call<'a> = Box<dyn Fn() + 'a>;

#[path = "common/gpu_timing.rs"]
mod gpu_timing;

fn main() {
    let Some(ctx) = gpu_timing::device("gemm") else {
        return;
    };
    let k = Kernels::load(&ctx, ctx.default_stream()).unwrap();
    let stream = k.stream().clone();
    let Some(mut gemm) = Gemm::new(stream.clone()).unwrap() else {
        println!("gemm bench skipped: libcublas not found");
        return;
    };
    let alloc = |bytes: usize| {
        ctx.bind_to_thread().unwrap();
        // SAFETY: a fresh allocation, zeroed before use.
        unsafe {
            let p = result::malloc_sync(bytes).unwrap();
            result::memset_d8_sync(p, 0, bytes).unwrap();
            p
        }
    };
    let ws = alloc(WORKSPACE_BYTES);
    gemm.set_workspace(ws, WORKSPACE_BYTES).unwrap();
    let m = 512usize;
    for (model, name, n, kk) in [
        ("phi3-mini", "q/k/v/o", 3072usize, 3072usize),
        ("phi3-mini", "up", 8192, 3072),
        ("phi3-mini", "down", 3072, 8192),
        ("llama3-8b", "q/o", 4096, 4096),
        ("llama3-8b", "k/v", 1024, 4096),
        ("llama3-8b", "up", 14336, 4096),
        ("llama3-8b", "down", 4096, 14336),
    ] {
        let x = alloc(m * kk * 4);
        let x16 = alloc(m * kk * 2);
        let w = alloc(kk * n * 2);
        let wq = alloc(kk * n / 32 * 34);
        let y = alloc(m * n * 4);
        k.init_weights(w, kk * n, 1, 0.02).unwrap();
        k.init_weights_q8_0(wq, kk * n, 1, 0.02).unwrap();
        let simt = GemmArgs {
            x,
            w,
            y,
            m,
            n,
            k: kk,
            accumulate: false,
        };
        let blas = GemmArgs { x: x16, ..simt };
        let runs: [(&str, Call); 3] = [
            (
                "cupool",
                Box::new(|| {
                    k.store_f16(x, x16, m, kk, 0).unwrap();
                    gemm.f16_f32(&blas).unwrap();
                }),
            ),
            (
                "cupool-q8_0",
                Box::new(|| {
                    k.dequantize_q8_0(wq, w, kk, n).unwrap();
                    k.store_f16(x, x16, m, kk, 0).unwrap();
                    gemm.f16_f32(&blas).unwrap();
                }),
            ),
            ("cupool-simt", Box::new(|| k.matmul(&simt).unwrap())),
        ];
        for (label, f) in runs.iter() {
            let ms = gpu_timing::median_ms(&ctx, &stream, f.as_ref());
            let tflops = 2.0 * (m * n * kk) as f64 / (ms * 1e-3) / 1e12;
            println!("{{\"suite\":\"gemm\",\"impl\":\"{label}\",\"model\":\"{model}\",\"matrix\":\"{name}\",\"m\":{m},\"n\":{n},\"k\":{kk},\"ms\":{ms:.4},\"tflops\":{tflops:.1}}}");
        }
        // SAFETY: our own allocations; the stream is idle after the last timing.
        unsafe {
            for p in [x, x16, w, wq, y] {
                result::free_sync(p).unwrap();
            }
        }
    }
    gemm.set_workspace(0, 0).unwrap();
    // SAFETY: as above.
    unsafe { result::free_sync(ws).unwrap() };
}
