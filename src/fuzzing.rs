//! Fuzz entry points: each takes arbitrary bytes and panics only when it finds a bug.
//!
//! The cargo-fuzz targets in `fuzz/` call these, and `tests/fuzz_corpus.rs` replays the
//! committed corpus plus a bounded fresh run through them on stable Rust.

use crate::pool::check::{self, flavors};
use crate::pool::driver::sim::{SimConfig, SimDevice};
use crate::pool::driver::Driver;
use crate::pool::PoolConfig;
use crate::runtime::executor::dry_run::DryRun;
use crate::runtime::{ModelShape, RunConfig, Runtime};
use std::sync::Arc;

/// Operation sequences against every pool flavour; the first byte picks the flavour.
pub fn pool_ops(data: &[u8]) {
    run_ops(data, false);
}

/// The same with driver faults armed by the input.
pub fn pool_faults(data: &[u8]) {
    run_ops(data, true);
}

fn run_ops(data: &[u8], faults: bool) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let all = flavors();
    let flavor = all[first as usize % all.len()];
    let ops = check::ops_from_bytes(rest);
    if let Err(e) = check::run(flavor, &ops, faults) {
        panic!("pool invariant broken: {e}\nops: {ops:?}");
    }
}

/// The trace parser, and a replay of whatever parses through two pools on a small card.
pub use crate::pool::trace::fuzz::parser as trace_parser;

/// The environment variables and the shape validation that CLI values flow into.
pub fn env_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    if let Ok(config) = PoolConfig::from_lookup(get) {
        for vmm in [false, true] {
            let dev: Arc<dyn Driver> = Arc::new(
                SimDevice::new(SimConfig::gib(0.25).vmm(vmm).record_calls(false))
                    .expect("a valid card"),
            );
            if let Ok(pool) = config.build(dev) {
                if let Ok(b) = pool.alloc(4096) {
                    pool.free(b).expect("a block goes back to its own pool");
                }
            }
        }
    }
    // Shapes: small dimensions from the bytes; anything invalid must be an error.
    let b = |i: usize| *data.get(i).unwrap_or(&1) as usize;
    let model = ModelShape {
        name: "fuzz".into(),
        n_layer: b(0) % 4,
        n_embd: b(1) * 8,
        n_head: b(2) % 17,
        n_head_kv: b(3) % 9,
        head_dim_k: b(4) * 4,
        head_dim_v: b(5) * 4,
        v_is_k: b(6) % 2 == 1,
        n_ff: b(7) * 8,
        weights_bytes: b(8) << 20,
    };
    let mut cfg = RunConfig::new(model, b(9) * 16);
    cfg.n_batch = b(10) * 4;
    cfg.n_ubatch = b(11) * 4;
    cfg.sms = b(12) % 200;
    let prompt = b(13) * 16;
    let dev: Arc<dyn Driver> = Arc::new(
        SimDevice::new(SimConfig::gib(1.0).backed(false).record_calls(false))
            .expect("a valid card"),
    );
    if let Ok(mut rt) = Runtime::new(dev, cfg, Box::new(DryRun)) {
        let _ = rt.prefill(prompt);
    }
}

/// Arbitrary bytes as a GGUF file, whole and as the start of a 1 TiB file: the reader must
/// answer with an error or a header whose tensors lie inside the file, and the mapping with an
/// error or a model whose heads divide into KV groups.
pub fn gguf(data: &[u8]) {
    use crate::profiles::gguf::{GgufFile, GgufModel};
    for len in [data.len() as u64, 1 << 40] {
        let Ok(file) = GgufFile::from_bytes(data, len) else {
            continue;
        };
        assert_eq!(file.data_offset % file.alignment, 0);
        for t in &file.tensors {
            let end = file.data_offset + t.offset + t.bytes;
            assert!(end <= len, "tensor {:?} ends at {end}, past {len}", t.name);
        }
        if let Ok(m) = GgufModel::from_file(file) {
            let model = m.to_model();
            assert_eq!(model.n_head % model.n_head_kv, 0, "{model:?}");
            let _ = m.weights();
        }
    }
}
