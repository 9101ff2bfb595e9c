//! Mainline llama.cpp 0c1e5709 across two GPUs (`-sm layer`, both devices' pools in cupool), against
//! the mainline profiles device by device: each device's pool gets the requests of the layers
//! llama.cpp placed on it, and the device holding the output layer the output matrix's too.
//!
//! The runs (`scripts/llama/two-gpu.sh mainline` on two H100s; fixtures written by
//! `scripts/llama/two-gpu-report.py DATA --fixtures profiles/tests/data/<folder>`): `llama-bench
//! -n 0 -r 1 -b 2048 -fa 1 -ctk q8_0 -ctv q8_0 -ngl 99 -sm layer -ts 1/1 -v` with
//! `GGML_POOL=legacy CUPOOL_PURGE=never` over the random-weight GGUFs of `gen_model.py`: phi3-mini
//! f16 `-p 8192 -ub 2048` and llama3-8b q8_0 `-p 5000 -ub 512`, with `CUPOOL_FA_KV=pool` (the
//! `llama-b8833` profile: flash attention's f16 K/V copies from the pool) and without (the `llama`
//! profile); phi3-mini f16 `-p 20480 -ub 512` with `CUPOOL_FA_KV=pool` on a card of which the
//! ballast left 7 GiB free on GPU 1 (`never`: dies there mid-prompt; `auto`: completes) and, where
//! the call had time, on the whole cards; and one `-sm row` run (llama3-8b q8_0), which the
//! profiles do not model: only its placement and its devices' streams are checked.
//!
//! Which layers a device holds (`src/llama-model.cpp`, `llama_model::load_tensors`): with
//! `-ngl 99` all `n_layer` repeating layers and the output layer count (`act_gpu_layers =
//! n_layer + 1`); the tensor split (`-ts 1/1`; by free memory when not given) becomes cumulative
//! fractions, and layer `il` (the output layer is `il = n_layer`) goes to the first device whose
//! fraction exceeds `il / act_gpu_layers` (`std::upper_bound`, in `float`). For 32 layers on two
//! equal devices: layers 0–16 on the first (16/33 < 0.5), 17–31 and the output on the second.
//! The input layer (the token embedding) stays on the CPU. [`placement`] computes it from the
//! model; the test checks it against the engine's own `load_tensors: layer N assigned to device`
//! lines.
//!
//! Which trace stream is which device: libcupool numbers each (device, stream) pair in the order
//! it first allocates; the first device runs the first layers, so stream 0 is device 0. Each
//! stream's allocation count equals that device's own count in the shim's closing statistics.
//!
//! With two devices mainline runs the layers as a pipeline (`pipeline_parallel`, the
//! scheduler's 4 copies of each split's inputs): the compute buffers grow, the pool's requests do
//! not change. The phases are the process's (`ggml_backend_cupool_ubatch_end` ends the ubatch on
//! every device), so each device's phase holds its part of the same steps.
//!
//! The fixtures are recorded on a GPU machine; until they are in place the tests say so on
//! stderr and check nothing (`CUPOOL_REQUIRE_TWO_GPUS=1` makes that a failure). With
//! `CUPOOL_TWO_GPUS_SUMMARY=FILE` the peak test writes each device's predicted and recorded peak
//! reserve as JSON lines, for `two-gpu-report.py --predicted FILE`.
mod common;

use common::{phases_of, same, setup, Event};
use cupool_kernels::KvType;
use cupool_pool::trace::{self, replay, Op};
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use cupool_profiles::bench::{LlamaBench, Step};
use cupool_profiles::{trace_events, Device, EngineModel, OpCall, Profile, Setup, Weights};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};

/// The fixtures' folder (relative to this crate), or `CUPOOL_TWO_GPUS_DATA`.
const DATA: &str = "tests/data/h100x2-2026-11-26-mainline";

/// The folder of the fixtures, if they are there; says on stderr why not (written past the
/// test harness's capture, so `cargo test` shows it), or fails under `CUPOOL_REQUIRE_TWO_GPUS`.
fn data_dir() -> Option<String> {
    let rel = std::env::var("CUPOOL_TWO_GPUS_DATA").unwrap_or_else(|_| DATA.to_string());
    let dir = if rel.starts_with('/') {
        rel
    } else {
        format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
    };
    if std::path::Path::new(&dir).join("runs.json").exists() {
        return Some(dir);
    }
    let why = format!(
        "no {dir}/runs.json (record the runs with scripts/llama/two-gpu.sh mainline on two GPUs, \
         then write the fixtures with scripts/llama/two-gpu-report.py DATA --fixtures {dir})"
    );
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_TWO_GPUS").is_none(),
        "mainline_two_gpus: CUPOOL_REQUIRE_TWO_GPUS is set and there is {why}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "mainline_two_gpus: SKIPPED, nothing checked: {why}"
    );
    None
}

