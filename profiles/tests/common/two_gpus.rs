//! What the two-GPU tests share (`mainline_two_gpus.rs`, `ik_two_gpus.rs`): the fixtures that
//! `scripts/llama/two-gpu-report.py DATA --fixtures DEST` writes (runs.json and the gzipped
//! traces of `scripts/llama/two-gpu.sh`), each device's share of a run's layers, and the
//! comparisons of a device's recorded pool requests and peak reserve with the profile's.
//!
//! A trace has no device field: libcupool numbers each (device, stream) pair in the order it
//! first allocates, and the first device runs the first layers, so trace stream `d` is device
//! `d` (each stream's allocation count equals that device's own count in the shim's closing
//! statistics; the placement tests check it).

use super::{phases_of, same, setup, Event};
use cupool_kernels::KvType;
use cupool_pool::trace::{self, replay, Op};
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use cupool_profiles::bench::{LlamaBench, Step};
use cupool_profiles::{
    trace_events, Device, EngineModel, OpCall, Profile, Setup, UbatchShape, Weights, KV_PADDING,
};
use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};

/// The fixtures' folder: `$var` if set (absolute, or relative to this crate), else `default`
/// (relative to this crate); `None`, said on stderr (past the harness's capture, so `cargo
/// test` shows it), while there is no runs.json there, or a failure under
/// `CUPOOL_REQUIRE_TWO_GPUS`.
pub fn data_dir(test: &str, var: &str, default: &str, engine: &str) -> Option<String> {
    let rel = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let dir = if rel.starts_with('/') {
        rel
    } else {
        format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
    };
    if std::path::Path::new(&dir).join("runs.json").exists() {
        return Some(dir);
    }
    let why = format!(
        "no {dir}/runs.json (record the runs with scripts/llama/two-gpu.sh {engine} on two GPUs, \
         then write the fixtures with scripts/llama/two-gpu-report.py DATA --fixtures {dir})"
    );
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_TWO_GPUS").is_none(),
        "{test}: CUPOOL_REQUIRE_TWO_GPUS is set and there is {why}"
    );
    let _ = writeln!(std::io::stderr(), "{test}: SKIPPED, nothing checked: {why}");
    None
}

/// A gzipped trace at an absolute path (the fixtures' folder may be outside this crate).
pub fn read_trace_at(path: &str) -> Vec<Op> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    trace::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Which engine's `llama-bench` recorded a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Mainline llama.cpp 0c1e5709: its warm-up runs the whole prompt.
    Mainline,
    /// ik_llama.cpp 8337e4cd: its warm-up decodes a one-token prompt.
    Ik,
}

/// One recorded run, as `two-gpu-report.py --fixtures` writes it in runs.json.
pub struct Run {
    pub name: String,
    pub engine: Engine,
    pub profile: Profile,
    /// The preset the model was written from (`gen_model.py --preset`).
    pub preset: String,
    pub model: EngineModel,
    pub weights: Weights,
    pub split_mode: String,
    pub tensor_split: Vec<f32>,
    pub n_gpu_layers: usize,
    pub bench: LlamaBench,
    pub completed: bool,
    pub purge: String,
    /// The device of each layer as the engine logged it, the output layer last (-1: the CPU).
    pub logged_placement: Vec<i64>,
    /// The failed allocation of a run that ran out: (device, bytes).
    pub oom: Option<(usize, usize)>,
    /// Per device, from the shim's closing statistics: (allocations, peak reserve).
    pub stats: BTreeMap<usize, (usize, usize)>,
    pub trace: String,
}

impl Run {
    /// Every step the test ran, in order. Mainline's `llama-bench` warms up with the whole
    /// prompt ([`LlamaBench::steps`]); ik_llama.cpp's (`examples/llama-bench`, `test_prompt(ctx,
    /// 1, ...)`) with a one-token prompt at position 0 (one output row, the cache padded to 256
    /// positions; one token marks no ubatch end), then the measured prompt.
    pub fn steps(&self) -> Vec<Step> {
        match self.engine {
            Engine::Mainline => self.bench.steps().unwrap(),
            Engine::Ik => {
                let mut steps = vec![Step {
                    shape: UbatchShape {
                        n_tokens: 1,
                        n_kv: KV_PADDING,
                        n_outputs: 1,
                    },
                    first_token: 0,
                    boundary: false,
                    replayed: false,
                }];
                let measured = LlamaBench {
                    warmup: false,
                    ..self.bench
                };
                steps.extend(measured.steps().unwrap());
                steps
            }
        }
    }

    pub fn setup(&self) -> Setup {
        setup(&self.model, self.weights, KvType::Q8_0, Device::H100_SXM)
    }

    /// The placement the engine logged, as `placement()` gives it (`None`: the CPU).
    pub fn logged(&self) -> Vec<Option<usize>> {
        self.logged_placement
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect()
    }
}

