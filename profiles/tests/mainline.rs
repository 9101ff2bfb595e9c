//! The `llama` profile against mainline llama.cpp 0c1e5709 with cupool's shim on an H100
//! (2026-11-25, tests/data/h100-2026-11-25-mainline): `llama-bench -n 0 -r 1 -b 2048 -fa 1 -ctk
//! q8_0 -ctv q8_0 -ngl 99` with `GGML_POOL=legacy CUPOOL_PURGE=never` over random-weight
//! GGUFs: phi3-mini f16 `-p 5000 -ub 512`, `-p 8192 -ub 2048` and `-p 20480 -ub 512`, llama3-8b
//! q8_0 `-p 5000` and `-p 20480` (`-ub 512`), and Qwen3-30B-A3B's shape with 4 layers, q8_0,
//! `-p 5000 -ub 512`. llama-bench's context is the prompt (padded to 256 positions).
//!
//! Every ubatch phase is compared: llama-bench's warm-up runs the whole prompt once before
//! the measured run (`test_prompt` over `n_prompt` tokens, then `llama_memory_clear`), so a
//! trace holds the prompt's ubatches twice, the warm-up's first in the "start-up" phase (the
//! first compute takes nothing from the pool that a later ubatch does not: flash attention's
//! and the matrix multiplies' buffers are all per call). The phase after the last ubatch is
//! empty (`-n 0`: no decode).
//!
//! Each phase is compared step by step: the profile's requests for each ubatch or generated
//! token of the phase, in order, against the recorded events in the same place.
//!
//! `logs.json` is what `scripts/llama/mainline_logs.py` extracts from the runs' `-v` logs.
//!
//! Two more runs (tests/data/h100-2026-11-25-mainline-fa-pool, the same build and flags, phi3-mini
//! f16 and llama3-8b q8_0 at `-p 5000 -ub 512`) set `CUPOOL_FA_KV=pool`: flash attention takes a
//! quantized cache's f16 copies from the pool, as llama.cpp did before PR #23907, so the
//! `llama-b8833` profile (the same kernels, the copies from the pool) predicts them.
//!
//! Six runs generate after their prompt (tests/data/h100-2026-11-25-mainline-decode, the same
//! build): `llama-bench -p 0 -n 0 -pg 4064,64 -r 1 -ub 512` with `GGML_CUDA_DISABLE_GRAPHS=1`, so
//! that every one-token step reaches the pool rather than a CUDA graph's replay, over the three
//! models, with the K/V copies in the compute buffer (`llama`) and with `CUPOOL_FA_KV=pool`
//! (`llama-b8833`). The warm-up generates one token at position 4,064; the measured run 64 from
//! there, over 4,096 cache positions up to position 4,095 and 4,352 from 4,096 on. One-token
//! steps mark no ubatch end, so they share the phase of the prompt ubatch before them
//! (`cupool_profiles::bench`): the warm-up's token the measured prompt's first phase, the 64
//! tokens the last phase.
//!
//! Two runs generate with CUDA graphs on, as mainline runs by default
//! (tests/data/h100-2026-11-26-mainline-graphs, the same flags without `GGML_CUDA_DISABLE_GRAPHS`,
//! phi3-mini f16 and Qwen3-30B-A3B's shape with 12 layers, the `llama` profile): ggml captures a
//! one-token step's graph on the second step of a shape and replays it after, so of the 64
//! measured tokens only four reach the pool, the first two at 4,096 cache positions (the first
//! run directly, the second captured) and the first two at 4,352 (`bench::LlamaBench::steps`);
//! the logs say the same ("CUDA graph warmup complete", "reset", "complete"). The prompt-only
//! runs above ran with graphs on too: no two consecutive steps of theirs share a shape, so none
//! replays.
mod common;

use common::{phases, read_trace, same, setup, Event};
use cupool_kernels::KvType;
use cupool_pool::trace::{replay, Op};
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use cupool_profiles::bench::{bench_trace, LlamaBench, Step};
use cupool_profiles::llama::{compute_buffer_bytes, Version};
use cupool_profiles::{Device, EngineModel, Profile, Setup, Weights};

const DATA: &str = "tests/data/h100-2026-11-25-mainline";
const FA_POOL: &str = "tests/data/h100-2026-11-25-mainline-fa-pool";
const DECODE: &str = "tests/data/h100-2026-11-25-mainline-decode";
const GRAPHS: &str = "tests/data/h100-2026-11-26-mainline-graphs";