/// A gzipped trace at an absolute path (the fixtures' folder may be outside this crate).
fn read_trace(path: &str) -> Vec<Op> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    trace::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One recorded run, as `two-gpu-report.py --fixtures` writes it in runs.json.
struct Run {
    name: String,
    profile: Profile,
    model: EngineModel,
    weights: Weights,
    split_mode: String,
    tensor_split: Vec<f32>,
    n_gpu_layers: usize,
    bench: LlamaBench,
    completed: bool,
    purge: String,
    /// The device of each layer as the engine logged it, the output layer last (-1: the CPU).
    logged_placement: Vec<i64>,
    /// The failed allocation of a run that ran out: (device, bytes).
    oom: Option<(usize, usize)>,
    /// Per device, from the shim's closing statistics: (allocations, peak reserve).
    stats: BTreeMap<usize, (usize, usize)>,
    trace: String,
}

fn runs(dir: &str) -> Vec<Run> {
    let path = format!("{dir}/runs.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        all["engine"], "mainline",
        "{path}: fixtures of mainline runs"
    );
    let mut out = Vec::new();
    for (name, r) in all["runs"].as_object().expect("runs") {
        let n = |k: &str| {
            r[k].as_u64()
                .unwrap_or_else(|| panic!("{path}: {name}: no {k}")) as usize
        };
        let s = |k: &str| {
            r[k].as_str()
                .unwrap_or_else(|| panic!("{path}: {name}: no {k}"))
                .to_string()
        };
        let mut model = EngineModel::preset(&s("model")).unwrap();
        model.n_layer = n("n_layer");
        let weights = match s("weights").as_str() {
            "f16" => Weights::F16,
            "q8_0" => Weights::Q8_0,
            w => panic!("{name}: weights {w}"),
        };
        let profile = match s("fa_kv").as_str() {
            "pool" => Profile::LlamaB8833,
            "buffer" => Profile::Llama,
            f => panic!("{name}: fa_kv {f}"),
        };
        let stats = r["devices"]
            .as_object()
            .map(|d| {
                d.iter()
                    .map(|(k, v)| {
                        (
                            k.parse().unwrap(),
                            (
                                v["allocations"].as_u64().unwrap() as usize,
                                v["pool_peak_reserved_bytes"].as_u64().unwrap() as usize,
                            ),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Run {
            name: name.clone(),
            profile,
            model,
            weights,
            split_mode: s("split_mode"),
            tensor_split: r["tensor_split"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
            n_gpu_layers: n("n_gpu_layers"),
            bench: LlamaBench {
                prompt: n("n_prompt"),
                gen: n("n_gen"),
                batch: n("n_batch"),
                ubatch: n("n_ubatch"),
                reps: n("reps"),
                warmup: true,
            },
            completed: r["rc"].as_i64() == Some(0),
            purge: s("purge"),
            logged_placement: r["layer_devices"]
                .as_array()
                .unwrap_or_else(|| panic!("{path}: {name}: no layer_devices"))
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect(),
            oom: r["oom"].as_object().map(|o| {
                (
                    o["device"].as_u64().unwrap() as usize,
                    o["bytes"].as_u64().unwrap() as usize,
                )
            }),
            stats,
            trace: format!("{dir}/{}", s("trace")),
        });
    }
    assert!(!out.is_empty(), "{path}: no runs");
    out
}

/// llama.cpp's placement of a model's layers (`load_tensors`): the device of each repeating
/// layer, then of the output layer; `None` is the CPU. `tensor_split` is `-ts` (all zero: by
/// free memory, which this does not know).
fn placement(n_layer: usize, n_gpu_layers: usize, tensor_split: &[f32]) -> Vec<Option<usize>> {
    assert!(
        tensor_split.iter().any(|&x| x != 0.0),
        "a split by free memory: give -ts"
    );
    let mut splits = Vec::with_capacity(tensor_split.len());
    let mut sum = 0.0f32;
    for &x in tensor_split {
        sum += x;
        splits.push(sum);
    }
    for s in &mut splits {
        *s /= sum;
    }
    let i_gpu_start = (n_layer + 1).saturating_sub(n_gpu_layers);
    let act_gpu_layers = n_gpu_layers.min(n_layer + 1);
    (0..=n_layer)
        .map(|il| {
            if il < i_gpu_start || il - i_gpu_start >= act_gpu_layers {
                return None;
            }
            let x = (il - i_gpu_start) as f32 / act_gpu_layers as f32;
            // std::upper_bound: the first split point above x
            Some(splits.partition_point(|&s| s <= x))
        })
        .collect()
}

/// What one device runs of a model: its repeating layers and whether it holds the output.
struct DeviceShare {
    device: usize,
    layers: Vec<usize>,
    output: bool,
}

fn shares(r: &Run) -> Vec<DeviceShare> {
    let p = placement(r.model.n_layer, r.n_gpu_layers, &r.tensor_split);
    let devices: Vec<usize> = p
        .iter()
        .flatten()
        .copied()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut out: Vec<DeviceShare> = devices
        .into_iter()
        .map(|d| DeviceShare {
            device: d,
            layers: (0..r.model.n_layer).filter(|&l| p[l] == Some(d)).collect(),
            output: p[r.model.n_layer] == Some(d),
        })
        .collect();
    out.sort_by_key(|s| s.device);
    out
}

fn run_setup(r: &Run) -> Setup {
    setup(&r.model, r.weights, KvType::Q8_0, Device::H100_SXM)
}

/// The profile's requests of one step on one device.
fn device_calls(r: &Run, s: &Setup, step: &Step, share: &DeviceShare) -> Vec<OpCall> {
    let mut calls = Vec::new();
    for &l in &share.layers {
        calls.extend(r.profile.layer(s, step.shape, l).unwrap());
    }
    if share.output {
        calls.extend(r.profile.output(s, step.shape));
    }
    calls
}

/// As `device_calls`, as events with their frees numbered from `offset` (the step's place in
/// its phase).
fn device_events(
    r: &Run,
    s: &Setup,
    step: &Step,
    share: &DeviceShare,
    offset: usize,
) -> Vec<Event> {
    let mut ops = vec![Op::PhaseBegin {
        name: String::new(),
    }];
    trace_events(&device_calls(r, s, step, share), 0, &mut ops);
    phases_of(&ops, None)
        .pop()
        .unwrap()
        .into_iter()
        .map(|e| match e {
            Event::Free(at) => Event::Free(at + offset),
            alloc => alloc,
        })
        .collect()
}

fn allocs(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(..)))
        .collect()
}

/// The recorded trace's allocations per stream.
fn allocations_per_stream(ops: &[Op]) -> BTreeMap<u64, usize> {
    let mut n = BTreeMap::new();
    for op in ops {
        if let Op::Alloc { stream, .. } = op {
            *n.entry(*stream).or_default() += 1;
        }
    }
    n
}

/// The layers llama.cpp put on each device are the ones `placement` computes from the model
/// (32 layers, `-ts 1/1`: 0–16 on device 0, 17–31 and the output on device 1), for every run
/// (`-sm row` places the layers the same way; only their matrices are split); and stream `d` of
/// each trace is device `d`: two streams, each with as many allocations as that device's pool
/// counted.
#[test]
fn each_device_holds_the_layers_llama_cpp_places_there() {
    let Some(dir) = data_dir() else { return };
    for r in runs(&dir) {
        let computed: Vec<i64> = placement(r.model.n_layer, r.n_gpu_layers, &r.tensor_split)
            .into_iter()
            .map(|d| d.map_or(-1, |d| d as i64))
            .collect();
        assert_eq!(computed, r.logged_placement, "{}: placement", r.name);
        if r.model.n_layer == 32 && r.tensor_split == [1.0, 1.0] && r.n_gpu_layers > 32 {
            let split = computed.iter().position(|&d| d == 1).unwrap();
            assert_eq!(split, 17, "{}: 17 layers on the first device", r.name);
        }
        let per_stream = allocations_per_stream(&read_trace(&r.trace));
        assert_eq!(
            per_stream.keys().copied().collect::<Vec<_>>(),
            vec![0, 1],
            "{}: a stream per device",
            r.name
        );
        for (&stream, &n) in &per_stream {
            match r.stats.get(&(stream as usize)) {
                Some(&(counted, _)) => assert_eq!(
                    n, counted,
                    "{}: stream {stream}'s allocations against device {stream}'s pool's",
                    r.name
                ),
                // a run that aborted printed no closing statistics
                None if !r.completed => {}
                None => panic!("{}: no closing statistics of device {stream}", r.name),
            }
        }
    }
}

/// Every step of every `-sm layer` run, on each device: the profile's requests for the layers
/// on that device (and the output matrix where it lives) equal the recorded ones request for
/// request (size, the op that asked, order, which free returns which), in the phase and place
/// the engine made them. In a run that ran out of memory the steps before the failure are
/// compared whole; in the failing step each device's recorded allocations are the first of the
/// profile's, and on the device that ran out the next one is the allocation that failed.
#[test]
fn every_device_s_requests_equal_the_recorded_ones() {
    let Some(dir) = data_dir() else { return };
    let mut compared = 0;
    for r in runs(&dir).iter().filter(|r| r.split_mode == "layer") {
        let s = run_setup(r);
        let ops = read_trace(&r.trace);
        let steps = r.bench.steps().unwrap();
        let marked = steps.iter().filter(|t| t.boundary).count();
        let mut failed_on = None;
        for share in shares(r) {
            let recorded = phases_of(&ops, Some(share.device as u64));
            if r.completed {
                assert_eq!(recorded.len(), marked + 1, "{}: phases", r.name);
            }
            let (mut k, mut at) = (0, 0);
            let mut stopped = false;
            for step in &steps {
                let want = device_events(r, &s, step, &share, at);
                let end = at + want.len();
                let what = format!("{} device {} ({:?})", r.name, share.device, step.shape);
                let phase = recorded.get(k).map_or(&[][..], |p| &p[..]);
                if !r.completed && phase.get(at..end) != Some(&want[..]) {
                    // The failing step: what was allocated before the failure, then nothing more.
                    let rest = phase.get(at..).unwrap_or(&[]);
                    let (got, want) = (allocs(rest), allocs(&want));
                    assert!(
                        got.len() < want.len() && want[..got.len()] == got[..],
                        "{what}: the failing step's {} recorded allocations are not the first of the {} predicted",
                        got.len(),
                        want.len()
                    );
                    if let Some((dev, bytes)) = r.oom.filter(|&(d, _)| d == share.device) {
                        assert!(
                            matches!(want[got.len()], Event::Alloc(b, _) if *b == bytes),
                            "{what}: the failed allocation of {bytes} bytes on device {dev} is not the profile's next ({:?})",
                            want[got.len()]
                        );
                        failed_on = Some(step.first_token);
                    }
                    assert!(
                        recorded.iter().skip(k + 1).all(|p| p.is_empty()),
                        "{what}: events after the failing step"
                    );
                    stopped = true;
                    break;
                }
                let got = phase.get(at..end).unwrap_or_else(|| {
                    panic!(
                        "{what}: phase {k}: {} events recorded, the step from token {} needs {end}",
                        phase.len(),
                        step.first_token
                    )
                });
                same(&what, step.first_token, &want, got);
                compared += allocs(&want).len();
                at = end;
                if step.boundary {
                    assert_eq!(at, phase.len(), "{what}: phase {k}: events left");
                    (k, at) = (k + 1, 0);
                }
            }
            if !stopped {
                let last = recorded.get(k).map_or(0, |p| p.len());
                assert_eq!(
                    at, last,
                    "{} device {}: the last phase: events left",
                    r.name, share.device
                );
            }
        }
        if let Some((dev, _)) = r.oom {
            let tok = failed_on.unwrap_or_else(|| {
                panic!(
                    "{}: ran out on device {dev}, and no step failed there",
                    r.name
                )
            });
            let _ = writeln!(
                std::io::stderr(),
                "mainline_two_gpus: {}: device {dev} ran out in the step from token {tok}",
                r.name
            );
        }
    }
    assert!(compared > 0, "no -sm layer run compared");
}

/// The events of one stream of a recorded trace (its allocations, their frees, the phases).
fn stream_ops(ops: &[Op], stream: u64) -> Vec<Op> {
    let mut ids = HashSet::new();
    ops.iter()
        .filter(|op| match op {
            Op::Alloc { id, stream: s, .. } if *s == stream => ids.insert(*id),
            Op::Alloc { .. } => false,
            Op::Free { id } => ids.contains(id),
            Op::PhaseBegin { .. } | Op::PhaseEnd { .. } => true,
            Op::Keep { stream: s, .. } => *s == stream,
            Op::Sync => true,
        })
        .cloned()
        .collect()
}

/// Each device's share of the whole test (the warm-up and the measured run), as libcupool
/// records it: a phase per marked ubatch.
fn device_trace(r: &Run, s: &Setup, share: &DeviceShare) -> Vec<Op> {
    let mut ops = vec![Op::PhaseBegin {
        name: "ubatch 0".into(),
    }];
    let (mut id, mut boundaries) = (0, 0);
    for step in r.bench.steps().unwrap() {
        id = trace_events(&device_calls(r, s, &step, share), id, &mut ops);
        if step.boundary {
            ops.push(Op::PhaseEnd {
                name: format!("ubatch {boundaries}"),
                prefill: true,
            });
            boundaries += 1;
            ops.push(Op::PhaseBegin {
                name: format!("ubatch {boundaries}"),
            });
        }
    }
    ops
}

/// Each device's predicted requests for a completed `never` run replayed through the legacy
/// pool: the peak reserve equals the replay of that device's recorded stream and what the
/// device's pool itself reported, to the byte.
#[test]
fn each_device_s_peak_reserve_equals_the_run_s() {
    let Some(dir) = data_dir() else { return };
    let legacy = PoolConfig::default().kind(PoolKind::Legacy);
    let summary = std::env::var("CUPOOL_TWO_GPUS_SUMMARY").ok();
    let mut lines = Vec::new();
    let mut checked = 0;
    for r in runs(&dir).iter().filter(|r| r.split_mode == "layer") {
        let s = run_setup(r);
        let ops = read_trace(&r.trace);
        for share in shares(r) {
            let recorded_ops = stream_ops(&ops, share.device as u64);
            let n_recorded = recorded_ops
                .iter()
                .filter(|o| matches!(o, Op::Alloc { .. }))
                .count();
            let stats_peak = r.stats.get(&share.device).map(|&(_, p)| p);
            let mut line = HashMap::new();
            line.insert("run", serde_json::json!(r.name));
            line.insert("device", serde_json::json!(share.device));
            line.insert("layers", serde_json::json!(share.layers));
            line.insert("output", serde_json::json!(share.output));
            line.insert("requests_recorded", serde_json::json!(n_recorded));
            line.insert(
                "recorded_peak_reserved_bytes",
                serde_json::json!(stats_peak),
            );
            if r.completed && r.purge == "never" {
                let predicted_ops = device_trace(r, &s, &share);
                let predicted = replay(&predicted_ops, &legacy, PurgePolicy::Never, None).unwrap();
                let recorded = replay(&recorded_ops, &legacy, PurgePolicy::Never, None).unwrap();
                let what = format!("{} device {}", r.name, share.device);
                assert_eq!(
                    Some(recorded.peak_reserved_bytes),
                    stats_peak,
                    "{what}: the recorded stream's replay against the device's pool"
                );
                assert_eq!(
                    predicted.peak_reserved_bytes, recorded.peak_reserved_bytes,
                    "{what}: the profile's replay against the recorded one's"
                );
                let n_predicted = predicted_ops
                    .iter()
                    .filter(|o| matches!(o, Op::Alloc { .. }))
                    .count();
                assert_eq!(n_predicted, n_recorded, "{what}: allocations");
                line.insert(
                    "predicted_peak_reserved_bytes",
                    serde_json::json!(predicted.peak_reserved_bytes),
                );
                line.insert("requests_predicted", serde_json::json!(n_predicted));
                checked += 1;
            }
            lines.push(serde_json::to_string(&line).unwrap());
        }
    }
    if let Some(path) = summary {
        std::fs::write(&path, lines.join("\n") + "\n").unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    assert!(checked > 0, "no completed never run with -sm layer");
}

/// The placement of the layers as llama.cpp computes it, without fixtures: 32 layers and the
/// output on two equal devices (17 and 15 + output), on three, unequal splits, and partial
/// offload (`-ngl 20`: the first 13 layers on the CPU).
#[test]
fn the_placement_is_llama_cpp_s() {
    let two = placement(32, 99, &[1.0, 1.0]);
    assert_eq!(two.iter().filter(|&&d| d == Some(0)).count(), 17);
    assert_eq!(two[16], Some(0));
    assert_eq!(two[17], Some(1));
    assert_eq!(two[32], Some(1), "the output layer on the last device");
    // llama3-8b and phi3-mini alike: the placement reads only the layer count
    let three = placement(32, 99, &[1.0, 1.0, 1.0]);
    let counts: Vec<usize> = (0..3)
        .map(|d| three.iter().filter(|&&x| x == Some(d)).count())
        .collect();
    assert_eq!(counts, [11, 11, 11]);
    let uneven = placement(32, 99, &[3.0, 1.0]);
    assert_eq!(uneven.iter().filter(|&&d| d == Some(0)).count(), 25);
    let partial = placement(32, 20, &[1.0, 1.0]);
    assert!(partial[..13].iter().all(Option::is_none));
    assert_eq!(partial[13], Some(0));
    assert_eq!(partial[32], Some(1));
    // the split points are f32 as in llama.cpp: 33 layers never land on 0.5 exactly
    assert_eq!(placement(1, 99, &[1.0, 1.0]), [Some(0), Some(1)]);
}
