//! The engine profiles against traces recorded inside the engines (docs/data): the profile's
//! requests for every ubatch of a run equal the recorded ones request for request (size, name,
//! and which buffer each free returns), and replaying the profile through ggml's legacy policy
//! gives the run's own peak pool reserve to the byte.
use cupool::kernels::KvType;
use cupool::pool::{PoolConfig, PoolKind, PurgePolicy};
use cupool::runtime::profile::{
    sweep_step, trace_events, Device, EngineModel, OpCall, Profile, Setup, UbatchShape, Weights,
};
use cupool::trace::{self, Op};
use std::io::Read;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn setup(model: &EngineModel, weights: Weights, kv: KvType, dev: Device) -> Setup {
    Setup {
        model: model.clone(),
        weights,
        kv,
        dev,
    }
}

/// Ubatch `j` of a llama-bench prompt of `tokens` in batches of `batch`: each batch's last
/// token asks for logits.
fn prompt_ubatch(j: usize, tokens: usize, batch: usize, ubatch: usize) -> UbatchShape {
    let start = j * ubatch;
    let end = (start + ubatch).min(tokens);
    UbatchShape {
        n_tokens: end - start,
        n_kv: end.next_multiple_of(256),
        n_outputs: usize::from(end % batch == 0 || end == tokens),
    }
}

/// ik_llama.cpp's requests for a ubatch of `n_tokens` over `n_kv` positions.
fn ubatch(s: &Setup, n_tokens: usize, n_kv: usize, n_outputs: usize) -> Vec<OpCall> {
    let u = UbatchShape {
        n_tokens,
        n_kv,
        n_outputs,
    };
    Profile::IkLlama.ubatch(s, u).unwrap()
}

fn read_trace(rel: &str) -> Vec<Op> {
    let f = std::fs::File::open(format!("{ROOT}/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap();
    trace::parse(&text).unwrap()
}

/// A phase's allocations and frees with ids replaced by positions: an allocation is (size,
/// name), a free names the position of the allocation it returns.
#[derive(Debug, PartialEq)]
enum Event {
    Alloc(usize, String),
    Free(usize),
}

fn phases(ops: &[Op]) -> Vec<Vec<Event>> {
    phases_of(ops, None)
}

/// As `phases`, for one stream's pool only (a device of a multi-GPU run) when `stream` is set.
fn phases_of(ops: &[Op], stream: Option<u64>) -> Vec<Vec<Event>> {
    let mut out: Vec<Vec<Event>> = Vec::new();
    let mut pos = std::collections::HashMap::new();
    for op in ops {
        match op {
            Op::PhaseBegin { .. } => {
                out.push(Vec::new());
                pos.clear();
            }
            Op::Alloc { stream: s, .. } if stream.is_some_and(|want| want != *s) => {}
            Op::Free { id } if !pos.contains_key(id) && stream.is_some() => {}
            Op::Alloc { id, size, name, .. } => {
                let phase = out.last_mut().expect("allocations before the first phase");
                pos.insert(*id, phase.len());
                phase.push(Event::Alloc(*size, name.clone().unwrap_or_default()));
            }
            Op::Free { id } => {
                let phase = out.last_mut().unwrap();
                let at = *pos
                    .get(id)
                    .expect("a free of an allocation of another phase");
                phase.push(Event::Free(at));
            }
            _ => {}
        }
    }
    out
}

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

fn same(trace: &str, k: usize, got: &[Event], want: &[Event]) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{trace}: step {k}: {} events predicted, {} recorded; first difference at event {at}: predicted {:?}, recorded {:?}",
            got.len(),
            want.len(),
            got.get(at),
            want.get(at)
        );
    }
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
        trace: "docs/data/h200-2026-11-22-llama/never16-trace.trace.jsonl.gz",
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
        trace: "docs/data/h200-2026-11-22-traces/phi3-mini-q8_0-trace.trace.jsonl.gz",
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
        trace: "docs/data/h200-2026-11-22-traces/llama3-8b-f16-trace.trace.jsonl.gz",
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
        trace: "docs/data/h200-2026-11-22-traces/llama3-8b-q8_0-trace.trace.jsonl.gz",
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
        trace: "docs/data/h200-2026-11-22-moe/qwen3-q8_0-trace.trace.jsonl.gz",
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
                format!("docs/data/h200-2026-11-22-moe/{trace}.trace.jsonl.gz").into_boxed_str(),
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

