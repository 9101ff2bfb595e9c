//! Mainline llama.cpp 0c1e5709 across two GPUs (`-sm layer`, both devices' pools in cupool), against
//! the mainline profiles device by device: each device's pool gets the requests of the layers
//! llama.cpp placed on it, and the device holding the output layer the output matrix's too.
//!
//! The runs (`scripts/llama/two-gpu.sh mainline` on two H100s, 2026-11-26; fixtures written by
//! `scripts/llama/two-gpu-report.py data/h100x2-2026-11-26-mainline-two-gpus --fixtures
//! profiles/tests/data/h100x2-2026-11-26-mainline`): `llama-bench
//! -n 0 -r 1 -b 2048 -fa 1 -ctk q8_0 -ctv q8_0 -ngl 99 -sm layer -ts 1/1 -v` with
//! `GGML_POOL=legacy CUPOOL_PURGE=never` over the random-weight GGUFs of `gen_model.py`: phi3-mini
//! f16 `-p 8192 -ub 2048` and llama3-8b q8_0 `-p 5000 -ub 512`, with `CUPOOL_FA_KV=pool` (the
//! `llama-b8833` profile: flash attention's f16 K/V copies from the pool) and without (the `llama`
//! profile); phi3-mini f16 `-p 20480 -ub 512` with `CUPOOL_FA_KV=pool` on a card of which the
//! ballast left 7 GiB free on GPU 1 (`never`: dies there mid-prompt; `auto`: completes) and, where
//! the call had time, on the whole cards. The script's `-sm row` run (llama3-8b q8_0) stopped at
//! model load (`device CUDA0 does not support split buffers`: at 0c1e5709 the CUDA backend exports
//! no `ggml_backend_split_buffer_type`), so its log places no layer and the fixtures leave it out.
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
//! reserve as JSON lines, for `two-gpu-report.py --predicted FILE`; without it, it checks that
//! the fixtures' `predicted.jsonl` (what docs/llama-cpp.md's table was made from) is those lines.
//! The request test prints, per run and device, how many recorded requests it compared.
//! What they share with ik_llama.cpp's test (`ik_two_gpus.rs`) is in `common/two_gpus.rs`.
//!
//! The compute buffers: `buffers.json` (written by `scripts/llama/two-gpu-replan.py
//! data/h100x2-2026-11-26-mainline-two-gpus --fixtures profiles/tests/data/h100x2-2026-11-26-mainline`)
//! holds each device's logged `CUDAn compute buffer size` and what the script's copy of the
//! pipeline model gave (the figure replan.json and docs/llama-cpp.md show);
//! [`each_device_s_compute_buffer_is_the_pipeline_s`] holds both to `llama::device_compute_buffer_bytes`.
mod common;

use common::two_gpus::{
    compare_runs, data_dir, peak_lines, runs, streams_are_devices, summary, Run,
};
use cupool_kernels::KvType;
use cupool_profiles::llama::{
    device_compute_buffer_bytes, pipeline_compute_buffer_bytes, sched_copies, SplitPlace, Version,
};
use cupool_profiles::{EngineModel, KV_PADDING};

/// The fixtures' folder (relative to this crate), or `CUPOOL_TWO_GPUS_DATA`.
const DATA: &str = "tests/data/h100x2-2026-11-26-mainline";
const TEST: &str = "mainline_two_gpus";