/// One recorded llama-bench run.
struct Run {
    /// The folder of its trace and logs.json.
    dir: &'static str,
    /// The profile that models it.
    profile: Profile,
    name: &'static str,
    model: &'static str,
    /// Layers kept by `gen_model.py --layers`, when not the preset's.
    layers: Option<usize>,
    weights: Weights,
    /// Whether ggml's CUDA graphs were on (no `GGML_CUDA_DISABLE_GRAPHS`).
    cuda_graphs: bool,
}

const RUNS: [Run; 16] = [
    run("phi3-f16-p5000-ub512", "phi3-mini", None, Weights::F16),
    run("phi3-f16-p8192-ub2048", "phi3-mini", None, Weights::F16),
    run("phi3-f16-p20480-ub512", "phi3-mini", None, Weights::F16),
    run("llama3-q8-p5000-ub512", "llama3-8b", None, Weights::Q8_0),
    run("llama3-q8-p20480-ub512", "llama3-8b", None, Weights::Q8_0),
    run(
        "qwen3-q8-p5000-ub512",
        "qwen3-30b-a3b",
        Some(4),
        Weights::Q8_0,
    ),
    fa_pool(run(
        "phi3-f16-fapool-p5000-ub512",
        "phi3-mini",
        None,
        Weights::F16,
    )),
    fa_pool(run(
        "llama3-q8-fapool-p5000-ub512",
        "llama3-8b",
        None,
        Weights::Q8_0,
    )),
    decode(run(
        "phi3-f16-pg4064-64-ub512",
        "phi3-mini",
        None,
        Weights::F16,
    )),
    decode(run(
        "llama3-q8-pg4064-64-ub512",
        "llama3-8b",
        None,
        Weights::Q8_0,
    )),
    decode(run(
        "qwen3-q8-pg4064-64-ub512",
        "qwen3-30b-a3b",
        Some(4),
        Weights::Q8_0,
    )),
    decode(fa_pool(run(
        "phi3-f16-fapool-pg4064-64-ub512",
        "phi3-mini",
        None,
        Weights::F16,
    ))),
    decode(fa_pool(run(
        "llama3-q8-fapool-pg4064-64-ub512",
        "llama3-8b",
        None,
        Weights::Q8_0,
    ))),
    decode(fa_pool(run(
        "qwen3-q8-fapool-pg4064-64-ub512",
        "qwen3-30b-a3b",
        Some(4),
        Weights::Q8_0,
    ))),
    graphs(run(
        "phi3-f16-graphs-pg4064-64-ub512",
        "phi3-mini",
        None,
        Weights::F16,
    )),
    graphs(run(
        "qwen3-q8-graphs-pg4064-64-ub512",
        "qwen3-30b-a3b",
        Some(12),
        Weights::Q8_0,
    )),
];

const fn run(
    name: &'static str,
    model: &'static str,
    layers: Option<usize>,
    weights: Weights,
) -> Run {
    Run {
        dir: DATA,
        profile: Profile::Llama,
        name,
        model,
        layers,
        weights,
        cuda_graphs: true,
    }
}

/// A run with `CUPOOL_FA_KV=pool`.
const fn fa_pool(r: Run) -> Run {
    Run {
        dir: FA_POOL,
        profile: Profile::LlamaB8833,
        ..r
    }
}

/// A run that generates after its prompt (`-pg`), with the same profile, CUDA graphs off.
const fn decode(r: Run) -> Run {
    Run {
        dir: DECODE,
        cuda_graphs: false,
        ..r
    }
}

/// A run that generates after its prompt with CUDA graphs on.
const fn graphs(r: Run) -> Run {
    Run { dir: GRAPHS, ..r }
}

/// What the run's log says (see `scripts/llama/mainline_logs.py`).
struct Logged {
    tokens: usize,
    gen: usize,
    reps: usize,
    batch: usize,
    ubatch: usize,
    pool_peak_reserved_bytes: usize,
    n_ctx: usize,
    /// `~llama_context`'s CUDA0 compute buffer: MiB with 4 decimals, as printed.
    compute_mib: String,
}

impl Run {
    fn setup(&self) -> Setup {
        let mut m = EngineModel::preset(self.model).unwrap();
        if let Some(l) = self.layers {
            m.n_layer = l;
        }
        setup(&m, self.weights, KvType::Q8_0, Device::H100_SXM)
    }

    /// The llama.cpp the profile models.
    fn version(&self) -> Version {
        match self.profile {
            Profile::LlamaB8833 => Version::B8833,
            _ => Version::D99724f2,
        }
    }

    fn recorded(&self) -> Vec<Op> {
        read_trace(&format!("{}/{}.trace.jsonl.gz", self.dir, self.name))
    }

