//! `--gguf FILE`: a model file's header gives the shape, the weights' type and their bytes. A
//! file written with a preset's metadata and tensors (the profiles' test writer) plans,
//! predicts and runs exactly as that preset does; the options it replaces are refused beside
//! it; a bad file is refused with the reader's error.

mod common;
#[path = "../../profiles/tests/gguf/mod.rs"]
mod gguf;

use common::{bin, json, tmp};
use gguf::models::{write, Dims};
use gguf::writer::{F16, Q8_0};
use serde_json::Value;
use std::path::PathBuf;

/// A GGUF file of `dims` with matrices of `ty`: its header, and its tensor data a hole (the
/// file has its whole length, as the reader checks, without writing gigabytes).
fn file(name: &str, dims: &Dims, ty: u32) -> PathBuf {
    let (header, len) = write(dims, ty, true).header();
    let path = tmp(name);
    std::fs::write(&path, &header).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    path
}

fn phi3() -> Dims {
    Dims::dense("phi3", [32, 3072, 32, 32, 96, 8192, 32064])
}

fn llama3() -> Dims {
    Dims::dense("llama", [32, 4096, 32, 8, 128, 14336, 128256])
}

/// The output without what names the model (the file's name, or the preset's).
fn unnamed(mut v: Value) -> Value {
    if let Some(s) = v.get_mut("scenario").and_then(Value::as_object_mut) {
        s.remove("model");
    }
    v
}

#[test]
fn a_file_of_a_preset_plans_as_the_preset_does() {
    let phi = file("phi3-f16.gguf", &phi3(), F16);
    let llama = file("llama3-q8.gguf", &llama3(), Q8_0);
    let cases = [(&phi, "phi3-mini", "f16"), (&llama, "llama3-8b", "q8_0")];
    for (path, preset, ty) in cases {
        let path = path.to_str().unwrap();
        for engine in ["cupool", "ik-llama", "llama"] {
            for rest in [&["-c", "20480"][..], &["-c", "32768", "--free", "16"]] {
                let common = [&["plan", "--engine", engine][..], rest].concat();
                let (from_file, code_f) = json(&[&common[..], &["--gguf", path]].concat());
                let (from_preset, code_p) =
                    json(&[&common[..], &["--model", preset, "--weight-type", ty]].concat());
                let what = format!("{preset} {ty} {engine} {rest:?}");
                assert_eq!(code_f, code_p, "{what}");
                assert_eq!(unnamed(from_file), unnamed(from_preset), "{what}");
            }
        }
    }
    // A predict with the free memory, and a run, agree the same way.
    let path = phi.to_str().unwrap();
    let out = |args: &[&str]| {
        let o = bin().args(args).output().unwrap();
        (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            o.status.code(),
        )
    };
    let predict = [
        "predict", "--sweep", "40", "--free", "12", "--format", "json",
    ];
    let (f, cf) = out(&[&predict[..], &["--gguf", path]].concat());
    let (p, cp) = out(&[&predict[..], &["--model", "phi3-mini"]].concat());
    assert_eq!((f, cf), (p, cp));
    let run = [
        "run", "--device", "sim", "--pool", "legacy", "--purge", "never", "--format", "csv",
    ];
    let (f, cf) = out(&[&run[..], &["--gguf", path]].concat());
    let (p, cp) = out(&[&run[..], &["--model", "phi3-mini"]].concat());
    assert_eq!(cf, cp);
    // The CSV's rows name the model first and end with the ubatch's wall time.
    let rows = |s: &str| -> Vec<String> {
        s.lines()
            .skip(1)
            .map(|l| {
                let l = l.split_once(',').map_or(l, |(_, r)| r);
                l.rsplit_once(',').map_or(l, |(r, _)| r).to_string()
            })
            .collect()
    };
    assert!(!rows(&f).is_empty());
    assert_eq!(rows(&f), rows(&p));
    for path in [phi, llama] {
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn the_options_a_file_replaces_are_refused_beside_it() {
    let phi = file("phi3-conflict.gguf", &phi3(), F16);
    let path = phi.to_str().unwrap();
    for (cmd, other) in [
        ("plan", ["--model", "llama3-8b"]),
        ("plan", ["--weight-type", "q8_0"]),
        ("plan", ["--n-layer", "4"]),
        ("run", ["--model", "llama3-8b"]),
        ("predict", ["--model", "llama3-8b"]),
        ("predict", ["--weight-type", "q8_0"]),
    ] {
        let o = bin()
            .args([cmd, "--gguf", path])
            .args(other)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd} {other:?}: {err}");
        assert!(
            err.contains("--gguf") && err.contains(other[0]),
            "{cmd} {other:?}: {err}"
        );
    }
    std::fs::remove_file(phi).unwrap();
}

#[test]
fn a_bad_file_is_refused_with_the_reader_s_error() {
    let bad = tmp("not-a-model.gguf");
    std::fs::write(&bad, b"GGML not a gguf file at all").unwrap();
    let missing = tmp("missing.gguf");
    for path in [&bad, &missing] {
        for cmd in ["plan", "predict", "run"] {
            let o = bin()
                .args([cmd, "--gguf", path.to_str().unwrap()])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(err.contains("--gguf") && err.contains(name), "{err}");
        }
    }
    // The reader's own words: what it found where, and what it accepts.
    let reader = cupool::gguf::GgufModel::read(&bad).unwrap_err().to_string();
    let o = bin()
        .args(["plan", "--gguf", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains(&reader));
    std::fs::remove_file(bad).unwrap();
}
