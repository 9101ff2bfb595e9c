//! `repro-prefill plan`, end to end on the simulated device: the budget against what a run
//! measures, the prompt it plans, the options it refuses.

mod common;

use common::{bin, json, tmp};

#[test]
fn plan_equals_what_the_run_measures() {
    for (pool, purge) in [
        ("vmm", "never"),
        ("legacy", "never"),
        ("legacy", "always"),
        ("legacy", "auto"),
        ("managed", "never"),
    ] {
        for model in ["llama3-8b", "qwen3-30b-a3b"] {
            let args = [
                "--model", model, "--ctx", "16384", "--prompt", "12000", "--vram", "200", "--pool",
                pool, "--purge", purge,
            ];
            let (p, code) = json(&[&["plan"][..], &args[..]].concat());
            assert_eq!(code, 0);
            let (r, code) = json(&args);
            assert_eq!(code, 0, "{model} {pool}/{purge} completes on 200 GiB");
            assert_eq!(
                p["pool_peak_reserved_bytes"], r["runs"][0]["peak_reserved_bytes"],
                "{model} {pool}/{purge}"
            );
            assert_eq!(p["fits"], true);
            for key in [
                "kv_bytes",
                "compute_bytes",
                "weights_bytes",
                "total_bytes",
                "device_bytes",
                "max_ctx_that_fits",
            ] {
                assert!(!p[key].is_null(), "{key}");
            }
        }
    }
}

#[test]
fn the_prompt_follows_a_shorter_context() {
    // plan: the whole context; a run: 20000 tokens, or the context if shorter.
    let (v, code) = json(&["plan", "--ctx", "8192"]);
    assert_eq!(
        (v["scenario"]["prompt"].as_u64(), code),
        (Some(8192), 0),
        "{v}"
    );
    let (v, code) = json(&["plan", "--ctx", "32768", "--vram", "24"]);
    assert_eq!(
        (v["scenario"]["prompt"].as_u64(), code),
        (Some(32768), 0),
        "{v}"
    );
    let (v, code) = json(&["--ctx", "8192", "--pool", "vmm"]);
    assert_eq!(
        (v["scenario"]["prompt"].as_u64(), code),
        (Some(8192), 0),
        "{v}"
    );
}

#[test]
fn falling_back_to_the_simulated_card_is_said_once() {
    let out = bin()
        .args(["plan"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("running on the simulated card").count(),
        1,
        "{stderr}"
    );
    let quiet = bin()
        .args(["plan", "--quiet"])
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&quiet.stderr).is_empty());
}

#[test]
fn plan_refuses_the_options_it_has_no_use_for() {
    for (args, says) in [
        (&["plan", "--plot", "x.svg"][..], "--plot records a run"),
        (&["plan", "--yes"][..], "drop --yes"),
        (&["plan", "--trace", "t.jsonl"][..], "--trace records a run"),
    ] {
        let out = bin().args(args).args(["--device", "sim"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_custom_shape_is_named_by_its_changes_and_weighs_accordingly() {
    let (v, code) = json(&["plan", "--n-layer", "16"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        v["scenario"]["model"].as_str(),
        Some("phi3-mini with n_layer=16"),
        "{v}"
    );
    // Half the layers of the scenario's 7.64 GB of weights.
    assert_eq!(
        v["scenario"]["weights_bytes"].as_u64(),
        Some(3_820_000_000),
        "{v}"
    );
}

#[test]
fn plan_help_lists_only_what_a_plan_uses_and_refuses_the_rest() {
    let out = bin().args(["plan", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--ctx", "--prompt", "--pool", "--purge", "--vram", "--format",
    ] {
        assert!(help.contains(opt), "{opt} missing from plan --help");
    }
    for opt in [
        "--compute",
        "--budget",
        "--fallback-managed",
        "--plot",
        "--trace",
        "--yes",
    ] {
        assert!(!help.contains(opt), "{opt} in plan --help:\n{help}");
        let mut c = bin();
        c.args(["plan", "--device", "sim", opt]);
        match opt {
            "--compute" => c.arg("cpu"),
            "--budget" => c.arg("planned"),
            "--plot" | "--trace" => c.arg(tmp("refused").as_os_str()),
            _ => &mut c,
        };
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{opt}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("drop {opt}")), "{opt}: {err}");
    }
}