/// The runs of the fixtures in `dir`, which must be `engine`'s ("mainline" or "ik").
pub fn runs(dir: &str, engine: &str) -> Vec<Run> {
    let path = format!("{dir}/runs.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(all["engine"], engine, "{path}: fixtures of {engine} runs");
    let kind = match engine {
        "mainline" => Engine::Mainline,
        "ik" => Engine::Ik,
        e => panic!("{path}: engine {e}"),
    };
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
        // ik_llama.cpp's flash attention always takes its K/V copies from the pool; mainline's
        // with CUPOOL_FA_KV=pool (the llama-b8833 profile) or from the compute buffer (llama).
        let profile = match (kind, s("fa_kv").as_str()) {
            (Engine::Ik, _) => Profile::IkLlama,
            (Engine::Mainline, "pool") => Profile::LlamaB8833,
            (Engine::Mainline, "buffer") => Profile::Llama,
            (_, f) => panic!("{name}: fa_kv {f}"),
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
            engine: kind,
            profile,
            preset: s("model"),
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
                // On, as the engines ran; no two consecutive steps of these prompts share a
                // shape, so no step replays a graph.
                cuda_graphs: true,
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

/// What one device runs of a model: its repeating layers and whether it holds the output.
pub struct DeviceShare {
    pub device: usize,
    pub layers: Vec<usize>,
    pub output: bool,
}

/// Each device's share under a placement (the device of each repeating layer, then of the
/// output layer; `None`: the CPU).
pub fn shares(placement: &[Option<usize>]) -> Vec<DeviceShare> {
    let n_layer = placement.len() - 1;
    let devices: Vec<usize> = placement
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
            layers: (0..n_layer).filter(|&l| placement[l] == Some(d)).collect(),
            output: placement[n_layer] == Some(d),
        })
        .collect();
    out.sort_by_key(|s| s.device);
    out
}

/// The profile's requests of one step on one device: its layers', then the output matrix's
/// where it lives.
pub fn device_calls(r: &Run, s: &Setup, step: &Step, share: &DeviceShare) -> Vec<OpCall> {
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
    super::step_events(&device_calls(r, s, step, share), offset)
}

pub fn allocs(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(..)))
        .collect()
}

/// The recorded trace's allocations per stream.
pub fn allocations_per_stream(ops: &[Op]) -> BTreeMap<u64, usize> {
    let mut n = BTreeMap::new();
    for op in ops {
        if let Op::Alloc { stream, .. } = op {
            *n.entry(*stream).or_default() += 1;
        }
    }
    n
}

/// The placement's devices against the trace's streams: a stream per device, each with as
/// many allocations as that device's pool counted (a run that aborted may have printed no
/// closing statistics).
pub fn streams_are_devices(r: &Run) {
    let per_stream = allocations_per_stream(&read_trace_at(&r.trace));
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
            None if !r.completed => {}
            None => panic!("{}: no closing statistics of device {stream}", r.name),
        }
    }
}

/// What comparing one run's devices found: per device the requests compared (allocations)
/// and those recorded, and the first token of the step that failed on the device that ran out.
pub struct Compared {
    pub per_device: BTreeMap<usize, (usize, usize)>,
    pub failed_on: Option<usize>,
}

/// Every step of a run on each device: the profile's requests for the layers on that device
/// (and the output matrix where it lives) equal the recorded ones request for request (size,
/// the op that asked, order, which free returns which), in the phase and place the engine made
/// them. In a run that ran out of memory the steps before the failure are compared whole; in
/// the failing step each device's recorded allocations are the first of the profile's, and on
/// the device that ran out the next one is the allocation that failed.
pub fn compare_requests(r: &Run, placement: &[Option<usize>]) -> Compared {
    let s = r.setup();
    let ops = read_trace_at(&r.trace);
    let steps = r.steps();
    let marked = steps.iter().filter(|t| t.boundary).count();
    let mut out = Compared {
        per_device: BTreeMap::new(),
        failed_on: None,
    };
    for share in shares(placement) {
        let recorded = phases_of(&ops, Some(share.device as u64));
        if r.completed {
            assert_eq!(recorded.len(), marked + 1, "{}: phases", r.name);
        }
        let n_recorded: usize = recorded.iter().map(|p| allocs(p).len()).sum();
        let (mut k, mut at, mut compared) = (0, 0, 0);
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
                compared += got.len();
                if let Some((dev, bytes)) = r.oom.filter(|&(d, _)| d == share.device) {
                    assert!(
                        matches!(want[got.len()], Event::Alloc(b, _) if *b == bytes),
                        "{what}: the failed allocation of {bytes} bytes on device {dev} is not the profile's next ({:?})",
                        want[got.len()]
                    );
                    out.failed_on = Some(step.first_token);
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
        assert_eq!(
            compared, n_recorded,
            "{} device {}: every recorded request compared",
            r.name, share.device
        );
        out.per_device.insert(share.device, (compared, n_recorded));
    }
    if let Some((dev, _)) = r.oom {
        assert!(
            out.failed_on.is_some(),
            "{}: ran out on device {dev}, and no step failed there",
            r.name
        );
    }
    out
}

/// Compares each run's requests with `placement`'s (`compare_requests`), says on stderr how many
/// of each device's recorded requests were compared and where a device ran out; the requests
/// compared in all.
pub fn compare_runs<'a>(
    test: &str,
    runs: impl Iterator<Item = &'a Run>,
    placement: impl Fn(&Run) -> Vec<Option<usize>>,
) -> usize {
    let mut compared = 0;
    for r in runs {
        let c = compare_requests(r, &placement(r));
        for (d, (n, of)) in &c.per_device {
            let _ = writeln!(
                std::io::stderr(),
                "{test}: {} device {d}: {n} of {of} recorded requests compared",
                r.name
            );
            compared += n;
        }
        if let (Some((dev, _)), Some(tok)) = (r.oom, c.failed_on) {
            let _ = writeln!(
                std::io::stderr(),
                "{test}: {}: device {dev} ran out in the step from token {tok}",
                r.name
            );
        }
    }
    compared
}

