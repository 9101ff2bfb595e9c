//! A multi-ubatch prefill on the GPU equals the CPU executor on the same small model: f16 and
//! q8_0 caches, f16 and q8_0 weights, V as a view of K. The GPU's GEMMs (cuBLAS) take their
//! inputs in f16 where the CPU's keep f32, and its flash attention rounds Q and P to f16: the
//! tolerance covers that, and the allocation traces must be equal.
//! Needs a GPU: `cargo test -p cupool-runtime --test gpu -- --ignored`.
use cupool_kernels::KvType;
use cupool_pool::driver::cuda::CudaDriver;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::{PoolConfig, PoolKind};
use cupool_runtime::executor::cpu::CpuExecutor;
use cupool_runtime::executor::cuda::CudaExecutor;
use cupool_runtime::profile::Weights;
use cupool_runtime::*;
use std::sync::Arc;

/// True, after saying why, on a machine without a CUDA GPU: the test then returns. With
/// `CUPOOL_REQUIRE_GPU=1` (the GPU machine's script sets it) a missing GPU fails instead.
pub fn no_gpu() -> bool {
    let Some(why) = cupool_pool::driver::cuda::unavailable() else {
        return false;
    };
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_GPU").is_none(),
        "CUPOOL_REQUIRE_GPU is set: {why}"
    );
    eprintln!("skipped: {why}");
    true
}

fn model(v_is_k: bool) -> ModelShape {
    ModelShape {
        name: "small".into(),
        n_layer: 3,
        n_embd: 256,
        n_head: 8,
        n_head_kv: 2,
        head_dim_k: if v_is_k { 96 } else { 64 },
        head_dim_v: 64,
        v_is_k,
        n_ff: 512,
        weights_bytes: 0,
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_prefill_equals_the_cpu_executor() {
    if no_gpu() {
        return;
    }
    let cuda = Arc::new(CudaDriver::new(0).unwrap());
    for (kind, kv, v_is_k, wt) in [
        (PoolKind::Vmm, KvType::Q8_0, false, Weights::F16),
        (PoolKind::Legacy, KvType::F16, false, Weights::F16),
        (PoolKind::Vmm, KvType::Q8_0, true, Weights::F16),
        (PoolKind::Legacy, KvType::Q8_0, false, Weights::Q8_0),
    ] {
        let mut outs = Vec::new();
        let mut traces = Vec::new();
        for on_gpu in [false, true] {
            let m = model(v_is_k);
            let mut cfg = RunConfig::new(m.clone(), 1024);
            cfg.kv_type = kv;
            cfg.n_batch = 256;
            cfg.n_ubatch = 128;
            cfg.sms = 8;
            cfg.pool = PoolConfig::default().kind(kind);
            cfg.record_trace = true;
            cfg.weight_type = wt;
            let (driver, exec): (Arc<dyn Driver>, Box<dyn executor::Executor>) = if on_gpu {
                (
                    cuda.clone(),
                    Box::new(CudaExecutor::new(cuda.context().clone()).unwrap()),
                )
            } else {
                let sim = Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap());
                (sim.clone(), Box::new(CpuExecutor::new(sim).unwrap()))
            };
            let mut rt = Runtime::new(driver, cfg, exec).unwrap();
            let r = rt.prefill(700).unwrap();
            assert!(r.completed);
            let last = r.ubatches.last().unwrap().n_tokens;
            outs.push(rt.hidden(last).unwrap());
            traces.push(rt.recorder().unwrap().events());
            eprintln!("{kind:?} {kv:?} {wt:?} v_is_k={v_is_k} gpu={on_gpu}: {} ubatches, peak reserved {} KiB, {:.3}s", r.ubatches.len(), r.peak_reserved_bytes >> 10, r.seconds);
        }
        assert_eq!(
            traces[0], traces[1],
            "the GPU run allocates exactly as the CPU run"
        );
        let mut worst = 0f32;
        for (i, (g, c)) in outs[1].iter().zip(&outs[0]).enumerate() {
            assert!(g.is_finite(), "element {i} is {g}");
            let err = (g - c).abs() / (1.0 + c.abs());
            worst = worst.max(err);
            assert!(
                err < 2e-2,
                "{kind:?} {kv:?}: element {i}: gpu {g} vs cpu {c}"
            );
        }
        eprintln!("  worst relative error {worst:.2e}");
    }
}