fn fixtures() -> Option<(String, Vec<Run>)> {
    let dir = data_dir(TEST, "CUPOOL_TWO_GPUS_DATA", DATA, "mainline")?;
    let runs = runs(&dir, "mainline");
    Some((dir, runs))
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

/// The placement computed from a run's model and settings.
fn computed(r: &Run) -> Vec<Option<usize>> {
    placement(r.model.n_layer, r.n_gpu_layers, &r.tensor_split)
}

/// The layers llama.cpp put on each device are the ones `placement` computes from the model
/// (32 layers, `-ts 1/1`: 0–16 on device 0, 17–31 and the output on device 1), for every run of
/// the fixtures (a build with row split would place them the same way for `-sm row`); and stream
/// `d` of each trace is device `d`: two streams, each with as many allocations as that device's
/// pool counted.
#[test]
fn each_device_holds_the_layers_llama_cpp_places_there() {
    let Some((_, runs)) = fixtures() else { return };
    for r in runs {
        let computed: Vec<i64> = computed(&r)
            .into_iter()
            .map(|d| d.map_or(-1, |d| d as i64))
            .collect();
        assert_eq!(computed, r.logged_placement, "{}: placement", r.name);
        if r.model.n_layer == 32 && r.tensor_split == [1.0, 1.0] && r.n_gpu_layers > 32 {
            let split = computed.iter().position(|&d| d == 1).unwrap();
            assert_eq!(split, 17, "{}: 17 layers on the first device", r.name);
        }
        streams_are_devices(&r);
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
    let Some((_, runs)) = fixtures() else { return };
    let layered = runs.iter().filter(|r| r.split_mode == "layer");
    let compared = compare_runs(TEST, layered, computed);
    assert!(compared > 0, "no -sm layer run compared");
}

/// Each device's predicted requests for a `never` run replayed through the legacy pool (in the
/// run that ran out, up to the failed allocation): the peak reserve equals the replay of that
/// device's recorded stream and what the device's pool itself reported, to the byte.
#[test]
fn each_device_s_peak_reserve_equals_the_run_s() {
    let Some((dir, runs)) = fixtures() else {
        return;
    };
    let lines = peak_lines(&runs, computed);
    summary(TEST, "CUPOOL_TWO_GPUS_SUMMARY", &dir, &lines);
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

/// The device of each layer in a run of `buffers.json` (two devices: the layers not listed
/// under one are the other's).
fn layer_devices(r: &serde_json::Value) -> Vec<usize> {
    let mut out = vec![usize::MAX; 32];
    for (d, x) in r["devices"].as_object().unwrap() {
        for l in x["layers"].as_array().unwrap() {
            out[l.as_u64().unwrap() as usize] = d.parse().unwrap();
        }
    }
    assert!(out.iter().all(|&d| d < 2), "every layer placed");
    out
}

/// Each device's compute buffer in every `-sm layer` run, the pipeline model's
/// (`llama::device_compute_buffer_bytes`: the scheduler's 4 copies of the device's inputs, never
/// freed, under its largest stage) against the one llama.cpp logged at teardown (`~llama_context:
/// CUDAn compute buffer size is … MiB`, 4 decimals of MiB), and equal to what
/// `two-gpu-replan.py` computed (its copy of the model, which replan.json and the docs show).
/// Exact on device 0 (the copies under the FFN stage: 164.0391 MiB at `-ub 512`, 464.1562 at
/// `-ub 2048`, llama3-8b's 152.3516 with the K/V copies in the pool) and on llama3-8b's device 1
/// (under the logits: 310.8594). Below it by what ggml-alloc's placement adds and the stage
/// model leaves out: phi3-mini's device 1 by two f32 rows of `n_embd` per token (12 MiB at
/// `-ub 512`, 48 at `-ub 2048`: its logits land above three such rows, the final norm's and
/// two more), and llama3-8b's device 0 with the K/V copies in the compute buffer by one
/// (8 MiB: the flash-attention node of 28 MiB leaves a hole the FFN's tensors do not fill).
#[test]
fn each_device_s_compute_buffer_is_the_pipeline_s() {
    const MIB: f64 = 1048576.0;
    let Some((dir, _)) = fixtures() else { return };
    let path = format!("{dir}/buffers.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(all["engine"], "mainline", "{path}");
    let runs = all["devices"].as_object().expect("devices");
    let (mut exact, mut checked, mut replayed) = (0, 0, 0);
    for (name, r) in runs {
        let mut m = EngineModel::preset(r["model"].as_str().unwrap()).unwrap();
        m.n_layer = 32;
        let v = match r["fa_kv"].as_str() {
            Some("pool") => Version::B8833,
            Some("buffer") => Version::D99724f2,
            f => panic!("{name}: fa_kv {f:?}"),
        };
        let n = |k: &str| r[k].as_u64().unwrap() as usize;
        let n_ctx = (n("n_prompt") + n("n_gen")).div_ceil(KV_PADDING) * KV_PADDING;
        let n_devices = r["devices"].as_object().unwrap().len();
        for (d, x) in r["devices"].as_object().unwrap() {
            let what = format!("{name} device {d}");
            let layers = x["layers"].as_array().unwrap();
            let place = SplitPlace {
                copies: sched_copies(n_devices, 99, m.n_layer, true),
                last_layer: layers.last().and_then(|l| l.as_u64()) == Some(m.n_layer as u64 - 1),
                output: x["output"].as_bool().unwrap(),
            };
            assert_eq!(
                place.copies,
                x["sched_copies"].as_u64().unwrap() as usize,
                "{what}"
            );
            assert_eq!(Some(place.last_layer), x["last_layer"].as_bool(), "{what}");
            assert_eq!(n_ctx as u64, x["n_ctx"].as_u64().unwrap(), "{what}: n_ctx");
            let bytes =
                device_compute_buffer_bytes(v, &m, KvType::Q8_0, n_ctx, n("n_ubatch"), place);
            assert_eq!(
                Some(bytes as u64),
                x["compute_model_bytes"].as_u64(),
                "{what}: two-gpu-replan.py's model against the profile's (run the script again)"
            );
            let logged: f64 = x["compute_logged_mib"].as_str().unwrap().parse().unwrap();
            let row = (m.n_embd * n("n_ubatch") * 4) as f64 / MIB;
            let gap = match (m.n_embd, place.output, v) {
                (3072, true, _) => 2.0 * row,
                (4096, false, Version::D99724f2) => row,
                _ => 0.0,
            };
            let predicted = format!("{:.4}", bytes as f64 / MIB + gap);
            assert_eq!(
                predicted,
                format!("{logged:.4}"),
                "{what}: the model ({:.4} MiB) and the gap ({gap} MiB) against the logged buffer",
                bytes as f64 / MIB
            );
            exact += usize::from(gap == 0.0);
            checked += 1;
            // The replay of ggml-alloc over the scheduler's copy of the reserve graph, with the
            // layers where the fixture says they ran: every device to the 4 decimals.
            let dev: usize = d.parse().unwrap();
            let replay = pipeline_compute_buffer_bytes(
                v,
                &m,
                KvType::Q8_0,
                n_ctx,
                n("n_ubatch"),
                &layer_devices(r),
                if place.output { dev } else { 1 - dev },
                n_devices,
            )
            .unwrap();
            assert_eq!(
                format!("{:.4}", replay[dev] as f64 / MIB),
                format!("{logged:.4}"),
                "{what}: the replayed buffer against the logged one"
            );
            replayed += 1;
        }
    }
    assert_eq!(replayed, 14, "{path}");
    // 7 runs on two devices; every device 0 but one, and llama3-8b's device 1, to the 4 decimals
    assert_eq!((exact, checked), (8, 14), "{path}");
}
