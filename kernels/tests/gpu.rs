//! Every kernel against its CPU reference on fresh random inputs; outputs are poisoned with NaN
//! before each run so an unwritten element fails. Needs a GPU:
//! `cargo test -p cupool-kernels --test gpu -- --ignored`.
use cudarc::driver::{result, CudaContext};
use cupool_kernels::args::{GemmArgs, NormArgs};
use cupool_kernels::cpu::{self, FaParams};
use cupool_kernels::cuda::{FaKernel, FaPtrs, Kernels};
use cupool_kernels::fa;
use half::f16;
use std::sync::Arc;

/// True, after saying why, on a machine without a CUDA GPU: the test then returns. With
/// `CUPOOL_REQUIRE_GPU=1` (the GPU machine's script sets it) a missing GPU fails instead.
fn no_gpu() -> bool {
    let why = match cupool_kernels::device::DeviceFacts::query(0) {
        Ok(Some(_)) => return false,
        Ok(None) => "no CUDA GPU here: the CUDA driver library is not installed".to_string(),
        Err(e) => format!("no CUDA GPU here: {e}"),
    };
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_GPU").is_none(),
        "CUPOOL_REQUIRE_GPU is set: {why}"
    );
    eprintln!("skipped: {why}");
    true
}

struct Gpu {
    ctx: Arc<CudaContext>,
    k: Kernels,
    owned: Vec<u64>,
}

impl Gpu {
    fn new() -> Self {
        let ctx = CudaContext::new(0).unwrap();
        let k = Kernels::load(&ctx, ctx.default_stream()).unwrap();
        Self {
            ctx,
            k,
            owned: Vec::new(),
        }
    }
    fn upload<T: cudarc::driver::DeviceRepr>(&mut self, data: &[T]) -> u64 {
        self.ctx.bind_to_thread().unwrap();
        let bytes = std::mem::size_of_val(data).max(4);
        // SAFETY: a fresh allocation of `bytes`, filled from a live slice of that size.
        unsafe {
            let p = result::malloc_sync(bytes).unwrap();
            result::memcpy_htod_sync(p, data).unwrap();
            self.owned.push(p);
            p
        }
    }
    fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        p: u64,
        n: usize,
    ) -> Vec<T> {
        self.k.stream().synchronize().unwrap();
        let mut out = vec![T::default(); n];
        // SAFETY: `p` holds at least n values of T; the stream is idle.
        unsafe { result::memcpy_dtoh_sync(&mut out, p).unwrap() };
        out
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        for &p in &self.owned {
            // SAFETY: our own allocations; the device is idle after the last download.
            unsafe { result::free_sync(p).unwrap() };
        }
    }
}

fn rand(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// (n_tokens, pos0, n_head, n_head_kv, d_k, d_v, v_is_k, parallel_blocks)
type Case = (usize, usize, usize, usize, usize, usize, bool, usize);

fn close(name: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{name}: element {i} is {g}");
        let err = (g - w).abs() / (1.0 + w.abs());
        worst = worst.max(err);
        assert!(err <= tol, "{name}: element {i}: {g} vs {w}");
    }
    eprintln!("{name}: worst relative error {worst:.2e}");
}

/// The kernels a call is checked on: the CUDA-core kernel and the tensor-core kernel in every
/// configuration the benchmark times.
fn kernels_for(d_k: usize, d_v: usize) -> Vec<FaKernel> {
    let mut out = vec![FaKernel::CudaCores];
    out.extend(
        fa::mma_candidates(d_k, d_v)
            .into_iter()
            .map(FaKernel::TensorCores),
    );
    out
}

