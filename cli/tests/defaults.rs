//! One default pool and purge policy across the subcommands: libcupool's, what llama.cpp gets
//! with `GGML_POOL` set and nothing else (the settings table's libcupool defaults).

mod common;

use common::{bin, json, predict_json};
use cupool::pool::settings::{setting, FrontEnd};
use serde_json::Value;

fn pool_and_purge(v: &Value) -> (String, String) {
    let s = |k: &str| {
        v[k].as_str()
            .unwrap_or_else(|| panic!("{k} in {v}"))
            .to_string()
    };
    (s("pool"), s("purge"))
}

#[test]
fn run_plan_predict_and_replay_default_to_libcupool_s_pool_and_purge() {
    let libcupool = |name: &str| {
        setting(name)
            .unwrap()
            .default_for(FrontEnd::Libcupool)
            .unwrap()
    };
    // The simulated card supports VMM, so libcupool's "vmm where the device supports VMM".
    assert!(
        libcupool("GGML_POOL").starts_with("vmm"),
        "{}",
        libcupool("GGML_POOL")
    );
    let want = ("vmm".to_string(), libcupool("CUPOOL_PURGE").to_string());
    let (plan, _) = json(&["plan", "--free", "12"]);
    assert_eq!(pool_and_purge(&plan), want, "plan");
    let (predict, _) = predict_json(&[]);
    assert_eq!(pool_and_purge(&predict), want, "predict");
    // run: one configuration once a pool is named; its purge is the default one.
    let (run, _) = json(&["run", "--pool", "vmm"]);
    assert_eq!(run["runs"][0]["label"], format!("vmm/{}", want.1), "run");
    // replay: a trace written by that run, replayed with no pool named.
    let trace = common::tmp("defaults-trace.jsonl");
    let (_, code) = json(&["run", "--pool", "vmm", "--trace", trace.to_str().unwrap()]);
    assert_eq!(code, 0);
    let out = bin()
        .args(["replay", trace.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let replay: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pool_and_purge(&replay), want, "replay");
    std::fs::remove_file(trace).unwrap();
}
