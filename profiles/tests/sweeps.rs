//! The engine profiles against `llama-sweep-bench -c 20480 -ub 512 -n 1` runs recorded inside
//! ik_llama.cpp (tests/data): the profile's requests for every sweep step equal the recorded
//! ones request for request (size, name, and which buffer each free returns), and replaying the
//! profile through ggml's legacy policy gives the run's own peak pool reserve to the byte.
mod common;

use common::{phases, read_trace, same, setup, ubatch, Event};
use cupool_kernels::KvType;
use cupool_pool::trace::{self, Op};
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use cupool_profiles::{sweep_step, trace_events, Device, EngineModel, Weights};

struct Case {
    trace: &'static str,
    model: &'static str,
    weights: Weights,
    /// The run's own `reserved_bytes.all.peak` (legacy pool, CUPOOL_PURGE=never), from its
    /// runs.jsonl.
    peak_reserved: usize,
    /// Whether the start-up phase begins with sweep-bench's warm-up decode.
    warm_up: bool,
    /// The recorded model's layers, where it has fewer than the preset.
    n_layer: Option<usize>,
    /// The KV cache's type.
    kv: KvType,
}

/// What the profile says `llama-sweep-bench -c 20480 -ub 512 -n 1` asks of the pool in sweep
/// steps `steps`, as a trace with the run's ubatch boundaries; ids from `first_id`.
fn profile_trace(
    model: &EngineModel,
    weights: Weights,
    kv: KvType,
    steps: std::ops::Range<usize>,
    mut id: u64,
) -> Vec<Op> {
    let dev = Device::H100_SXM; // the H200 has the same 132 SMs and compute capability 9.0
    let mut ops = Vec::new();
    for k in steps {
        ops.push(Op::PhaseBegin {
            name: format!("step {k}"),
        });
        let s = sweep_step(k, 512);
        let setup = setup(model, weights, kv, dev);
        let decode = ubatch(&setup, 1, s.decode_n_kv, 1);
        let prefill = ubatch(&setup, 512, s.prefill_n_kv, 1);
        id = trace_events(&decode, id, &mut ops);
        id = trace_events(&prefill, id, &mut ops);
        ops.push(Op::PhaseEnd {
            name: format!("step {k}"),
            prefill: true,
        });
    }
    ops
}