/// Worst relative error each kernel may show against the f32 CPU reference: the CUDA-core
/// kernel keeps Q and P in f32; the tensor-core kernel rounds Q (scaled) and P to f16 as ggml's
/// MMA kernel does (11-bit mantissas: about 5e-4 each, summed over the softmax).
fn tolerance(k: FaKernel) -> f32 {
    match k {
        FaKernel::CudaCores => 2e-3,
        FaKernel::TensorCores(_) => 6e-3,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_attention_matches_the_cpu_reference() {
    if no_gpu() {
        return;
    }
    let mut g = Gpu::new();
    let (major, _) = g.ctx.compute_capability().unwrap();
    let cases: &[Case] = &[
        // (n_tokens, pos0, n_head, n_head_kv, d_k, d_v, v_is_k, parallel_blocks)
        (70, 0, 4, 4, 64, 64, false, 1),
        (33, 200, 8, 2, 96, 96, false, 1),
        (512, 300, 8, 8, 128, 128, false, 1),
        (1, 700, 32, 8, 128, 128, false, 4),
        (7, 255, 4, 1, 256, 256, false, 3),
        (40, 100, 16, 1, 576, 512, true, 1),
        (3, 600, 16, 1, 576, 512, true, 5),
        // The tensor-core kernel's edges: rows not a block multiple, tiles straddling the
        // causal edge and the cache end, splits with no tiles, every head dimension.
        (200, 1000, 32, 32, 96, 96, false, 1),
        (129, 3900, 8, 2, 128, 128, false, 3),
        (65, 63, 4, 4, 80, 80, false, 1),
        (100, 400, 6, 3, 112, 112, false, 2),
        (17, 40, 4, 2, 64, 64, false, 8),
        (130, 500, 4, 2, 256, 256, false, 1),
        (2, 1500, 16, 1, 576, 512, true, 3),
        (20, 70, 4, 1, 576, 512, false, 1),
    ];
    for (i, &(n_tokens, pos0, n_head, n_head_kv, d_k, d_v, v_is_k, pb)) in cases.iter().enumerate()
    {
        let n_kv = (pos0 + n_tokens).next_multiple_of(256);
        let k_row = n_head_kv * d_k;
        let (v_row, v_head) = if v_is_k {
            (k_row, d_k)
        } else {
            (n_head_kv * d_v, d_v)
        };
        let p = FaParams {
            n_tokens,
            n_head,
            n_head_kv,
            d_k,
            d_v,
            n_kv,
            pos0,
            k_row,
            k_head: d_k,
            v_row,
            v_head,
            scale: 1.0 / (d_k as f32).sqrt(),
            parallel_blocks: pb,
        };
        // Q spread 4x wider than K: peaked softmaxes, so the running max matters.
        let q: Vec<f32> = rand(i as u64 * 3 + 1, n_tokens * n_head * d_k)
            .into_iter()
            .map(|x| 4.0 * x)
            .collect();
        let k: Vec<f16> = rand(i as u64 * 3 + 2, n_kv * k_row)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let v: Vec<f16> = if v_is_k {
            k.clone()
        } else {
            rand(i as u64 * 3 + 3, n_kv * v_row)
                .into_iter()
                .map(f16::from_f32)
                .collect()
        };
        let rows = n_tokens * n_head;
        let mut want = vec![0f32; rows * d_v];
        let (mut tmp, mut meta) = (vec![0f32; pb * rows * d_v], vec![[0f32; 2]; pb * rows]);
        cpu::flash_attn(&p, &q, &k, &v, &mut want, &mut tmp, &mut meta);

        let (qd, kd) = (g.upload(&q), g.upload(&k));
        let vd = if v_is_k { kd } else { g.upload(&v) };
        let dst = g.upload(&vec![f32::NAN; rows * d_v]);
        let dtmp = g.upload(&vec![f32::NAN; pb * rows * d_v]);
        let dmeta = g.upload(&vec![f32::NAN; pb * rows * 2]);
        let ptrs = FaPtrs {
            q: qd,
            k: kd,
            v: vd,
            dst,
            dst_tmp: dtmp,
            dst_meta: dmeta,
        };
        let picked = g.k.fa_kernel(&p, &ptrs);
        if major >= 8 && fa::mma_config(d_k, d_v).is_some() {
            assert!(
                matches!(picked, FaKernel::TensorCores(_)),
                "case {i}: {picked:?} picked on compute capability {major}"
            );
        }
        for kernel in kernels_for(d_k, d_v) {
            if major < 8 && kernel != FaKernel::CudaCores {
                continue;
            }
            // Poison the output again: each kernel must write every element.
            let nan = vec![f32::NAN; rows * d_v];
            g.ctx.bind_to_thread().unwrap();
            // SAFETY: dst holds rows*d_v floats; synchronous copy from a live vector.
            unsafe { result::memcpy_htod_sync(dst, &nan).unwrap() };
            g.k.flash_attn_with(kernel, &p, &ptrs).unwrap();
            let got: Vec<f32> = g.download(dst, rows * d_v);
            close(
                &format!("fattn case {i} {kernel:?} {p:?}"),
                &got,
                &want,
                tolerance(kernel),
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn quantization_and_layer_kernels_match_the_cpu_reference() {
    if no_gpu() {
        return;
    }
    let mut g = Gpu::new();
    // q8_0 quantize into rows 3.. of a cache, then dequantize everything.
    let (rows, row_len, row0) = (5, 96, 3);
    let x = rand(11, rows * row_len);
    let mut cache_want = vec![0u8; (row0 + rows) * row_len / 32 * 34];
    cpu::quantize_q8_0(&x, &mut cache_want[row0 * row_len / 32 * 34..]);
    let xd = g.upload(&x);
    let cache = g.upload(&vec![0u8; cache_want.len()]);
    g.k.quantize_q8_0(xd, cache, rows, row_len, row0).unwrap();
    let cache_got: Vec<u8> = g.download(cache, cache_want.len());
    assert_eq!(cache_got, cache_want, "q8_0 blocks differ");
    let deq = g.upload(&vec![f16::NAN; (row0 + rows) * row_len]);
    g.k.dequantize_q8_0(cache, deq, row0 + rows, row_len)
        .unwrap();
    let mut want = vec![f16::ZERO; (row0 + rows) * row_len];
    cpu::dequantize_q8_0(&cache_want, &mut want);
    let got: Vec<f16> = g.download(deq, want.len());
    assert_eq!(got, want, "dequantized values differ");

    // f16 store.
    let st = g.upload(&vec![f16::NAN; (row0 + rows) * row_len]);
    g.k.store_f16(xd, st, rows, row_len, row0).unwrap();
    let got: Vec<f16> = g.download(st, (row0 + rows) * row_len);
    let mut want = vec![f16::ZERO; rows * row_len];
    cpu::store_f16(&x, &mut want);
    assert_eq!(&got[row0 * row_len..], &want[..]);

    // matmul, with and without accumulation, on shapes that are not tile multiples.
    for (m, n, k) in [(1, 64, 64), (70, 200, 96), (512, 96, 3072)] {
        let xs = rand(m as u64, m * k);
        let w: Vec<f16> = rand(n as u64 + 1, k * n)
            .into_iter()
            .map(|v| f16::from_f32(v / (k as f32).sqrt()))
            .collect();
        let y0 = rand(7, m * n);
        for acc in [false, true] {
            let mut want = y0.clone();
            cpu::matmul(&xs, &w, &mut want, m, n, k, acc);
            let (xd, wd) = (g.upload(&xs), g.upload(&w));
            let yd = g.upload(&if acc {
                y0.clone()
            } else {
                vec![f32::NAN; m * n]
            });
            let args = GemmArgs {
                x: xd,
                w: wd,
                y: yd,
                m,
                n,
                k,
                accumulate: acc,
            };
            g.k.matmul(&args).unwrap();
            close(
                &format!("matmul {m}x{n}x{k} acc={acc}"),
                &g.download(yd, m * n),
                &want,
                1e-4,
            );
        }
    }

    // rms_norm, swiglu, embed, init_weights.
    let (r, n) = (9, 3072);
    let x = rand(5, r * n);
    let w: Vec<f16> = rand(6, n).into_iter().map(f16::from_f32).collect();
    let mut want = vec![0f32; r * n];
    cpu::rms_norm(&x, &w, &mut want, n, 1e-6);
    let (xd, wd, yd) = (g.upload(&x), g.upload(&w), g.upload(&vec![f32::NAN; r * n]));
    let args = NormArgs {
        x: xd,
        w: wd,
        y: yd,
        rows: r,
        n,
        eps: 1e-6,
    };
    g.k.rms_norm(&args).unwrap();
    close("rms_norm", &g.download(yd, r * n), &want, 1e-5);

    let gate = rand(8, r * n);
    let mut want = x.clone();
    cpu::swiglu(&mut want, &gate);
    let gd = g.upload(&gate);
    g.k.swiglu(xd, gd, r * n).unwrap();
    close("swiglu", &g.download(xd, r * n), &want, 1e-5);

    let tokens: Vec<i32> = vec![0, 1, 31999, 12345];
    let mut want = vec![0f32; tokens.len() * 64];
    cpu::embed(&tokens, &mut want, 64);
    let (td, ed) = (
        g.upload(&tokens),
        g.upload(&vec![f32::NAN; tokens.len() * 64]),
    );
    g.k.embed(td, ed, tokens.len(), 64).unwrap();
    close("embed", &g.download(ed, tokens.len() * 64), &want, 0.0);

    let mut want = vec![f16::ZERO; 10_000];
    cpu::init_weights(&mut want, 7, 0.02);
    let wd = g.upload(&vec![f16::NAN; 10_000]);
    g.k.init_weights(wd, 10_000, 7, 0.02).unwrap();
    let got: Vec<f16> = g.download(wd, 10_000);
    assert_eq!(got, want);

    // The same weights as q8_0 blocks, byte for byte.
    let n = 32 * 313;
    let mut want = vec![0u8; n / 32 * 34];
    cpu::init_weights_q8_0(&mut want, 7, 0.02);
    let wq = g.upload(&vec![0xA5u8; want.len()]);
    g.k.init_weights_q8_0(wq, n, 7, 0.02).unwrap();
    let got: Vec<u8> = g.download(wq, want.len());
    assert_eq!(got, want, "q8_0 weights differ");
}

/// cuBLAS's f16 GEMM with f32 output against the CPU reference on the same f16-rounded input:
/// shapes of the runtime's projections, tails that are not tile multiples, with and without
/// accumulation, with and without a workspace (a pool buffer in the runtime; a plain
/// allocation here).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cublas_gemm_matches_the_cpu_reference() {
    if no_gpu() {
        return;
    }
    use cupool_kernels::blas::{Gemm, WORKSPACE_BYTES};
    let mut g = Gpu::new();
    let Some(mut gemm) = Gemm::new(g.k.stream().clone()).unwrap() else {
        panic!("libcublas is not on the loader path");
    };
    let ws = g.upload(&vec![0u8; WORKSPACE_BYTES]);
    for (i, (m, n, k)) in [
        (1, 64, 64),
        (70, 200, 96),
        (512, 3072, 3072),
        (333, 8192, 3072),
    ]
    .into_iter()
    .enumerate()
    {
        gemm.set_workspace(ws, if i % 2 == 0 { WORKSPACE_BYTES } else { 0 })
            .unwrap();
        let xs: Vec<f32> = rand(m as u64 + 3, m * k)
            .into_iter()
            .map(|v| f16::from_f32(v).to_f32())
            .collect();
        let x16: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
        let w: Vec<f16> = rand(n as u64 + 5, k * n)
            .into_iter()
            .map(|v| f16::from_f32(v / (k as f32).sqrt()))
            .collect();
        let y0 = rand(9, m * n);
        for acc in [false, true] {
            let mut want = y0.clone();
            cpu::matmul(&xs, &w, &mut want, m, n, k, acc);
            let (xd, wd) = (g.upload(&x16), g.upload(&w));
            let yd = g.upload(&if acc {
                y0.clone()
            } else {
                vec![f32::NAN; m * n]
            });
            let args = GemmArgs {
                x: xd,
                w: wd,
                y: yd,
                m,
                n,
                k,
                accumulate: acc,
            };
            gemm.f16_f32(&args).unwrap();
            // f32 accumulation in another order than the CPU's: rounding only.
            close(
                &format!("cublas {m}x{n}x{k} acc={acc}"),
                &g.download(yd, m * n),
                &want,
                1e-4,
            );
        }
    }
    gemm.set_workspace(0, 0).unwrap();
}

/// The device says what kernels' launch choices read: its multiprocessors and compute
/// capability, as ggml's `ggml_cuda_info` has them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_reports_its_multiprocessors_and_compute_capability() {
    if no_gpu() {
        return;
    }
    use cudarc::driver::sys::CUdevice_attribute;
    use cupool_kernels::device::DeviceFacts;
    let f = DeviceFacts::query(0)
        .unwrap()
        .expect("a CUDA device reports its facts");
    let ctx = CudaContext::new(0).unwrap();
    println!("{}: {f:?}", ctx.name().unwrap());
    assert!(f.multiprocessors > 0);
    assert!(
        f.compute_capability >= 500 && f.compute_capability % 10 == 0,
        "{f:?}"
    );
    // The same numbers as the device's context reports.
    let (major, minor) = ctx.compute_capability().unwrap();
    assert_eq!(
        f.compute_capability as i32,
        100 * major + 10 * minor,
        "{f:?}"
    );
    let sms = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .unwrap();
    assert_eq!(f.multiprocessors as i32, sms, "{f:?}");
    // A device that is not there is an error, not a panic.
    let count = CudaContext::device_count().unwrap() as usize;
    assert!(DeviceFacts::query(count).is_err());
}
