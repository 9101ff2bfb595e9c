//! The repro-prefill binary, end to end on the simulated device.
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_repro-prefill"));
    c.env_remove("GGML_POOL")
        .env_remove("GGML_CUDA_NO_VMM")
        .env_remove("GGML_CUDA_POOL_USE_MANAGED")
        .env_remove("GGML_CUDA_ALLOC_FALLBACK_MANAGED");
    c.env("RUST_LOG", "off");
    c
}

fn json(args: &[&str]) -> (Value, i32) {
    let out = bin()
        .args(args)
        .args(["--device", "sim", "--format", "json"])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap())
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cupool-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn default_comparison_shows_the_oom_and_its_fixes() {
    let plot = tmp("timeline.svg");
    let (v, code) = json(&["--plot", plot.to_str().unwrap()]);
    assert_eq!(code, 0, "a comparison that ran exits 0");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    let by = |label: &str| {
        runs.iter()
            .find(|r| r["label"] == label)
            .unwrap_or_else(|| panic!("{label}"))
    };
    let never = by("legacy/never");
    assert_eq!(never["completed"], false);
    let at = never["oom_at_token"].as_u64().unwrap();
    assert!(at > 0 && at < 20000);
    for label in [
        "legacy/always",
        "legacy/auto",
        "vmm/never",
        "managed/never",
        "vmm/never+planned",
    ] {
        assert_eq!(by(label)["completed"], true, "{label}");
        let ub = by(label)["ubatches"].as_array().unwrap();
        assert_eq!(ub.len(), 40);
        for key in [
            "index",
            "n_tokens",
            "n_kv",
            "live_peak_bytes",
            "reserved_bytes",
            "cached_bytes",
            "device_used_bytes",
            "seconds",
        ] {
            assert!(!ub[0][key].is_null(), "{key}");
        }
    }
    for key in [
        "pool",
        "purge",
        "budget_mode",
        "peak_live_bytes",
        "peak_reserved_bytes",
        "budget_bytes",
        "budget_warnings",
        "driver_mallocs",
        "driver_frees",
    ] {
        assert!(!by("vmm/never")[key].is_null(), "{key}");
    }
    assert_eq!(by("vmm/never+planned")["budget_warnings"], 0);
    assert_eq!(v["scenario"]["vram_bytes"], 12u64 << 30);
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("legacy/never")
            && svg.contains("room for the pool"),
        "an SVG with the configurations"
    );
}

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
fn a_single_run_that_runs_out_exits_3() {
    let (v, code) = json(&["--pool", "legacy"]);
    assert_eq!(code, 3);
    assert_eq!(v["runs"][0]["completed"], false);
    assert!(v["runs"][0]["oom_report"]
        .as_str()
        .unwrap()
        .contains("stranded"));
    // The budget warning projected where it dies, and so does the plan.
    assert_eq!(v["runs"][0]["oom_at_token"], 7680);
    assert_eq!(v["runs"][0]["projected_oom_at_token"], 7680);
    let mut plan = bin();
    plan.args([
        "plan", "--device", "sim", "--pool", "legacy", "--purge", "never", "--format", "json",
    ]);
    let p: Value = serde_json::from_slice(&plan.output().unwrap().stdout).unwrap();
    assert_eq!(
        (&p["fits"], &p["oom_at_token"]),
        (&Value::Bool(false), &Value::from(7680))
    );
    let (v, code) = json(&["--pool", "legacy", "--purge", "auto"]);
    assert_eq!(code, 0);
    assert_eq!(v["runs"][0]["projected_oom_at_token"], Value::Null);
}