fn check(c: &Case) {
    let recorded = read_trace(c.trace);
    let mut model = EngineModel::preset(c.model).unwrap();
    model.n_layer = c.n_layer.unwrap_or(model.n_layer);
    let got = phases(&profile_trace(&model, c.weights, c.kv, 0..40, 0));
    let want = phases(&recorded);
    // 40 sweep steps, each ending at a boundary; the phase after the last boundary is empty.
    assert_eq!(want.len(), 41, "{}", c.trace);
    assert!(want[40].is_empty(), "{}", c.trace);
    // The start-up phase: sweep-bench's warm-up (a one-token decode with no output row, in the
    // Phi-3 runs; the Llama-3 runs show none), then step 0.
    let dev = Device::H100_SXM;
    // The warm-up routes every token to every expert (llama_build_context: n_expert_used =
    // n_expert while warming up), so that each expert's weights are touched once.
    let mut warm_model = model.clone();
    if let Some(moe) = &mut warm_model.moe {
        moe.n_expert_used = moe.n_expert;
    }
    let warm = ubatch(&setup(&warm_model, c.weights, c.kv, dev), 1, 256, 0);
    let mut warm_ops = Vec::new();
    trace_events(&warm, 0, &mut warm_ops);
    let mut head = vec![Op::PhaseBegin {
        name: "start-up".into(),
    }];
    if c.warm_up {
        head.extend(warm_ops);
    }
    let step0 = profile_trace(&model, c.weights, c.kv, 0..1, head.len() as u64);
    head.extend(step0.into_iter().skip(1));
    same(c.trace, 0, &phases(&head)[0], &want[0]);
    for k in 1..40 {
        same(c.trace, k, &got[k], &want[k]);
    }
    // The run's start-up phase as recorded, then the profile's steps: replayed through ggml's
    // legacy policy without purging, the peak reserve is the run's own.
    let end = 1 + recorded
        .iter()
        .position(|o| matches!(o, Op::PhaseEnd { .. }))
        .unwrap();
    let mut ops = recorded[..end].to_vec();
    let next = ops
        .iter()
        .filter_map(|o| match o {
            Op::Alloc { id, .. } => Some(id + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    ops.extend(profile_trace(&model, c.weights, c.kv, 1..40, next));
    let legacy = PoolConfig::default().kind(PoolKind::Legacy);
    let predicted = trace::replay(&ops, &legacy, PurgePolicy::Never, None).unwrap();
    assert_eq!(
        predicted.peak_reserved_bytes, c.peak_reserved,
        "{}",
        c.trace
    );
}

#[test]
fn ik_llama_phi3_mini_f16_weights() {
    check(&Case {
        trace: "tests/data/h200-2026-11-22-llama/never16-trace.trace.jsonl.gz",
        model: "phi3-mini",
        weights: Weights::F16,
        peak_reserved: 2_698_837_504,
        warm_up: true,
        n_layer: None,
        kv: KvType::Q8_0,
    });
}

#[test]
fn ik_llama_phi3_mini_q8_0_weights() {
    check(&Case {
        trace: "tests/data/h200-2026-11-22-traces/phi3-mini-q8_0-trace.trace.jsonl.gz",
        model: "phi3-mini",
        weights: Weights::Q8_0,
        peak_reserved: 2_697_989_376,
        warm_up: true,
        n_layer: None,
        kv: KvType::Q8_0,
    });
}

#[test]
fn ik_llama_llama3_8b_f16_weights() {
    check(&Case {
        trace: "tests/data/h200-2026-11-22-traces/llama3-8b-f16-trace.trace.jsonl.gz",
        model: "llama3-8b",
        weights: Weights::F16,
        peak_reserved: 238_665_472,
        warm_up: false,
        n_layer: None,
        kv: KvType::Q8_0,
    });
}

#[test]
fn ik_llama_llama3_8b_q8_0_weights() {
    check(&Case {
        trace: "tests/data/h200-2026-11-22-traces/llama3-8b-q8_0-trace.trace.jsonl.gz",
        model: "llama3-8b",
        weights: Weights::Q8_0,
        peak_reserved: 232_872_448,
        warm_up: false,
        n_layer: None,
        kv: KvType::Q8_0,
    });
}

/// Qwen3-30B-A3B's shape with 4 of its 48 layers (each layer's requests are the same), q8_0
/// weights: the experts' fused up-gate-down op, MMVQ for the decodes and MMQ's expert path for
/// the prefills.
#[test]
fn ik_llama_qwen3_30b_a3b_q8_0_weights() {
    check(&Case {
        trace: "tests/data/h200-2026-11-22-moe/qwen3-q8_0-trace.trace.jsonl.gz",
        model: "qwen3-30b-a3b",
        weights: Weights::Q8_0,
        peak_reserved: 272_782_080,
        warm_up: true,
        n_layer: Some(4),
        kv: KvType::Q8_0,
    });
}

/// DeepSeek-V3's shape with 4 of its 61 layers (3 dense, then the experts with a shared one),
/// q8_0 weights, `-mla 3 -fa`: the decodes take the absorbed path (flash attention over the
/// compressed cache, heads of 576/512), the prefills decompress the cache (`wkv_b × cache`
/// through cuBLAS, in head chunks once past 2048 positions) before attending with heads of
/// 192/128. With a q8_0 and with an f16 cache.
#[test]
fn ik_llama_deepseek_v3_q8_0_weights() {
    for (trace, kv, peak_reserved) in [
        ("ds-q8_0-kvq8_0-trace", KvType::Q8_0, 433_435_904),
        ("ds-q8_0-kvf16-trace", KvType::F16, 362_110_976),
    ] {
        check(&Case {
            trace: Box::leak(
                format!("tests/data/h200-2026-11-22-moe/{trace}.trace.jsonl.gz").into_boxed_str(),
            ),
            model: "deepseek-v3",
            weights: Weights::Q8_0,
            peak_reserved,
            warm_up: true,
            n_layer: Some(4),
            kv,
        });
    }
}

/// Qwen3-30B-A3B with f16 experts: each expert's matrix multiply is sized by the tokens the
/// router sends it, so the profile refuses it, and the recording shows why: two sweep steps of
/// one shape ask for different sizes.
#[test]
fn f16_experts_depend_on_the_routing() {
    let recorded = read_trace("tests/data/h200-2026-11-22-moe/qwen3-f16-trace.trace.jsonl.gz");
    let steps = phases(&recorded);
    let sizes = |k: usize| -> std::collections::BTreeSet<usize> {
        steps[k]
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(size, name) if name.contains("MUL_MAT_ID") || name.contains("MOE") => {
                    Some(*size)
                }
                _ => None,
            })
            .collect()
    };
    assert!(!sizes(5).is_empty());
    assert_ne!(
        sizes(5),
        sizes(6),
        "routing-dependent sizes differ between steps"
    );
    let m = EngineModel::preset("qwen3-30b-a3b").unwrap();
    let u = cupool_profiles::UbatchShape {
        n_tokens: 512,
        n_kv: 1024,
        n_outputs: 1,
    };
    for p in cupool_profiles::Profile::ALL {
        let e = p
            .ubatch(&setup(&m, Weights::F16, KvType::Q8_0, Device::H100_SXM), u)
            .unwrap_err()
            .to_string();
        assert!(e.contains("q8_0"), "{e}");
    }
}
