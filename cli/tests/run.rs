//! `repro-prefill run` (the default), end to end on the simulated device: the comparison and single
//! runs, their exit codes and outputs, the arguments (llama.cpp's spellings among them) and the
//! errors they give.

mod common;

use common::{bin, json, predict_json, tmp};
use serde_json::Value;
use std::process::Stdio;

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
fn a_single_run_that_runs_out_exits_3() {
    let (v, code) = json(&["--pool", "legacy", "--purge", "never"]);
    assert_eq!(code, 3);
    assert_eq!(v["runs"][0]["completed"], false);
    assert!(v["runs"][0]["oom_report"]
        .as_str()
        .unwrap()
        .contains("stranded"));
    // The budget warning projected where it dies, and so does the plan from the same free
    // memory (a run's whole card, 12 GiB).
    let at = &v["runs"][0]["oom_at_token"];
    assert!(at.as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(&v["runs"][0]["projected_oom_at_token"], at);
    let mut plan = bin();
    plan.args([
        "plan", "--device", "sim", "--pool", "legacy", "--purge", "never", "--format", "json",
        "--prompt", "20000",
    ]);
    let p: Value = serde_json::from_slice(&plan.output().unwrap().stdout).unwrap();
    assert_eq!((&p["fits"], &p["oom_at_token"]), (&Value::Bool(false), at));
    let (v, code) = json(&["--pool", "legacy", "--purge", "auto"]);
    assert_eq!(code, 0);
    assert_eq!(v["runs"][0]["projected_oom_at_token"], Value::Null);
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
                "plan", "--ctx", "8000000", "--prompt", "8000000", "--free", "2000",
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
        stdout.contains("the weights (") && stdout.contains(") do not fit"),
        "{stdout}"
    );
    // A plan that does not fit says so, and exits 3; one that fits exits 0.
    let (v, code) = json(&["plan", "--free", "4"]);
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
            "--purge",
            "never",
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
    // Where legacy/never dies, as its plan says.
    let (p, _) = json(&[
        "plan", "--pool", "legacy", "--purge", "never", "--prompt", "20000",
    ]);
    let at = p["oom_at_token"].as_u64().unwrap();
    assert!(
        summary[0].contains("5 of 6")
            && summary[0].contains(&format!("legacy/never dies at token {at}")),
        "{err}"
    );
    // A single run keeps its own warning, with the projection.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim", "--pool", "legacy", "--purge", "never"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("compute budget exceeded").count(), 1, "{err}");
    assert!(
        err.contains(&format!("the run dies at token {at}")),
        "{err}"
    );
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
}

#[test]
fn bad_arguments_are_refused_before_any_run_with_exit_2() {
    let missing = tmp("no-such-folder").join("x.svg");
    let engine_cpu = ["--engine", "ik-llama", "--compute", "cpu"];
    for (args, says) in [
        (
            vec!["--plot", tmp("timeline.jpg").to_str().unwrap()],
            "must end in .png or .svg",
        ),
        (vec!["--plot", missing.to_str().unwrap()], "does not exist"),
        (vec!["--trace", missing.to_str().unwrap()], "does not exist"),
        (engine_cpu.to_vec(), "drop --compute cpu"),
        (
            vec!["--compute", "cpu", "--device", "cuda"],
            "drop --compute",
        ),
    ] {
        let mut c = bin();
        c.args(&args);
        if !args.contains(&"--device") {
            c.args(["--device", "sim"]);
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        // Nothing ran: no table.
        assert!(out.stdout.is_empty(), "{args:?} ran first");
    }
    let out = bin()
        .args(["predict", "--trace-out", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

#[test]
fn cpu_maths_over_ten_minutes_is_refused_with_its_estimate_unless_yes() {
    // The default scenario's reference maths take hours on a CPU: refused at once, with the
    // estimate. (A child that is still running after a minute has started the run.)
    let mut child = bin()
        .args(["--device", "sim", "--compute", "cpu"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() > 60 {
            child.kill().unwrap();
            panic!("--compute cpu of the default scenario started without --yes");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("hours in all") && err.contains("add --yes"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
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
    let (p, code) = predict_json(&["--prompt", "20000", "--pool", "legacy", "--purge", "never"]);
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
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dry-run executor"), "{err}");
    // A bad weight type names the accepted ones.
    let out = bin()
        .args(["plan", "--engine", "ik-llama", "--weight-type", "q3_k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("f16, bf16, q8_0"));
}

#[test]
fn with_quiet_the_comparison_s_expected_out_of_memory_is_its_result_not_an_error() {
    // legacy/never runs out: a row of the table, not a log line.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("legacy/never") && l.contains("OOM at token")),
        "{table}"
    );
    // Without --quiet it is logged as a warning, never as an error.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["--device", "sim"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WARN run ended: out of memory"), "{err}");
    assert!(!err.contains("ERROR"), "{err}");
}