#[test]
fn replay_of_a_recorded_trace_reproduces_the_run() {
    for (pool, purge) in [
        ("legacy", "never"),
        ("legacy", "auto"),
        ("legacy", "always"),
        ("vmm", "never"),
    ] {
        let trace = tmp(&format!("trace-{pool}-{purge}.jsonl"));
        let (r, _) = json(&[
            "--pool",
            pool,
            "--purge",
            purge,
            "--vram",
            "64",
            "--trace",
            trace.to_str().unwrap(),
        ]);
        let out = bin()
            .args([
                "replay",
                trace.to_str().unwrap(),
                "--pool",
                pool,
                "--purge",
                purge,
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            rep["peak_reserved_bytes"], r["runs"][0]["peak_reserved_bytes"],
            "{pool}/{purge}"
        );
        assert_eq!(
            rep["peak_live_bytes"], r["runs"][0]["peak_live_bytes"],
            "{pool}/{purge}"
        );
        assert_eq!(rep["ooms"], 0);
        let calls = rep["driver_mallocs"].as_u64().unwrap() + rep["driver_maps"].as_u64().unwrap();
        assert_eq!(
            calls,
            r["runs"][0]["driver_mallocs"].as_u64().unwrap(),
            "{pool}/{purge}"
        );
    }
}

#[test]
fn hand_written_trace_and_its_errors() {
    let good = tmp("hand.jsonl");
    std::fs::write(&good, "# a comment\n{\"op\":\"phase_begin\",\"name\":\"ubatch 0\"}\n{\"op\":\"alloc\",\"id\":1,\"size\":1048576}\n{\"op\":\"alloc\",\"id\":2,\"size\":4096,\"stream\":1}\n{\"op\":\"free\",\"id\":2}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"phase_end\",\"name\":\"ubatch 0\",\"prefill\":true}\n{\"op\":\"sync\"}\n").unwrap();
    let out = bin()
        .args([
            "replay",
            good.to_str().unwrap(),
            "--pool",
            "legacy",
            "--purge",
            "always",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["peak_live_bytes"], 1048576 + 4096);
    assert_eq!(
        v["end_reserved_bytes"], 0,
        "purged at the prefill phase end"
    );
    assert_eq!(v["driver_mallocs"], 2);

    for (text, expect) in [
        (
            "{\"op\":\"alloc\",\"id\":1}\n",
            "line 1: \"alloc\" needs a non-negative integer \"size\"",
        ),
        ("\n\n{\"op\":\"grow\"}\n", "line 3: unknown op \"grow\""),
        ("not json\n", "line 1: not JSON"),
        (
            "{\"op\":\"sync\"}\n{oops}\n",
            "line 2: not JSON at column 2 (key must be a string)",
        ),
        ("[1,2]\n", "line 1: expected a JSON object"),
        (
            "{\"op\":\"free\",\"id\":9}\n",
            "free of id 9, which is not live",
        ),
        (
            "{\"op\":\"phase_end\",\"name\":\"x\",\"prefill\":\"yes\"}\n",
            "\"prefill\" must be true or false",
        ),
    ] {
        let bad = tmp("bad.jsonl");
        std::fs::write(&bad, text).unwrap();
        let out = bin()
            .args(["replay", bad.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{text:?}: {err}");
    }
}

#[test]
fn bad_values_are_clear_errors() {
    for (args, expect) in [
        (vec!["--pool", "bogus"], "invalid value 'bogus'"),
        (vec!["--model", "gpt5"], "accepted presets are phi3-mini"),
        (vec!["--n-head", "0"], "n_head is 0"),
        (vec!["--n-head-kv", "7"], "not a multiple of n_head_kv"),
        (vec!["--ubatch", "4096"], "larger than batch"),
        (vec!["--prompt", "30000"], "must be between 1 and --ctx"),
        (vec!["--vram=-3"], "not a usable size"),
    ] {
        let out = bin()
            .args(&args)
            .args(["--device", "sim"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    let out = bin()
        .env("GGML_POOL", "bogus")
        .args(["--device", "sim"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("GGML_POOL=\"bogus\" is not valid: accepted values are vmm, legacy, managed"));
}

#[test]
fn help_documents_every_option() {
    let out = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--device",
        "--compute",
        "--model",
        "--n-layer",
        "--kv-type",
        "--ctx",
        "--prompt",
        "--batch",
        "--ubatch",
        "--weights",
        "--vram",
        "--pool",
        "--purge",
        "--budget",
        "--fallback-managed",
        "--format",
        "--plot",
        "--trace",
        "--quiet",
        "plan",
        "replay",
    ] {
        assert!(help.contains(opt), "{opt} missing from --help");
    }
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::process::Stdio;
    for args in [
        &["--format", "json", "--quiet", "--device", "sim"][..],
        &["plan", "--format", "json", "--device", "sim"][..],
    ] {
        let mut child = bin()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before anything is written
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn sizes_beyond_what_is_modelled_are_refused_by_name() {
    for (args, says) in [
        (
            &["--ctx", "4294967296"][..],
            "context length 4294967296 is out of range",
        ),
        (
            &[
                "plan", "--ctx", "8000000", "--prompt", "8000000", "--vram", "2000",
            ][..],
            "from 1 to 4194304 tokens",
        ),
        (
            &[
                "plan",
                "--n-embd",
                "4611686018427387904",
                "--n-ff",
                "4611686018427387904",
            ][..],
            "n_embd is 4611686018427387904",
        ),
        (
            &["--pool", "vmm", "--n-embd", "4611686018427387904"][..],
            "n_embd",
        ),
    ] {
        let out = bin().args(args).args(["--device", "sim"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[cfg(unix)]
#[test]
fn an_environment_value_that_is_not_utf8_is_an_error() {
    use std::os::unix::ffi::OsStrExt;
    let out = bin()
        .env("GGML_POOL", std::ffi::OsStr::from_bytes(b"\xff"))
        .args(["--device", "sim", "--quiet"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("GGML_POOL") && stderr.contains("UTF-8"),
        "{stderr}"
    );
}

#[test]
fn does_not_fit_has_its_exit_code() {
    // A card too small for the weights: no configuration starts.
    let out = bin()
        .args(["--vram", "0.001", "--device", "sim", "--quiet"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains("the weights (7.12 GiB) do not fit"),
        "{stdout}"
    );
    // A plan that does not fit says so, and exits 3; one that fits exits 0.
    let (v, code) = json(&["plan", "--vram", "4"]);
    assert_eq!((v["fits"].as_bool(), code), (Some(false), 3), "{v}");
    let (v, code) = json(&["plan"]);
    assert_eq!((v["fits"].as_bool(), code), (Some(true), 0), "{v}");
    // The automatic pool is named: the simulated card supports VMM.
    assert_eq!(v["pool"].as_str(), Some("vmm"), "{v}");
}

#[test]
fn the_comparison_honours_the_environment_and_pool_names_ignore_case() {
    let labels_with = |var: &str| -> Vec<String> {
        let out = bin()
            .env(var, "1")
            .args(["--device", "sim", "--format", "json", "--quiet"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["label"].as_str().unwrap().to_string())
            .collect()
    };
    let labels = labels_with("GGML_CUDA_NO_VMM");
    assert!(
        !labels.is_empty() && labels.iter().all(|l| !l.starts_with("vmm")),
        "{labels:?}"
    );
    let labels = labels_with("GGML_CUDA_ALLOC_FALLBACK_MANAGED");
    assert!(
        labels.iter().all(|l| l.ends_with("+fallback")),
        "{labels:?}"
    );
    let upper = bin()
        .args(["--pool", "VMM", "--device", "sim", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(
        upper.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&upper.stderr)
    );
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
fn llama_cpp_spellings_negative_numbers_and_binary_traces() {
    let (v, code) = json(&[
        "plan", "-c", "8192", "-b", "1024", "-ub", "256", "-ctk", "f16", "-ctv", "f16", "-fa", "1",
    ]);
    assert_eq!(code, 0, "{v}");
    let s = &v["scenario"];
    assert_eq!(
        (s["ctx"].as_u64(), s["batch"].as_u64(), s["ubatch"].as_u64()),
        (Some(8192), Some(1024), Some(256)),
        "{v}"
    );
    for (args, says) in [
        (
            &["plan", "--ctx", "-5"][..],
            "invalid value '-5' for '--ctx",
        ),
        (&["--ctx", "-5"][..], "invalid value '-5' for '--ctx"),
        (&["plan", "-fa", "off"][..], "always uses flash attention"),
    ] {
        let out = bin().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let binary = tmp("binary.jsonl");
    std::fs::write(&binary, b"\xff\xfe\n").unwrap();
    let out = bin()
        .args(["replay", binary.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is not UTF-8 text"), "{stderr}");
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
fn repeated_out_of_memory_warnings_are_rate_limited() {
    let trace = tmp("many-ooms.jsonl");
    let text: String = (0..3000)
        .map(|i| format!("{{\"op\":\"alloc\",\"id\":{i},\"size\":1048576}}\n"))
        .collect();
    std::fs::write(&trace, text).unwrap();
    let out = bin()
        .env("RUST_LOG", "warn")
        .args([
            "replay",
            trace.to_str().unwrap(),
            "--vram",
            "0.001",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ooms"].as_u64(), Some(3000), "every one is counted");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr.matches("out of device memory").count();
    assert_eq!(warnings, 12, "the 1st, 2nd, 4th, ..., 2048th: {stderr}");
}

#[test]
fn plan_refuses_the_options_it_has_no_use_for() {
    for (args, says) in [
        (&["plan", "--format", "csv"][..], "plan has no csv output"),
        (&["plan", "--plot", "x.svg"][..], "--plot records a run"),
        (&["plan", "--trace", "t.jsonl"][..], "--trace records a run"),
    ] {
        let out = bin().args(args).args(["--device", "sim"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_refused_fallback_says_oversubscription_must_be_allowed() {
    // Legacy with the managed fallback: oversubscription allowed or not, in this format.
    let fallback = |allowed: bool, format: &str| {
        let mut c = bin();
        if allowed {
            c.env("CUPOOL_ALLOW_OVERSUBSCRIPTION", "1");
        }
        c.args([
            "--pool",
            "legacy",
            "--fallback-managed",
            "--device",
            "sim",
            "--format",
            format,
        ])
        .output()
        .unwrap()
    };
    let out = fallback(false, "table");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3), "{all}");
    assert!(
        all.contains("the managed fallback was refused too"),
        "{all}"
    );
    assert!(all.contains("CUPOOL_ALLOW_OVERSUBSCRIPTION=1"), "{all}");
    // Allowed, it completes, and the row's note says how much came from managed memory.
    let out = fallback(true, "table");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("allocations served from managed memory") && text.contains("at most"),
        "{text}"
    );
    let v: Value = serde_json::from_slice(&fallback(true, "json").stdout).unwrap();
    let run = &v["runs"][0];
    assert!(run["fallbacks"].as_u64().unwrap() > 0, "{run}");
    let peak = run["fallback_peak_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= run["peak_live_bytes"].as_u64().unwrap(),
        "{run}"
    );
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

#[test]
fn a_comparison_says_its_budget_warnings_once() {
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("compute budget exceeded").count(), 0, "{err}");
    let summary: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("configurations exceeded"))
        .collect();
    assert_eq!(summary.len(), 1, "{err}");
    assert!(
        summary[0].contains("5 of 6") && summary[0].contains("legacy/never dies at token 7680"),
        "{err}"
    );
    // A single run keeps its own warning, with the projection.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim", "--pool", "legacy"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("compute budget exceeded").count(), 1, "{err}");
    assert!(err.contains("the run dies at token 7680"), "{err}");
}

#[test]
fn cpu_maths_says_how_long_it_will_take() {
    let tiny = [
        "--device",
        "sim",
        "--compute",
        "cpu",
        "--pool",
        "vmm",
        "--n-layer",
        "1",
        "--n-embd",
        "64",
        "--n-head",
        "4",
        "--n-head-kv",
        "2",
        "--head-dim-k",
        "16",
        "--head-dim-v",
        "16",
        "--n-ff",
        "128",
        "--ctx",
        "256",
        "--prompt",
        "256",
        "--batch",
        "64",
        "--ubatch",
        "64",
        "--vram",
        "1",
    ];
    let out = bin().args(tiny).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: --compute cpu") && err.contains("under a second per configuration"),
        "{err}"
    );
    // --quiet keeps it out.
    let out = bin().args(tiny).arg("--quiet").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
}

#[test]
fn the_plot_is_png_or_svg_by_its_name_and_the_command_says_what_it_wrote() {
    let png = tmp("timeline.png");
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim", "--plot", png.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 20_000,
        "with lines and text: {} bytes",
        bytes.len()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("wrote {}", png.display())), "{err}");
    let svg = tmp("timeline2.svg");
    let (_, code) = json(&["--plot", svg.to_str().unwrap()]);
    assert_eq!(code, 0);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<svg") && text.contains("room for the pool"),
        "an SVG"
    );
    let out = bin()
        .args([
            "--device",
            "sim",
            "--plot",
            tmp("timeline.jpg").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must end in .png or .svg"));
}

/// `repro-prefill predict ARGS --format json`: its output and exit code.
fn predict_json(args: &[&str]) -> (Value, i32) {
    let out = bin()
        .arg("predict")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap())
}

#[test]
fn predict_gives_the_real_engine_s_sweep_and_where_it_died() {
    let run = predict_json;
    // ik_llama.cpp on an H200, phi3-mini f16, llama-sweep-bench -n 1 -ub 512 to 20k, legacy
    // pool without purging (docs/llama-cpp.md): 2,698,837,504 bytes reserved, 37 mallocs.
    let (v, code) = run(&["--sweep", "40"]);
    assert_eq!(code, 0);
    assert_eq!(v["peak_reserved_bytes"], 2_698_837_504u64);
    assert_eq!(v["driver_mallocs"], 37);
    // On the 12 GiB card the pool had 346.8 MiB reserved and 9.6 MiB free when it failed: the
    // run died in the step after N_KV = 8704, after 12 mallocs.
    let (v, code) = run(&["--sweep", "40", "--vram", "0.348"]);
    assert_eq!(code, 3, "running out exits 3");
    assert_eq!(v["oom_at_token"], 9216);
    assert_eq!(v["driver_mallocs"], 12);
    // What the profile does not model is refused with what it does.
    let out = bin()
        .args(["predict", "--model", "mixtral-8x7b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("phi3-mini, llama3-8b, qwen3-30b-a3b, deepseek-v3"));
    // DeepSeek's MLA: without -amb the prompt path's decompression grows by 68,608 bytes per
    // cache position (the K/V of 128 heads as f16, the cache view as f32 and f16); with the
    // default 256 MiB it is decompressed in head chunks. A prompt of 20,000 ends with a short
    // ubatch of 32: the absorbed path over the whole cache.
    let reserved = |amb: &str, prompt: &str| {
        let args = [
            "--model",
            "deepseek-v3",
            "--weight-type",
            "q8_0",
            "--pool",
            "vmm",
        ];
        let (v, code) = run(&[&args[..], &["--amb", amb, "--prompt", prompt]].concat());
        assert_eq!(code, 0);
        v["peak_reserved_bytes"].as_u64().unwrap()
    };
    assert_eq!(
        reserved("0", "20480") - reserved("0", "10240"),
        68_608 * 10_240
    );
    assert!(reserved("256", "20480") * 4 < reserved("0", "20480"));
    assert!(reserved("256", "20000") > 0);
}

#[test]
fn mainline_profiles_show_what_pr_23907_moved() {
    // Before the PR the K/V copies come from the pool and the legacy pool strands them;
    // after it the pool holds only the matrix multiplies' and stream-k's buffers.
    let peak = |engine: &str| {
        let (v, code) = predict_json(&["--engine", engine, "--prompt", "20000"]);
        assert_eq!(code, 0, "{engine}");
        v["peak_reserved_bytes"].as_u64().unwrap()
    };
    let (before, after) = (peak("llama-b8833"), peak("llama"));
    assert!(before > 50 * after, "{before} vs {after}");
    // ...and the compute buffer holds them instead, for the whole context, from startup.
    let compute = |engine: &str| {
        let (v, code) = json(&["plan", "--engine", engine, "--vram", "12"]);
        assert!(code == 0 || code == 3, "{engine}: {code}");
        v["compute_bytes"].as_u64().unwrap()
    };
    let copies = 2 * 20480 * 3072 * 2; // K and V, f16, phi3-mini's 32 KV heads of 96
    assert_eq!(compute("llama"), compute("llama-b8833") + copies);
    assert_eq!(compute("llama-b8833"), compute("ik-llama"));
    // The experts of a mixture-of-experts preset, q8_0; f16 experts are refused.
    let (v, code) = predict_json(&[
        "--engine",
        "llama",
        "--model",
        "qwen3-30b-a3b",
        "--weight-type",
        "q8_0",
    ]);
    assert_eq!(code, 0);
    assert!(v["peak_reserved_bytes"].as_u64().unwrap() > 0);
    let out = bin()
        .args(["predict", "--engine", "llama", "--model", "qwen3-30b-a3b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("q8_0 weights"));
    // A flash-attention occupancy of 0 is refused.
    let out = bin()
        .args(["predict", "--engine", "llama", "--fa-occupancy", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn run_and_plan_take_an_engine_profile_s_traffic() {
    // The runtime with the ik_llama profile on the simulated device reports what `predict`
    // replays for the same prompt.
    let (v, code) = json(&[
        "run", "--engine", "ik-llama", "--pool", "legacy", "--purge", "never", "--vram", "16",
    ]);
    assert_eq!(code, 0);
    let run = &v["runs"][0];
    let (p, code) = predict_json(&["--prompt", "20000"]);
    assert_eq!(code, 0);
    assert_eq!(run["peak_reserved_bytes"], p["peak_reserved_bytes"]);
    assert_eq!(run["driver_mallocs"], p["driver_mallocs"]);
    // Kernels of cupool's own are not the engine's: a profile is refused with --compute.
    let out = bin()
        .args([
            "run",
            "--device",
            "sim",
            "--compute",
            "cpu",
            "--engine",
            "ik-llama",
        ])
        .args(["--pool", "legacy", "--ctx", "1024", "--prompt", "512"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("dry-run executor"), "{err}");
    // A bad weight type names the accepted ones.
    let out = bin()
        .args(["plan", "--engine", "ik-llama", "--weight-type", "q4_k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("f16, q8_0"));
}
