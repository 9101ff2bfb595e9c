//! Prefill throughput per purge policy (GPU): tokens/s of a 16k-token prefill on two presets,
//! purge never/always/auto (and, on the legacy pool, auto returning at every boundary), legacy
//! and vmm pools, in one run, interleaved so drift hits every configuration alike; a warm-up
//! run first. Goal: `auto` within 0.5% of `never` (the median of each round's ratio); `always`
//! is reported.
//!
//! Full depth (every layer of the preset) by default; `CUPOOL_PREFILL_LAYERS` sets fewer to keep
//! a run short (the per-layer work and the per-ubatch boundary stay those of the full model).
//! Prints one JSON line per configuration. Run: `cargo bench --bench prefill`.
use cupool::pool::driver::cuda::{is_available, CudaDriver};
use cupool::pool::{AutoHeadroom, PoolConfig, PoolKind};
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
    // (preset, pool, purge, auto headroom, samples): `auto-eager` returns at every boundary
    // (headroom inf), the behaviour before auto waited for the device to be short.
    let mut configs = Vec::new();
    for preset in ["phi3-mini", "llama3-8b"] {
        for kind in [PoolKind::Legacy, PoolKind::Vmm] {
            for (purge, headroom) in [
                (PurgePolicy::Never, AutoHeadroom::Ubatch),
                (PurgePolicy::Always, AutoHeadroom::Ubatch),
                (PurgePolicy::Auto, AutoHeadroom::Ubatch),
                (PurgePolicy::Auto, AutoHeadroom::Infinite),
            ] {
                if kind == PoolKind::Vmm && headroom == AutoHeadroom::Infinite {
                    continue; // the VMM pool returns nothing at a boundary
                }
                configs.push((preset, kind, purge, headroom, Vec::<f64>::new()));
            }
        }
    }
    let run = |preset: &str, kind: PoolKind, purge: PurgePolicy, headroom: AutoHeadroom| {
        let mut m = ModelShape::preset(preset).unwrap();
        m.n_layer = layers.unwrap_or(m.n_layer);
        let mut cfg = RunConfig::new(m, TOKENS);
        cfg.weights_bytes = 0;
        cfg.pool = PoolConfig::default().kind(kind);
        cfg.purge = purge;
        cfg.auto_headroom = headroom;
        let exec = CudaExecutor::new(drv.context().clone()).unwrap();
        let mut rt = Runtime::new(drv.clone(), cfg, Box::new(exec)).unwrap();
        let r = rt.prefill(TOKENS).unwrap();
        assert!(r.completed);
        TOKENS as f64 / r.seconds
    };
    // Warm-up (kernel compilation, first-touch of the driver's allocator), not counted.
    for preset in ["phi3-mini", "llama3-8b"] {
        run(
            preset,
            PoolKind::Legacy,
            PurgePolicy::Never,
            AutoHeadroom::Ubatch,
        );
    }
    for _ in 0..REPS {
        for (preset, kind, purge, headroom, samples) in configs.iter_mut() {
            samples.push(run(preset, *kind, *purge, *headroom));
        }
    }
    // Against never: the median of each round's ratio (rounds are interleaved, so a ratio
    // within a round sees the same clocks and the same drift).
    let never: std::collections::HashMap<_, Vec<f64>> = configs
        .iter()
        .filter(|c| c.2 == PurgePolicy::Never)
        .map(|c| ((c.0, c.1), c.4.clone()))
        .collect();
    for (preset, kind, purge, headroom, samples) in configs.iter_mut() {
        let base = &never[&(*preset, *kind)];
        let mut ratios: Vec<f64> = samples.iter().zip(base).map(|(s, b)| s / b).collect();
        let ratio = median(&mut ratios);
        let med = median(samples);
        let layers = layers.unwrap_or(ModelShape::preset(preset).unwrap().n_layer);
        let label = match (*purge, *headroom) {
            (PurgePolicy::Auto, AutoHeadroom::Infinite) => "auto-eager",
            (p, _) => p.name(),
        };
        println!(
            "{{\"suite\":\"prefill\",\"preset\":\"{preset}\",\"layers\":{layers},\"tokens\":{TOKENS},\"pool\":\"{}\",\"purge\":\"{label}\",\"tokens_per_s\":{samples:?},\"median\":{med:.1},\"vs_never\":{ratio:.4}}}",
            kind.name(),
        );
    }
}