    fn logged(&self) -> Logged {
        let path = format!("{}/{}/logs.json", env!("CARGO_MANIFEST_DIR"), self.dir);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let all: serde_json::Value = serde_json::from_str(&text).unwrap();
        let r = &all[self.name];
        let n = |k: &str| {
            r[k].as_u64()
                .unwrap_or_else(|| panic!("{path}: {}: no {k}", self.name)) as usize
        };
        Logged {
            tokens: n("n_prompt"),
            gen: n("n_gen"),
            reps: n("reps"),
            batch: n("n_batch"),
            ubatch: n("n_ubatch"),
            pool_peak_reserved_bytes: n("pool_peak_reserved_bytes"),
            n_ctx: n("n_ctx"),
            compute_mib: r["compute_mib"].as_str().unwrap().to_string(),
        }
    }
}

impl Logged {
    /// The llama-bench test the run was.
    fn bench(&self, cuda_graphs: bool) -> LlamaBench {
        LlamaBench {
            prompt: self.tokens,
            gen: self.gen,
            batch: self.batch,
            ubatch: self.ubatch,
            reps: self.reps,
            warmup: true,
            cuda_graphs,
        }
    }
}

/// The profile's events for one step, their frees numbered from `offset` (the step's place in
/// its phase).
fn step_events(r: &Run, s: &Setup, step: &Step, offset: usize) -> Vec<Event> {
    common::step_events(&r.profile.ubatch(s, step.shape).unwrap(), offset)
}

/// Every step of the warm-up and of the measured run, prompt ubatches and generated tokens: the
/// profile's requests equal the recorded ones request for request (size, the op that asked,
/// order, which free returns which), in the phase and the place the engine made them; a step a
/// CUDA graph's replay runs has none.
#[test]
fn every_step_s_requests_equal_the_recorded_ones() {
    let (mut decode_steps, mut replayed) = (0, 0);
    for r in &RUNS {
        let log = r.logged();
        let s = r.setup();
        let recorded = phases(&r.recorded());
        let steps = log.bench(r.cuda_graphs).steps().unwrap();
        // A phase ends where the engine marks a ubatch's end: a phase per marked step, and one
        // after the last (empty unless tokens were generated after it).
        let marked = steps.iter().filter(|t| t.boundary).count();
        assert_eq!(recorded.len(), marked + 1, "{}: phases", r.name);
        let (mut k, mut at) = (0, 0);
        for step in &steps {
            let want = if step.replayed {
                Vec::new()
            } else {
                step_events(r, &s, step, at)
            };
            replayed += usize::from(step.replayed);
            let end = at + want.len();
            let got = recorded[k].get(at..end).unwrap_or_else(|| {
                panic!(
                    "{}: phase {k}: {} events recorded, the step from token {} ({:?}) needs {end}",
                    r.name,
                    recorded[k].len(),
                    step.first_token,
                    step.shape
                )
            });
            let what = format!("{} ({:?})", r.name, step.shape);
            same(&what, step.first_token, &want, got);
            decode_steps += usize::from(step.shape.n_tokens == 1 && !step.replayed);
            at = end;
            if step.boundary {
                assert_eq!(at, recorded[k].len(), "{}: phase {k}: events left", r.name);
                (k, at) = (k + 1, 0);
            }
        }
        assert_eq!(
            at,
            recorded[k].len(),
            "{}: the last phase: events left",
            r.name
        );
    }
    // The warm-up's token and the 64 measured ones of each of the six runs that generate with
    // graphs off; with graphs on, the warm-up's and four measured ones, the other 60 replayed.
    assert_eq!(decode_steps, 6 * 65 + 2 * 5);
    assert_eq!(replayed, 2 * 60);
}

/// The profile's test (`bench_trace`: the warm-up and the measured run) replayed through the
/// legacy pool without purges: its peak reserve equals the replay of the recorded trace and what
/// the run's pool itself reported, to the byte.
#[test]
fn the_replayed_peak_reserve_equals_the_run_s() {
    let legacy = PoolConfig::default().kind(PoolKind::Legacy);
    for r in &RUNS {
        let log = r.logged();
        let trace = bench_trace(r.profile, &r.setup(), &log.bench(r.cuda_graphs)).unwrap();
        let predicted = replay(&trace.ops, &legacy, PurgePolicy::Never, None).unwrap();
        let recorded = replay(&r.recorded(), &legacy, PurgePolicy::Never, None).unwrap();
        assert_eq!(
            recorded.peak_reserved_bytes, log.pool_peak_reserved_bytes,
            "{}: the recorded trace's replay against the run's own pool",
            r.name
        );
        assert_eq!(
            predicted.peak_reserved_bytes, recorded.peak_reserved_bytes,
            "{}: the profile's replay against the recorded one's",
            r.name
        );
    }
}

