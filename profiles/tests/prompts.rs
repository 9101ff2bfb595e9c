//! The engine profiles against llama-bench prompts recorded inside ik_llama.cpp (tests/data):
//! whole ubatches of a prompt, on one GPU and on two (`-sm layer`), and DeepSeek-V3's short
//! ubatches as captured into CUDA graphs; the profile's requests equal the recorded ones request
//! for request.
mod common;

use common::{phases, phases_of, prompt_ubatch, read_trace, same, setup, Event};
use cupool_kernels::KvType;
use cupool_pool::trace::Op;
use cupool_profiles::{trace_events, Device, EngineModel, Profile, UbatchShape, Weights};

/// llama-bench prompts recorded on two H200s (`-sm layer`: each device's pool serves its
/// layers, the second also the output matrix): each batch's last token has logits, the others
/// none; phi3-mini f16 `-p 8192 -b 2048 -ub 2048` (flash attention over 2048 queries: the KV
/// tile bounds) and llama3-8b q8_0 `-p 5000 -b 2048 -ub 512` (a short last ubatch of 392).
/// The start-up phase (llama-bench's warm-up and the first ubatch) is not compared.
#[test]
fn ik_llama_prompts_on_two_gpus() {
    let dev = Device::H100_SXM;
    for (trace, model, weights, tokens, batch, ubatch, split) in [
        (
            "phi3-f16-p8192-ub2048",
            "phi3-mini",
            Weights::F16,
            8192usize,
            2048,
            2048,
            16,
        ),
        (
            "llama3-q8_0-p5000",
            "llama3-8b",
            Weights::Q8_0,
            5000,
            2048,
            512,
            17,
        ),
    ] {
        let path = format!("tests/data/h200-2026-11-22-traces/{trace}.trace.jsonl.gz");
        let recorded = read_trace(&path);
        let m = EngineModel::preset(model).unwrap();
        let n_ub: usize = tokens.div_ceil(ubatch);
        for (stream, layers) in [(0u64, 0..split), (1, split..m.n_layer)] {
            let want = phases_of(&recorded, Some(stream));
            assert_eq!(
                want.len(),
                n_ub + 1,
                "{trace}: a phase per ubatch after the first, and the last empty"
            );
            for (j, w) in want.iter().enumerate().take(n_ub).skip(1) {
                let u = prompt_ubatch(j, tokens, batch, ubatch);
                let mut calls = Vec::new();
                let s = setup(&m, weights, KvType::Q8_0, dev);
                for l in layers.clone() {
                    calls.extend(Profile::IkLlama.layer(&s, u, l).unwrap());
                }
                if stream == 1 {
                    calls.extend(Profile::IkLlama.output(&s, u));
                }
                let mut ops = vec![Op::PhaseBegin {
                    name: String::new(),
                }];
                trace_events(&calls, 0, &mut ops);
                same(&format!("{trace} stream {stream}"), j, &phases(&ops)[0], w);
            }
        }
    }
}

/// llama-bench prompts on one H200, `-p 5000 -b 2048 -ub 512` (ubatches of 512 tokens, the
/// last of each batch with one output row, a short last ubatch of 392), q8_0 weights and cache:
/// Qwen3-30B-A3B's shape (4 layers; the experts on MMQ's expert path) and DeepSeek-V3's (4
/// layers; every ubatch decompresses the cache, in head chunks past 2048 positions). The
/// start-up phase (llama-bench's warm-up and the first ubatch) is not compared.
#[test]
fn ik_llama_moe_prompts() {
    let dev = Device::H100_SXM;
    let (tokens, batch, ubatch) = (5000usize, 2048, 512);
    for (trace, model) in [
        ("qwen3-q8_0-p5000-trace", "qwen3-30b-a3b"),
        ("ds-q8_0-p5000-trace", "deepseek-v3"),
    ] {
        let recorded = read_trace(&format!(
            "tests/data/h200-2026-11-22-moe/{trace}.trace.jsonl.gz"
        ));
        let mut m = EngineModel::preset(model).unwrap();
        m.n_layer = 4;
        if let Some(mla) = &mut m.mla {
            mla.attn_max_batch_mib = 0; // llama-bench's default -amb
        }
        let n_ub = tokens.div_ceil(ubatch);
        let want = phases(&recorded);
        assert_eq!(want.len(), n_ub + 1, "{trace}");
        for (j, w) in want.iter().enumerate().take(n_ub).skip(1) {
            let u = prompt_ubatch(j, tokens, batch, ubatch);
            let calls = Profile::IkLlama
                .ubatch(&setup(&m, Weights::Q8_0, KvType::Q8_0, dev), u)
                .unwrap();
            let mut ops = vec![Op::PhaseBegin {
                name: String::new(),
            }];
            trace_events(&calls, 0, &mut ops);
            same(trace, j, &phases(&ops)[0], w);
        }
    }
}

