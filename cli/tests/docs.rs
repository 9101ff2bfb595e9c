//! docs/repro-prefill.md's examples are the binary's real output: every `text` block that opens
//! with one `$ repro-prefill ...` line is run (on the simulated device) and its stdout compared
//! with the lines that follow. A `--gguf NAME` example reads a file the test writes under that
//! name (the profiles' test writer: the preset's metadata and tensor infos, its data a hole).
//! `CUPOOL_BLESS=1` writes the binary's output into the docs instead of comparing.

mod common;
#[path = "../../profiles/tests/gguf/mod.rs"]
mod gguf;

use common::{bin, tmp};
use gguf::models::{write, Dims};
use gguf::writer::{F16, Q8_0};

/// The GGUF file a documented example names, written in this test's temporary folder.
fn model_file(name: &str) -> String {
    let (dims, ty) = match name {
        "phi3-mini-f16.gguf" => (
            Dims::dense("phi3", [32, 3072, 32, 32, 96, 8192, 32064]),
            F16,
        ),
        "llama3-8b-q8_0.gguf" => (
            Dims::dense("llama", [32, 4096, 32, 8, 128, 14336, 128256]),
            Q8_0,
        ),
        _ => panic!("the docs name a GGUF file this test cannot write: {name}"),
    };
    let (header, len) = write(&dims, ty, true).header();
    let path = tmp(name);
    std::fs::write(&path, &header).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len).unwrap();
    path.to_str().unwrap().to_string()
}

/// The documented examples: (the command line as written, its arguments, the output shown).
fn examples(doc: &str) -> Vec<(String, Vec<String>, String)> {
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("```text\n") {
        let body = &rest[at + 8..];
        let end = body.find("```").expect("a closed block");
        let block = &body[..end];
        rest = &body[end + 3..];
        let mut lines = block.lines();
        let Some(cmd) = lines
            .next()
            .and_then(|l| l.strip_prefix("$ repro-prefill "))
        else {
            continue;
        };
        let output: Vec<&str> = lines.collect();
        if output.iter().any(|l| l.starts_with("$ ")) {
            // Several commands in one block (a trace written, then replayed): not compared.
            continue;
        }
        let args = cmd.split_whitespace().map(str::to_string).collect();
        out.push((cmd.to_string(), args, output.join("\n")));
    }
    out
}

#[test]
fn every_documented_example_prints_what_the_docs_show() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/repro-prefill.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let examples = examples(&doc);
    assert!(examples.len() >= 4, "{} examples", examples.len());
    let bless = std::env::var("CUPOOL_BLESS").is_ok_and(|v| v == "1");
    let mut blessed = doc.clone();
    for (line, mut args, shown) in examples {
        let files: Vec<String> = args
            .windows(2)
            .filter(|w| w[0] == "--gguf")
            .map(|w| w[1].clone())
            .collect();
        let mut written = Vec::new();
        for name in files {
            let path = model_file(&name);
            for a in args.iter_mut().filter(|a| **a == name) {
                *a = path.clone();
            }
            written.push(path);
        }
        let mut c = bin();
        c.args(&args);
        // A plan or a run reads the device: the docs show the simulated one.
        if args[0] != "predict" && args[0] != "replay" {
            c.args(["--device", "sim"]);
        }
        let out = c.output().unwrap();
        let got = String::from_utf8_lossy(&out.stdout);
        let trim = |s: &str| s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n");
        if bless {
            let was = format!("$ repro-prefill {line}\n{shown}");
            let now = format!("$ repro-prefill {line}\n{}", trim(&got));
            blessed = blessed.replacen(&was, &now, 1);
        } else {
            assert_eq!(trim(&got), trim(&shown), "repro-prefill {}", args.join(" "));
        }
        for path in written {
            std::fs::remove_file(path).unwrap();
        }
    }
    if bless && blessed != doc {
        std::fs::write(path, blessed).unwrap();
    }
}
