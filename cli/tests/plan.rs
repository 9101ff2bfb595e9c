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
                "--model", model, "--ctx", "16384", "--prompt", "12000", "--pool", pool, "--purge",
                purge,
            ];
            // The same free memory: plan's --free, a run's whole card.
            let (p, code) = json(&[&["plan", "--free", "200"][..], &args[..]].concat());
            assert_eq!(code, 0);
            let (r, code) = json(&[&["--vram", "200"][..], &args[..]].concat());
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
                "peak_device_bytes",
                "device_bytes",
                "max_ctx_that_fits",
                "advice",
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
    let (v, code) = json(&["plan", "--ctx", "32768", "--free", "24"]);
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
    // Each layer weighs the same: 32 layers less 16 weigh twice what 16 less 8 do.
    let weights = |layers: &str| {
        let (v, _) = json(&["plan", "--n-layer", layers]);
        v["weights_bytes"].as_i64().unwrap()
    };
    let (w8, w16, w32) = (weights("8"), weights("16"), weights("32"));
    assert_eq!(w32 - w16, 2 * (w16 - w8));
}

#[test]
fn plan_help_lists_only_what_a_plan_uses_and_refuses_the_rest() {
    let out = bin().args(["plan", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--ctx", "--prompt", "--pool", "--purge", "--free", "--cc", "--format",
    ] {
        assert!(help.contains(opt), "{opt} missing from plan --help");
    }
    // --vram is a run's simulated card: a plan starts from the free memory and says so.
    assert!(!help.contains("--vram"), "{help}");
    let out = bin()
        .args(["plan", "--device", "sim", "--vram", "12"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --free"));
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

#[test]
fn weights_weigh_what_their_type_takes() {
    let weights = |model: &str, ty: &str| {
        let (v, _) = json(&["plan", "--model", model, "--weight-type", ty]);
        v["weights_bytes"].as_f64().unwrap_or_else(|| panic!("{v}"))
    };
    for model in ["phi3-mini", "llama3-8b"] {
        let f16 = weights(model, "f16");
        // Matrices dominate: the ratios of the types' sizes, within the f32 norms' share.
        for (ty, per_value) in [
            ("f32", 4.0),
            ("bf16", 2.0),
            ("q8_0", 34.0 / 32.0),
            ("q4_0", 18.0 / 32.0),
        ] {
            let r = weights(model, ty) / f16;
            assert!((r - per_value / 2.0).abs() < 0.002, "{model} {ty}: {r}");
        }
    }
}

#[test]
fn a_plan_s_verdict_is_what_the_run_does_from_the_same_free_memory() {
    // For every pool and purge policy and a range of free memory around where the scenario
    // stops fitting: the plan fits exactly when the run completes, dies where the run dies,
    // and reserves what the run reserves; `auto` included, whose purges read the free memory.
    for (pool, purge) in [
        ("legacy", "never"),
        ("legacy", "auto"),
        ("legacy", "always"),
        ("vmm", "auto"),
    ] {
        for free in ["11.2", "11.6", "11.9", "12", "12.5"] {
            let args = [
                "--ctx", "20480", "--prompt", "20480", "--pool", pool, "--purge", purge,
            ];
            let (p, _) = json(&[&["plan", "--free", free][..], &args[..]].concat());
            let (r, _) = json(&[&["--vram", free][..], &args[..]].concat());
            let run = &r["runs"][0];
            let what = format!("{pool}/{purge} with {free} GiB free: {p} {run}");
            if run["error"].is_string() {
                assert_eq!(p["oom_at_token"], 0, "{what}");
                continue;
            }
            assert_eq!(p["fits"], run["completed"], "{what}");
            assert_eq!(p["oom_at_token"], run["oom_at_token"], "{what}");
            assert_eq!(
                p["pool_peak_reserved_bytes"], run["peak_reserved_bytes"],
                "{what}"
            );
            // The advice agrees with the verdict.
            let advice = p["advice"].as_str().unwrap();
            assert_eq!(
                advice.starts_with("to do: nothing"),
                p["fits"] == true,
                "{advice}"
            );
        }
    }
}

/// The flags a plan takes for the settings an advice names (`GGML_POOL=vmm CUPOOL_PURGE=auto`,
/// `-ub 256 (...)`).
fn flags(settings: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = settings.split([' ', '(', ')']).filter(|w| !w.is_empty());
    while let Some(w) = words.next() {
        if let Some(k) = w.strip_prefix("GGML_POOL=") {
            out.extend(["--pool".to_string(), k.to_string()]);
        } else if let Some(p) = w.strip_prefix("CUPOOL_PURGE=") {
            out.extend(["--purge".to_string(), p.to_string()]);
        } else if w == "-ub" {
            out.extend(["--ubatch".to_string(), words.next().unwrap().to_string()]);
        } else {
            panic!("an advice names {w:?} in {settings:?}");
        }
    }
    out
}

#[test]
fn the_advice_is_what_its_settings_give() {
    // Engines, models, settings and free memory where the asked context fits, fits with other
    // settings, or fits only shorter: what the advice says to do is checked by planning it.
    let cases: &[&[&str]] = &[
        &["--engine", "llama"],
        &[
            "--engine",
            "llama",
            "--model",
            "llama3-8b",
            "--weight-type",
            "q8_0",
        ],
        &[
            "--engine", "ik-llama", "--pool", "legacy", "--purge", "never",
        ],
        &[
            "--engine",
            "ik-llama",
            "--model",
            "llama3-8b",
            "--weight-type",
            "q8_0",
            "--pool",
            "legacy",
            "--purge",
            "never",
        ],
        &["--pool", "legacy", "--purge", "never"],
    ];
    let mut seen = [false; 3];
    for case in cases {
        for (free, ctx) in [
            ("12", "20480"),
            ("12", "32768"),
            ("16", "32768"),
            ("11.8", "20480"),
        ] {
            let base: Vec<&str> = [&["plan", "--free", free][..], case].concat();
            let (p, code) = json(&[&base[..], &["--ctx", ctx]].concat());
            let advice = p["advice"].as_str().unwrap().to_string();
            assert!(advice.starts_with("to do: "), "{advice}");
            assert_eq!(code == 0, p["fits"] == true, "{p}");
            if p["fits"] == true {
                seen[0] = true;
                assert!(advice.starts_with("to do: nothing"), "{advice}");
            } else if let Some(settings) = p["advice_settings"].as_str() {
                seen[1] = true;
                // The settings named, in place of the case's own, make the asked context fit.
                let f = flags(settings);
                let mut args: Vec<&str> = Vec::new();
                let mut it = base.iter();
                while let Some(&a) = it.next() {
                    if f.iter().any(|g| g == a) {
                        it.next();
                    } else {
                        args.push(a);
                    }
                }
                args.extend(f.iter().map(String::as_str));
                let (q, code) = json(&[&args[..], &["--ctx", ctx]].concat());
                assert_eq!((code, &q["fits"]), (0, &true.into()), "{advice}: {q}");
            } else if let Some(m) = p["advice_ctx"].as_u64() {
                seen[2] = true;
                // The context named fits as configured, and 256 more does not.
                let fits = |c: u64| {
                    json(&[&base[..], &["--ctx", &c.to_string()]].concat()).0["fits"] == true
                };
                assert!(fits(m) && !fits(m + 256), "{advice}");
                assert_eq!(p["max_ctx_that_fits"], m, "{p}");
            }
        }
    }
    assert_eq!(seen, [true; 3], "every kind of advice was checked");
}