/// cupool's runtime taking a profile's traffic (`repro-prefill run/plan --engine ik-llama`) and
/// the profile's trace replayed (`repro-prefill predict`) are two paths to one answer: the
/// runtime skips what repeats, the replay runs every request.
#[test]
fn the_runtime_with_a_profile_equals_the_profile_s_replay() {
    use cupool::pool::driver::sim::{SimConfig, SimDevice};
    use cupool::predict::{predict, EngineRun, Schedule};
    use cupool::runtime::executor::dry_run::DryRun;
    use cupool::runtime::profile::EngineKind;
    use cupool::runtime::{ModelShape, RunConfig, Runtime};
    use std::sync::Arc;
    for (profile, model, weights) in [
        (Profile::IkLlama, "phi3-mini", Weights::F16),
        (Profile::IkLlama, "llama3-8b", Weights::Q8_0),
        (Profile::LlamaB8833, "phi3-mini", Weights::Q8_0),
        (Profile::Llama, "llama3-8b", Weights::F16),
    ] {
        for (kind, purge) in [
            (PoolKind::Legacy, PurgePolicy::Never),
            (PoolKind::Legacy, PurgePolicy::Always),
            (PoolKind::Vmm, PurgePolicy::Never),
        ] {
            for (prompt, ubatch) in [(20_000, 512), (3_000, 256), (700, 512)] {
                let mut cfg = RunConfig::new(ModelShape::preset(model).unwrap(), 20480);
                cfg.engine = EngineKind::Profile { profile, cc: 900 };
                cfg.weight_type = weights;
                cfg.pool = PoolConfig::default().kind(kind);
                cfg.purge = purge;
                cfg.n_ubatch = ubatch;
                let card = SimConfig::gib(64.0).backed(false).record_calls(false);
                let driver = Arc::new(SimDevice::new(card).unwrap());
                let mut rt = Runtime::new(driver, cfg.clone(), Box::new(DryRun)).unwrap();
                let ran = rt.prefill(prompt).unwrap();
                let run = EngineRun {
                    profile,
                    setup: setup(
                        &EngineModel::preset(model).unwrap(),
                        weights,
                        KvType::Q8_0,
                        Device::H100_SXM,
                    ),
                    schedule: Schedule::Prompt {
                        tokens: prompt,
                        batch: 2048,
                        ubatch,
                    },
                };
                let p = predict(&run, &cfg.pool, purge, None).unwrap();
                let what = format!(
                    "{} {model} {kind:?} {purge:?} {prompt}/{ubatch}",
                    profile.name()
                );
                assert!(ran.completed, "{what}");
                assert_eq!(
                    ran.peak_reserved_bytes, p.replay.peak_reserved_bytes,
                    "{what}"
                );
                assert_eq!(ran.peak_live_bytes, p.replay.peak_live_bytes, "{what}");
                assert_eq!(
                    ran.driver_mallocs,
                    p.replay.driver_mallocs + p.replay.driver_maps,
                    "{what}"
                );
            }
        }
    }
}

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
        let path = format!("docs/data/h200-2026-11-22-traces/{trace}.trace.jsonl.gz");
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
            "docs/data/h200-2026-11-22-moe/{trace}.trace.jsonl.gz"
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

/// Qwen3-30B-A3B with f16 experts: each expert's matrix multiply is sized by the tokens the
/// router sends it, so the profile refuses it, and the recording shows why: two sweep steps of
/// one shape ask for different sizes.
#[test]
fn f16_experts_depend_on_the_routing() {
    let recorded = read_trace("docs/data/h200-2026-11-22-moe/qwen3-f16-trace.trace.jsonl.gz");
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
    let u = cupool::runtime::profile::UbatchShape {
        n_tokens: 512,
        n_kv: 1024,
        n_outputs: 1,
    };
    for p in cupool::runtime::profile::Profile::ALL {
        let e = p
            .ubatch(&setup(&m, Weights::F16, KvType::Q8_0, Device::H100_SXM), u)
            .unwrap_err()
            .to_string();
        assert!(e.contains("q8_0"), "{e}");
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
        let trace = format!("docs/data/h200-2026-11-22-moe/ds-ub{ub}.trace.jsonl.gz");
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

/// The startup compute buffer of a profile against the one ik_llama.cpp logged (`-ub 512`,
/// `-c 20480`): where the engine's peak is the output stage (every row's logits beside the
/// final norm), exactly; where it peaks inside a layer (Phi-3's fused FFN, DeepSeek's latent
/// attention), cupool's own layout is the estimate: within 5% for phi3-mini, and above the
/// engine's for deepseek-v3 (the plan errs towards not fitting).
#[test]
fn compute_buffers_against_the_engine_s_logs() {
    use cupool::runtime::profile::{EngineKind, Profile};
    use cupool::runtime::{ModelShape, RunConfig};
    let logged = |rel: &str| -> usize {
        let text = std::fs::read_to_string(format!("{ROOT}/{rel}")).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("CUDA0 compute buffer size"))
            .unwrap_or_else(|| panic!("{rel}: no compute buffer line"));
        let mib: f64 = line
            .split('=')
            .nth(1)
            .and_then(|v| v.trim().strip_suffix("MiB"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{rel}: {line}"));
        (mib * (1 << 20) as f64).round() as usize
    };
    for (log, model, exact) in [
        (
            "h200-2026-11-22-traces/llama3-8b-q8_0-trace.log",
            "llama3-8b",
            true,
        ),
        (
            "h200-2026-11-22-moe/qwen3-q8_0-trace.log",
            "qwen3-30b-a3b",
            true,
        ),
        (
            "h200-2026-11-22-traces/phi3-mini-q8_0-trace.log",
            "phi3-mini",
            false,
        ),
        (
            "h200-2026-11-22-moe/ds-q8_0-kvq8_0-trace.log",
            "deepseek-v3",
            false,
        ),
    ] {
        let engine = logged(&format!("docs/data/{log}"));
        let mut cfg = RunConfig::new(ModelShape::preset(model).unwrap(), 20480);
        cfg.engine = EngineKind::Profile {
            profile: Profile::IkLlama,
            cc: 900,
        };
        cfg.weight_type = Weights::Q8_0;
        let ours = cfg.compute_bytes();
        if exact {
            assert_eq!(ours, engine, "{model}");
        } else if model == "deepseek-v3" {
            assert!(ours >= engine, "{model}: {ours} < {engine}");
        } else {
            assert!(
                ours.abs_diff(engine) * 20 <= engine,
                "{model}: {ours} vs {engine}"
            );
        }
    }
}
