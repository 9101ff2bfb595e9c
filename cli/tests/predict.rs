//! `repro-prefill predict`: a real engine's requests for a prefill, against what was measured in
//! it.

mod common;

use common::{bin, json, predict_json};

#[test]
fn predict_gives_the_real_engine_s_sweep_and_where_it_died() {
    let run = predict_json;
    let legacy = ["--sweep", "40", "--pool", "legacy", "--purge", "never"];
    // ik_llama.cpp on an H200, phi3-mini f16, llama-sweep-bench -n 1 -ub 512 to 20k, legacy
    // pool without purging (docs/llama-cpp.md): 2,698,837,504 bytes reserved, 37 mallocs.
    let (v, code) = run(&legacy);
    assert_eq!(code, 0);
    assert_eq!(v["peak_reserved_bytes"], 2_698_837_504u64);
    assert_eq!(v["driver_mallocs"], 37);
    // With 12 GiB free before it started (data/h200-2026-11-22-purge/lazy, seed12-legacy-never
    // .log) the run died in the step after N_KV = 8704, the one from token 9216, its pool
    // holding 346.8 MiB with 7.6 MiB free: 354.4 MiB of room. The room is derived from the free
    // memory (weights, KV cache, compute buffer, what lies outside them, none of it fitted to
    // this run): the prediction lands within one ubatch of where it died.
    let (v, code) = run(&[&legacy[..], &["--free", "12", "--ctx", "20480"]].concat());
    assert_eq!(code, 3, "running out exits 3");
    let at = v["oom_at_token"].as_i64().unwrap();
    assert!((at - 9216).abs() <= 512, "{at}");
    let room = v["free"]["pool_room_bytes"].as_f64().unwrap() / (1u64 << 20) as f64;
    assert!((room - 354.4).abs() < 32.0, "{room} MiB");
    assert_eq!(v["free"]["fits"], false);
    // The same card with libcupool's defaults (vmm, purge auto) and with a purging legacy pool
    // completed (seed12.jsonl: legacy-auto-trace, vmm-always).
    for (pool, purge) in [("vmm", "auto"), ("legacy", "auto"), ("vmm", "always")] {
        let args = [
            "--sweep", "40", "--free", "12", "--pool", pool, "--purge", purge,
        ];
        let (v, code) = run(&args);
        assert_eq!(
            (code, &v["free"]["fits"]),
            (0, &true.into()),
            "{pool}/{purge}: {v}"
        );
    }
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
        let (v, code) = predict_json(&[
            "--engine", engine, "--prompt", "20000", "--pool", "legacy", "--purge", "never",
        ]);
        assert_eq!(code, 0, "{engine}");
        v["peak_reserved_bytes"].as_u64().unwrap()
    };
    let (before, after) = (peak("llama-b8833"), peak("llama"));
    assert!(before > 50 * after, "{before} vs {after}");
    // ...and the compute buffer holds them instead, for the whole context, from startup: it
    // grows with the context by the copies and the attention mask, where b8833's does not.
    let compute = |engine: &str, ctx: &str| {
        let (v, code) = json(&["plan", "--engine", engine, "--free", "12", "--ctx", ctx]);
        assert!(code == 0 || code == 3, "{engine}: {code}");
        v["compute_bytes"].as_u64().unwrap()
    };
    // Per cache position: K and V f16 copies (phi3-mini's 32 KV heads of 96) and one f16
    // mask entry for each of the ubatch's 512 rows.
    let per_position = 2 * 3072 * 2 + 512 * 2;
    assert_eq!(
        compute("llama", "20480") - compute("llama", "10240"),
        10240 * per_position
    );
    assert!(compute("llama", "20480") > 2 * 20480 * 3072 * 2);
    // b8833's buffer holds no copies: it grows by the mask alone, once the attention stage
    // outgrows the logits (ggml-alloc's placement replayed for both builds).
    let grown = compute("llama-b8833", "20480") - compute("llama-b8833", "10240");
    assert!(grown > 0 && grown <= 10240 * 512 * 2, "{grown}");
    assert!(compute("llama-b8833", "20480") < compute("llama", "20480") / 2);
    // Where the logits are the peak, the output stage: ik_llama.cpp's closed form.
    assert_eq!(
        compute("llama-b8833", "10240"),
        compute("ik-llama", "10240")
    );
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
        .args(["--weight-type", "f16"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--weight-type q8_0"));
    // A flash-attention occupancy of 0 is refused.
    let out = bin()
        .args(["predict", "--engine", "llama", "--fa-occupancy", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_mixture_of_experts_preset_runs_on_its_own_default_weight_type() {
    // Without --weight-type a mixture-of-experts preset takes q8_0, the type its profiles
    // model; the result is the one --weight-type q8_0 gives.
    // (Mainline's profiles do not model DeepSeek's latent attention.)
    for (engine, models) in [
        ("ik-llama", &["qwen3-30b-a3b", "deepseek-v3"][..]),
        ("llama-b8833", &["qwen3-30b-a3b"]),
        ("llama", &["qwen3-30b-a3b"]),
    ] {
        for &model in models {
            let base = ["--engine", engine, "--model", model, "--prompt", "4096"];
            let (default, code) = predict_json(&base);
            assert_eq!(code, 0, "{engine} {model}: {default}");
            let (q8, _) = predict_json(&[&base[..], &["--weight-type", "q8_0"]].concat());
            assert_eq!(default, q8, "{engine} {model}");
            // f16 is refused, naming the type that works, as a bad argument.
            let out = bin()
                .arg("predict")
                .args(base)
                .args(["--weight-type", "f16"])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{engine} {model}: {err}");
            assert!(err.contains("--weight-type q8_0"), "{err}");
        }
    }
    // plan with an engine profile takes the same default.
    let (v, code) = common::json(&["plan", "--engine", "ik-llama", "--model", "qwen3-30b-a3b"]);
    assert!(code == 0 || code == 3, "{v}");
}

#[test]
fn a_predicted_out_of_memory_warns_once() {
    // The sweep from 12 GiB free dies as the engine does, at its first failed allocation: the
    // pool's one report is the log, and the replay's figures end there (one failure counted).
    let sweep = [
        "predict", "--sweep", "40", "--free", "12", "--pool", "legacy", "--purge", "never",
    ];
    let out = bin().env_remove("RUST_LOG").args(sweep).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("out of device memory").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = bin()
        .args(sweep)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ooms"], 1, "{v}");
    assert_eq!(v["oom_at_token"], 9216, "{v}");
    // With --quiet the prediction alone: its out-of-memory is its result.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(sweep)
        .arg("--quiet")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(String::from_utf8_lossy(&out.stdout).contains("runs out of memory"));
}
