//! Prefill throughput per purge policy (GPU): tokens/s of a 16k-token prefill on two presets,
//! purge never/always/auto, legacy and vmm pools, in one run, interleaved so drift hits every
//! configuration alike. Goal: `auto` within 0.5% of `never`; `always` is reported.
//!
//! Full depth (every layer of the preset) by default; `CUPOOL_PREFILL_LAYERS` sets fewer to keep
//! a run short (the per-layer work and the per-ubatch boundary stay those of the full model).
//! Prints one JSON line per configuration. Run: `cargo bench --bench prefill`.
use cupool::pool::driver::cuda::{is_available, CudaDriver};
use cupool::pool::{PoolConfig, PoolKind};
use cupool::runtime::executor::cuda::CudaExecutor;
use cupool::runtime::{ModelShape, PurgePolicy, RunConfig, Runtime};
use std::sync::Arc;

const TOKENS: usize = 16384;
const REPS: usize = 5;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if !is_available() {
        println!("prefill bench skipped: it needs a CUDA GPU");
        return;
    }
    let drv = match CudaDriver::new(0) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            println!("prefill bench skipped: {e}");
            return;
        }
    };
    let layers: Option<usize> = std::env::var("CUPOOL_PREFILL_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut configs = Vec::new();
    for preset in ["phi3-mini", "llama3-8b"] {
        for kind in [PoolKind::Legacy, PoolKind::Vmm] {
            for purge in [PurgePolicy::Never, PurgePolicy::Always, PurgePolicy::Auto] {
                configs.push((preset, kind, purge, Vec::<f64>::new()));
            }
        }
    }
    for _ in 0..REPS {
        for (preset, kind, purge, samples) in configs.iter_mut() {
            let mut m = ModelShape::preset(preset).unwrap();
            m.n_layer = layers.unwrap_or(m.n_layer);
            let mut cfg = RunConfig::new(m, TOKENS);
            cfg.weights_bytes = 0;
            cfg.pool = PoolConfig::default().kind(*kind);
            cfg.purge = *purge;
            let exec = CudaExecutor::new(drv.context().clone()).unwrap();
            let mut rt = Runtime::new(drv.clone(), cfg, Box::new(exec)).unwrap();
            let r = rt.prefill(TOKENS).unwrap();
            assert!(r.completed);
            samples.push(TOKENS as f64 / r.seconds);
        }
    }
    let mut baseline = std::collections::HashMap::new();
    for (preset, kind, purge, samples) in configs.iter_mut() {
        let med = median(samples);
        let layers = layers.unwrap_or(ModelShape::preset(preset).unwrap().n_layer);
        if *purge == PurgePolicy::Never {
            baseline.insert((*preset, *kind), med);
        }
        let ratio = med / baseline[&(*preset, *kind)];
        println!(
            "{{\"suite\":\"prefill\",\"preset\":\"{preset}\",\"layers\":{layers},\"tokens\":{TOKENS},\"pool\":\"{}\",\"purge\":\"{}\",\"tokens_per_s\":{samples:?},\"median\":{med:.1},\"vs_never\":{ratio:.4}}}",
            kind.name(),
            purge.name()
        );
    }
}