/// The compute buffer `llama::compute_buffer_bytes` predicts for each run's context and ubatch
/// against the one llama.cpp logged at teardown (`~llama_context: CUDA0 compute buffer size is
/// … MiB`), to the precision llama.cpp prints it: 4 decimals of MiB. It replays ggml-alloc over
/// the reserve graph, and every run is exact: llama3-8b 258.5000 MiB (the logits and final
/// norm), phi3-mini 278.0117 at 20,480 positions, 85.6367 at 5,120 (the flash-attention node
/// above the hole the layer's norm leaves), 298.5000 at `-ub 2048`, 84.8867 in the `-pg` runs;
/// Qwen3-30B-A3B's shape 341.5352 at 5,120 and 4,352 positions, with 4 layers and with 12, with
/// the K/V copies in the buffer and from the pool alike: 40.7852 MiB over the logits and final
/// norm, because the CUDA backend's fusion of the weighted expert sum keeps the down
/// projection's output (32 MiB) alive beside its weighted copy, so the last layer's sum over
/// the experts (which the residual add and the final norm then overwrite in place) lands at
/// 40.7852 MiB and the logits above it.
#[test]
fn the_compute_buffer_equals_the_logged_one() {
    const MIB: f64 = 1048576.0;
    for r in &RUNS {
        let log = r.logged();
        let s = r.setup();
        let bytes = compute_buffer_bytes(r.version(), &s.model, s.kv, log.n_ctx, log.ubatch);
        let predicted = format!("{:.4}", bytes as f64 / MIB);
        assert_eq!(predicted, log.compute_mib, "{}: MiB", r.name);
    }
}

/// Qwen3-30B-A3B's shape (q8_0, `-b 2048 -ub 512 -ctk q8_0 -ctv q8_0`) in runs whose logs print
/// the compute buffer to one decimal only, at contexts up to 65,536: there the mask and the
/// K/V copies move what lies under the logits, and the buffer is the logits and final norm
/// alone (300.75 MiB).
///
/// - data/h100-2026-11-25-mainline-predict (4 layers, the `llama` profile, the copies in the
///   buffer): cupool's start-up report of the buffer it could not allocate after the KV cache
///   ("cannot allocate a ggml buffer of … MiB", `qwen3-q8-3.8/*.log`, `qwen3-q8-4/*.log` in
///   its `logs.tar.gz`).
/// - data/h100-2026-11-26-mainline-oom-moe (12 layers, `CUPOOL_FA_KV=pool`: `llama-b8833`):
///   cupool's "stage=context-created" line, whose `buffers_mib` is the model's buffer, the KV
///   cache and the compute buffer together (`qwen3-q8-10/*.log`, `qwen3-q8-11/*.log`). The
///   model buffer is 7901.01 MiB as llama.cpp prints it (`load_tensors: CUDA0 model buffer
///   size`, the same GGUF in data/h100-2026-11-26-mainline-graphs), so the sum is checked
///   within the two printings' rounding.
#[test]
fn the_moe_compute_buffer_equals_the_logged_one_at_long_contexts() {
    const MIB: f64 = 1048576.0;
    let model = |layers: usize| {
        let mut m = EngineModel::preset("qwen3-30b-a3b").unwrap();
        m.n_layer = layers;
        m
    };
    let bytes = |v: Version, layers: usize, n_ctx: usize| {
        compute_buffer_bytes(v, &model(layers), KvType::Q8_0, n_ctx, 512)
    };
    // (context, the buffer printed)
    let refused = [
        (10496, "341.5"),
        (11008, "341.5"),
        (59904, "300.8"),
        (60416, "300.8"),
    ];
    for (n_ctx, mib) in refused {
        let got = bytes(Version::D99724f2, 4, n_ctx);
        assert_eq!(format!("{:.1}", got as f64 / MIB), mib, "-c {n_ctx}");
    }
    // (context, buffers_mib once the context was created)
    let created = [
        (34816, 8635.3),
        (35328, 8641.6),
        (54272, 8877.5),
        (54784, 8883.9),
        (65536, 9017.8),
    ];
    let weights_mib = 7901.01;
    for (n_ctx, total) in created {
        let m = model(12);
        // K and V rows of q8_0: 34 bytes a block of 32
        let kv = 2 * n_ctx * m.n_layer * m.kv_dim() / 32 * 34;
        let got = weights_mib + (kv + bytes(Version::B8833, 12, n_ctx)) as f64 / MIB;
        assert!(
            (got - total).abs() <= 0.055,
            "-c {n_ctx}: {got:.3} MiB, logged {total}"
        );
    }
}
