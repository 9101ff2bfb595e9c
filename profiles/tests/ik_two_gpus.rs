//! ik_llama.cpp 8337e4cd across two GPUs (`-sm layer`, both devices' pools in cupool), against
//! the `ik_llama` profile device by device: each device's pool gets the requests of the layers
//! ik_llama.cpp placed on it, and the device holding the output layer the output matrix's too.
//! `prompts.rs` (`ik_llama_prompts_on_two_gpus`) compares the middle ubatches of two older H200
//! runs; this test takes every step of the H100 runs, the start-up phase included.
//!
//! The runs (`scripts/llama/two-gpu.sh ik` on two H100s, 2026-11-26; fixtures written by
//! `scripts/llama/two-gpu-report.py data/h100x2-2026-11-26-ik-two-gpus --fixtures
//! profiles/tests/data/h100x2-2026-11-26-ik`): `llama-bench -n 0 -r 1 -b 2048 -fa 1 -ctk q8_0
//! -ctv q8_0 -ngl 99 -sm layer -ts 1/1 -v` with `GGML_POOL=legacy` over the random-weight GGUFs
//! of `gen_model.py`: phi3-mini f16 `-p 8192 -ub 2048`, llama3-8b q8_0 `-p 5000 -ub 512` and
//! phi3-mini f16 `-p 20480 -ub 512` (`never`), and the last on a card of which the ballast left
//! 7.5 GiB free on GPU 1 (`never`: aborts there mid-prompt; `auto`: completes).
//!
//! ik_llama.cpp's `llama-bench` warms up with a one-token prompt (no ubatch end: its requests
//! share the start-up phase with the measured prompt's first ubatch), then runs the prompt once
//! (`-r 1`). It places layers by their sizes (`default_layer_device` in `src/llama.cpp`: each
//! layer's weights and cache, the output layer's included, filled device by device up to each
//! device's share of `-ts`), logged under `-v` as `Setting default device in layer N to D`; the
//! test takes that placement (phi3-mini: 16 + 16 layers, llama3-8b: 17 + 15, as in the H200
//! runs). ik_llama.cpp runs the devices' splits one after the other (no pipeline copies), and
//! an out-of-memory aborts the process: the trace of that run stops at the failure.
//!
//! Until the fixtures are in place the tests say so on stderr and check nothing
//! (`CUPOOL_REQUIRE_TWO_GPUS=1` makes that a failure); `CUPOOL_IK_TWO_GPUS_DATA` points them
//! elsewhere. `CUPOOL_IK_TWO_GPUS_SUMMARY=FILE` writes each device's predicted and recorded peak
//! reserve as JSON lines (`two-gpu-report.py --predicted FILE`); without it the test checks that
//! the fixtures' `predicted.jsonl` is those lines.
mod common;

use common::two_gpus::{
    compare_runs, data_dir, peak_lines, runs, streams_are_devices, summary, Run,
};

const DATA: &str = "tests/data/h100x2-2026-11-26-ik";
const TEST: &str = "ik_two_gpus";

fn fixtures() -> Option<(String, Vec<Run>)> {
    let dir = data_dir(TEST, "CUPOOL_IK_TWO_GPUS_DATA", DATA, "ik")?;
    let runs = runs(&dir, "ik");
    Some((dir, runs))
}

/// The layers on each device as ik_llama.cpp logged them: the first device a run of the first
/// layers, the second the rest and the output layer; phi3-mini 16 on the first device and
/// llama3-8b 17 (their weights and caches differ; the output matrix weighs on the second's
/// share); and stream `d` of each trace is device `d`.
#[test]
fn each_device_holds_a_run_of_layers_and_its_stream() {
    let Some((_, runs)) = fixtures() else { return };
    for r in &runs {
        let n_layer = r.model.n_layer;
        let p = &r.logged_placement;
        assert_eq!(p.len(), n_layer + 1, "{}: every layer placed", r.name);
        let first = p.iter().position(|&d| d == 1).expect("a layer on device 1");
        assert!(
            p[..first].iter().all(|&d| d == 0) && p[first..].iter().all(|&d| d == 1),
            "{}: device 0 holds layers 0..{first}, device 1 the rest and the output: {p:?}",
            r.name
        );
        let want = match r.preset.as_str() {
            "phi3-mini" => 16,
            "llama3-8b" => 17,
            m => panic!("{}: model {m}", r.name),
        };
        assert_eq!(first, want, "{}: layers on device 0", r.name);
        streams_are_devices(r);
    }
}

/// Every step of every run on each device, the one-token warm-up and the first ubatch (the
/// start-up phase) included: the `ik_llama` profile's requests for that device's layers (and
/// the output matrix on the second) equal the recorded ones request for request; in the run
/// that aborted, up to the failing allocation, which is the profile's next.
#[test]
fn every_device_s_requests_equal_the_recorded_ones() {
    let Some((_, runs)) = fixtures() else { return };
    let compared = compare_runs(TEST, runs.iter(), Run::logged);
    assert!(compared > 0, "no run compared");
}

/// Each device's predicted requests for a `never` run replayed through the legacy pool (in the
/// run that aborted, up to the failed allocation): the peak reserve equals the replay of that
/// device's recorded stream and what the device's pool reported, to the byte.
#[test]
fn each_device_s_peak_reserve_equals_the_run_s() {
    let Some((dir, runs)) = fixtures() else {
        return;
    };
    let lines = peak_lines(&runs, Run::logged);
    summary(TEST, "CUPOOL_IK_TWO_GPUS_SUMMARY", &dir, &lines);
}