/// The last `n_allocs` allocations of one stream's pool (and the frees of them), in order, the
/// free of an allocation naming its position in that window.
fn window(ops: &[Op], stream: u64, n_allocs: usize) -> Vec<Event> {
    let total = ops
        .iter()
        .filter(|o| matches!(o, Op::Alloc { stream: s, .. } if *s == stream))
        .count();
    assert!(
        total >= n_allocs,
        "{total} allocations recorded, {n_allocs} predicted"
    );
    let mut seen = 0;
    let mut pos = std::collections::HashMap::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Alloc {
                id,
                size,
                name,
                stream: s,
            } if *s == stream => {
                seen += 1;
                if seen > total - n_allocs {
                    pos.insert(*id, out.len());
                    out.push(Event::Alloc(*size, name.clone().unwrap_or_default()));
                }
            }
            Op::Free { id } => {
                if let Some(&at) = pos.get(id) {
                    out.push(Event::Free(at));
                }
            }
            _ => {}
        }
    }
    out
}

/// DeepSeek-V3's absorbed MLA path for ubatches of 2, 4, 64 and 100 tokens (fewer than 128: the
/// cache is not decompressed; above 8 tokens `wk_b` and `wv_b` run one MMQ launch per head),
/// recorded with llama-bench on two H200s (`-sm layer`; the first device holds the 3 dense
/// layers). There ik_llama.cpp runs these small ubatches as CUDA graphs: the pool sees a
/// ubatch's requests only when a graph is captured, i.e. when the KV length differs from the
/// previous ubatch's. The last capture (the last ubatch that changed the KV length) equals the
/// profile's requests for that ubatch, request for request; the profile gives every ubatch's,
/// which the replays of the captured graph repeat without asking the pool.
#[test]
fn ik_llama_deepseek_v3_short_ubatches() {
    let dev = Device::H100_SXM;
    for ub in [2usize, 4, 64, 100] {
        let trace = format!("tests/data/h200-2026-11-22-moe/ds-ub{ub}.trace.jsonl.gz");
        let recorded = read_trace(&trace);
        let mut m = EngineModel::preset("deepseek-v3").unwrap();
        m.n_layer = 4;
        if let Some(mla) = &mut m.mla {
            mla.attn_max_batch_mib = 0; // llama-bench's default -amb
        }
        let n_kv = |j: usize| ((j + 1) * ub).next_multiple_of(256);
        let last_capture = (0..12)
            .rev()
            .find(|&j| j == 0 || n_kv(j) != n_kv(j - 1))
            .unwrap();
        let u = UbatchShape {
            n_tokens: ub,
            n_kv: n_kv(last_capture),
            n_outputs: 0,
        };
        let s = setup(&m, Weights::Q8_0, KvType::Q8_0, dev);
        let mut calls = Vec::new();
        for l in 0..3 {
            calls.extend(Profile::IkLlama.layer(&s, u, l).unwrap());
        }
        let mut ops = Vec::new();
        trace_events(&calls, 0, &mut ops);
        let n = ops.iter().filter(|o| matches!(o, Op::Alloc { .. })).count();
        same(
            &format!("ds-ub{ub} device 0"),
            last_capture,
            &window(&ops, 0, n),
            &window(&recorded, 0, n),
        );
    }
}