/// The events of one stream of a recorded trace (its allocations, their frees, the phases).
pub fn stream_ops(ops: &[Op], stream: u64) -> Vec<Op> {
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

/// Each device's share of the whole test (every step), as libcupool records it: a phase per
/// marked ubatch; with `allocations`, cut before the allocation after that many (the one a
/// run that ran out of memory failed on, or never made).
fn device_trace(r: &Run, s: &Setup, share: &DeviceShare, allocations: Option<usize>) -> Vec<Op> {
    let mut ops = vec![Op::PhaseBegin {
        name: "ubatch 0".into(),
    }];
    let (mut id, mut boundaries) = (0, 0);
    for step in r.steps() {
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
    if let Some(n) = allocations {
        let mut seen = 0;
        let cut = ops
            .iter()
            .position(|o| {
                seen += usize::from(matches!(o, Op::Alloc { .. }));
                seen > n
            })
            .unwrap_or(ops.len());
        ops.truncate(cut);
    }
    ops
}

/// Each device's peak reserve under `legacy`/`never`, for every run of `split_mode layer` that
/// did not purge: the profile's requests for that device (up to the failure in a run that ran
/// out) replayed through the legacy pool against the replay of the device's recorded stream
/// and what the device's pool itself reported, to the byte. Returns a JSON line per device
/// (sorted keys): the run, the device, its layers, the requests recorded and predicted, the
/// peak reserve recorded and predicted (only where compared), in the order of the runs.
pub fn peak_lines(runs: &[Run], placement: impl Fn(&Run) -> Vec<Option<usize>>) -> Vec<String> {
    let legacy = PoolConfig::default().kind(PoolKind::Legacy);
    let mut lines = Vec::new();
    let mut checked = 0;
    for r in runs.iter().filter(|r| r.split_mode == "layer") {
        let s = r.setup();
        let ops = read_trace_at(&r.trace);
        for share in shares(&placement(r)) {
            let recorded_ops = stream_ops(&ops, share.device as u64);
            let n_recorded = recorded_ops
                .iter()
                .filter(|o| matches!(o, Op::Alloc { .. }))
                .count();
            let stats_peak = r.stats.get(&share.device).map(|&(_, p)| p);
            let mut line = serde_json::Map::new();
            line.insert("run".into(), serde_json::json!(r.name));
            line.insert("device".into(), serde_json::json!(share.device));
            line.insert("layers".into(), serde_json::json!(share.layers));
            line.insert("output".into(), serde_json::json!(share.output));
            line.insert("requests_recorded".into(), serde_json::json!(n_recorded));
            line.insert(
                "recorded_peak_reserved_bytes".into(),
                serde_json::json!(stats_peak),
            );
            // `auto` purges where libcupool decided at the run's boundaries (the trace's keep
            // lists): the profile's requests carry no such decisions, so only `never` runs.
            if r.purge == "never" && stats_peak.is_some() {
                let cut = (!r.completed).then_some(n_recorded);
                let predicted_ops = device_trace(r, &s, &share, cut);
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
                    "predicted_peak_reserved_bytes".into(),
                    serde_json::json!(predicted.peak_reserved_bytes),
                );
                line.insert("requests_predicted".into(), serde_json::json!(n_predicted));
                checked += 1;
            }
            lines.push(serde_json::Value::Object(line).to_string());
        }
    }
    assert!(checked > 0, "no never run with -sm layer");
    lines
}

/// Writes the peak lines to `$var` when it is set; else, where the fixtures hold a
/// `predicted.jsonl` (the file docs/llama-cpp.md's tables read), checks that it is these lines.
pub fn summary(test: &str, var: &str, dir: &str, lines: &[String]) {
    let text = lines.join("\n") + "\n";
    if let Ok(path) = std::env::var(var) {
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{path}: {e}"));
        return;
    }
    let kept = format!("{dir}/predicted.jsonl");
    match std::fs::read_to_string(&kept) {
        Ok(old) => assert_eq!(
            old, text,
            "{kept} is not what the profile predicts now: {var}={kept} cargo test --release -p cupool-profiles --test {test} writes it"
        ),
        Err(_) => {
            let _ = writeln!(std::io::stderr(), "{test}: no {kept}: not checked");
        }
    }
}
