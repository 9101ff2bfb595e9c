//! The NCCL term of the planner (`Outside::on_gpus`) against the two-GPU runs of 2026-11-26 on
//! two H100s (`data/h100x2-2026-11-26-{ik,mainline}-two-gpus`): per run and device, what the
//! engine's start-up took between the shim's `cuda-init` free-memory line and the engine's
//! `using device` line, as `scripts/llama/two-gpu-replan.py --fixtures` writes it into the
//! profiles' fixtures (`buffers.json`: `nccl_measured_mib`, the interval the two lines allow,
//! and `nccl_model_bytes`, the script's copy of the term, which replan.json and
//! docs/llama-cpp.md show). ik_llama.cpp made one communicator over both GPUs in every run;
//! mainline with `-sm layer` none.

use cupool_runtime::planner::outside::{Outside, NCCL_COMMUNICATOR_BYTES};
use cupool_runtime::profile::{EngineKind, Profile};

const MIB: f64 = 1048576.0;

/// Each device's (measured interval in MiB, the script's term in bytes), in the file's order.
fn devices(fixture: &str) -> Vec<((f64, f64), usize)> {
    let path = format!(
        "{}/../profiles/tests/data/{fixture}/buffers.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let number_after = |at: usize| -> &str {
        let rest = text[at..].trim_start_matches([' ', '\n', '[', ':']);
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
            .unwrap_or(rest.len());
        &rest[..end]
    };
    let mut out = Vec::new();
    // The keys are sorted: each device's interval comes right before its term.
    for (at, _) in text.match_indices("\"nccl_measured_mib\":") {
        let lo_at = at + "\"nccl_measured_mib\":".len();
        let lo: f64 = number_after(lo_at).parse().unwrap();
        let comma = lo_at + text[lo_at..].find(',').unwrap() + 1;
        let hi: f64 = number_after(comma).parse().unwrap();
        let key = "\"nccl_model_bytes\":";
        let term_at = at + text[at..].find(key).unwrap() + key.len();
        let term: usize = number_after(term_at).parse().unwrap();
        out.push(((lo, hi), term));
    }
    assert!(!out.is_empty(), "{path}: no device");
    out
}

fn engine(profile: Profile) -> EngineKind {
    EngineKind::Profile { profile, cc: 900 }
}

#[test]
fn ik_llama_s_communicators_are_what_its_start_up_took() {
    let ik = engine(Profile::IkLlama);
    let got = devices("h100x2-2026-11-26-ik");
    // 5 runs on two GPUs
    assert_eq!(got.len(), 10);
    for (device, ((lo, hi), term)) in got.into_iter().enumerate() {
        let planned = Outside::NONE.on_gpus(ik, device % 2, 2).nccl_communicators;
        assert_eq!(planned, NCCL_COMMUNICATOR_BYTES);
        assert_eq!(
            term, planned,
            "two-gpu-replan.py's term against the planner's"
        );
        let mib = planned as f64 / MIB;
        // The cuda-init line is rounded to 0.1 MiB.
        assert!(
            lo - 0.05 < mib && mib <= hi + 0.05,
            "{mib} MiB outside the measured {lo}..{hi}"
        );
    }
}

#[test]
fn mainline_s_layer_split_makes_no_communicator() {
    let mainline = engine(Profile::LlamaB8833);
    let got = devices("h100x2-2026-11-26-mainline");
    assert_eq!(got.len(), 14);
    for (device, ((lo, hi), term)) in got.into_iter().enumerate() {
        assert_eq!(
            Outside::NONE.on_gpus(mainline, device % 2, 2),
            Outside::NONE
        );
        assert_eq!(term, 0);
        assert!(lo < 0.0 + 0.05 && hi > -0.05, "{lo}..{hi}: no loss");
    }
}
