//! The flash-attention kernel on prefill shapes (GPU): 512 query tokens at the end of a KV of
//! 4k and 16k, for Phi-3-mini (32 heads, D 96) and Llama-3-8B (32/8 heads, D 128). Timed with
//! CUDA events, median of 20 launches. `scripts/sdpa_bench.py` times PyTorch's
//! `scaled_dot_product_attention` on the same shapes. Prints one JSON line per shape and kernel:
//! the tensor-core kernel as `flash_attn` picks it (`cupool`), its other configurations
//! (`cupool-mma-mt<M>-bk<K>`: m-tiles per warp, keys per tile; to keep the choice in
//! `fa::MMA_SHAPES` measured) and the CUDA-core kernel (`cupool-simt`).
use cudarc::driver::result;
use cupool::kernels::cpu::FaParams;
use cupool::kernels::cuda::{FaKernel, FaPtrs, Kernels};
use cupool::kernels::fa::mma_candidates;
use half::f16;

#[path = "common/gpu_timing.rs"]
mod gpu_timing;

fn main() {
    let Some(ctx) = gpu_timing::device("fattn") else {
        return;
    };
    let k = Kernels::load(&ctx, ctx.default_stream()).unwrap();
    let stream = k.stream().clone();
    for (name, n_head, n_head_kv, d) in [
        ("phi3-mini", 32usize, 32usize, 96usize),
        ("llama3-8b", 32, 8, 128),
    ] {
        for n_kv in [4096usize, 16384] {
            let n_tokens = 512;
            let p = FaParams {
                n_tokens,
                n_head,
                n_head_kv,
                d_k: d,
                d_v: d,
                n_kv,
                pos0: n_kv - n_tokens,
                k_row: n_head_kv * d,
                k_head: d,
                v_row: n_head_kv * d,
                v_head: d,
                scale: 1.0 / (d as f32).sqrt(),
                parallel_blocks: 1,
            };
            let q: Vec<f32> = (0..n_tokens * n_head * d)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect();
            let kv: Vec<f16> = (0..n_kv * n_head_kv * d)
                .map(|i| f16::from_f32(((i * 104729) % 1000) as f32 / 1000.0 - 0.5))
                .collect();
            ctx.bind_to_thread().unwrap();
            // SAFETY: fresh allocations filled from live host vectors of the same size.
            let (qd, kd, vd, od) = unsafe {
                let qd = result::malloc_sync(q.len() * 4).unwrap();
                result::memcpy_htod_sync(qd, &q).unwrap();
                let kd = result::malloc_sync(kv.len() * 2).unwrap();
                result::memcpy_htod_sync(kd, &kv).unwrap();
                let vd = result::malloc_sync(kv.len() * 2).unwrap();
                result::memcpy_htod_sync(vd, &kv).unwrap();
                (
                    qd,
                    kd,
                    vd,
                    result::malloc_sync(n_tokens * n_head * d * 4).unwrap(),
                )
            };
            let ptrs = FaPtrs {
                q: qd,
                k: kd,
                v: vd,
                dst: od,
                dst_tmp: 0,
                dst_meta: 0,
            };
            let picked = k.fa_kernel(&p, &ptrs);
            let mut kernels = vec![("cupool".to_string(), picked)];
            if let FaKernel::TensorCores(cfg) = picked {
                for c in mma_candidates(d, d).into_iter().filter(|&c| c != cfg) {
                    kernels.push((
                        format!("cupool-mma-mt{}-bk{}", c.m_tiles, c.keys_per_tile),
                        FaKernel::TensorCores(c),
                    ));
                }
                kernels.push(("cupool-simt".to_string(), FaKernel::CudaCores));
            }
            for (label, kernel) in kernels {
                let run = || k.flash_attn_with(kernel, &p, &ptrs).unwrap();
                let med = gpu_timing::median_ms(&ctx, &stream, &run);
                // Causal: query t sees pos0 + t + 1 keys; QK and PV are 2 flops per multiply-add each.
                let pairs: f64 =
                    (0..n_tokens).map(|t| (p.pos0 + t + 1) as f64).sum::<f64>() * n_head as f64;
                let tflops = pairs * 2.0 * (2 * d) as f64 / (med * 1e-3) / 1e12;
                println!("{{\"suite\":\"fattn\",\"impl\":\"{label}\",\"kernel\":\"{kernel:?}\",\"shape\":\"{name}\",\"n_head\":{n_head},\"n_head_kv\":{n_head_kv},\"d\":{d},\"n_tokens\":{n_tokens},\"n_kv\":{n_kv},\"ms\":{med:.4},\"tflops\":{tflops:.2},\"q\":\"f32\",\"kv\":\"f16\"}}");
            }
            // SAFETY: our own allocations; the stream is idle.
            unsafe {
                for ptr in [qd, kd, vd, od] {
                    result::free_sync(ptr).unwrap();
                }
            }
        }
    }
}
