//! The examples of docs/repro-prefill.md and docs/runtime.md are the binary's real output: every
//! `text` block that opens with one `$ repro-prefill ...` line is run (on the simulated device)
//! and its stdout compared with the lines that follow; a command line ending in
//! `2>&1 >/dev/null` shows the log instead (stderr, `RUST_LOG=warn`). A table's time column
//! (`0.00s`) is not compared: it is the one figure that depends on the machine. A `--gguf NAME`
//! example reads a file the test writes under that name (the profiles' test writer: the
//! preset's metadata and tensor infos, its data a hole). `CUPOOL_BLESS=1` writes the binary's
//! output into the docs instead of comparing.

mod common;
#[path = "../../profiles/tests/gguf/mod.rs"]
mod gguf;

use common::{bin, same_picture, tmp};
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

/// What a documented command line shows: its stdout, or with `2>&1 >/dev/null` its log.
const LOG_ONLY: &str = " 2>&1 >/dev/null";

/// A documented example: the command line as written, its arguments, the output shown, and the
/// commands before it in the same block (a trace written, then replayed), run first.
struct Example {
    line: String,
    args: Vec<String>,
    shown: String,
    before: Vec<Vec<String>>,
}

/// A command line's arguments, without the shell's redirection.
fn arguments(cmd: &str) -> Vec<String> {
    cmd.trim_end_matches(LOG_ONLY)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The documented examples, in the doc's order.
fn examples(doc: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("```text\n") {
        let body = &rest[at + 8..];
        let end = body.find("```").expect("a closed block");
        let block = &body[..end];
        rest = &body[end + 3..];
        let lines: Vec<&str> = block.lines().collect();
        let commands: Vec<&str> = lines
            .iter()
            .map_while(|l| l.strip_prefix("$ repro-prefill "))
            .collect();
        let Some((cmd, before)) = commands.split_last() else {
            continue;
        };
        let output = &lines[commands.len()..];
        if output.iter().any(|l| l.starts_with("$ ")) {
            // Another program's command in the block: not compared.
            continue;
        }
        out.push(Example {
            line: cmd.to_string(),
            args: arguments(cmd),
            shown: output.join("\n"),
            before: before.iter().map(|c| arguments(c)).collect(),
        });
    }
    out
}

/// A line with its time column (a last word like `0.00s`) masked.
fn untimed(line: &str) -> String {
    let line = line.trim_end();
    match line.rsplit_once(' ') {
        Some((head, last))
            if last.strip_suffix('s').is_some_and(|t| {
                t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.')
            }) =>
        {
            format!("{head} (time)")
        }
        _ => line.to_string(),
    }
}

/// Runs every example of the doc at `rel` (from the workspace root) and compares, or with
/// `CUPOOL_BLESS=1` writes the output into the doc. Returns how many examples it ran.
fn check(rel: &str) -> usize {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap();
    let examples = examples(&doc);
    let count = examples.len();
    let bless = std::env::var("CUPOOL_BLESS").is_ok_and(|v| v == "1");
    let mut blessed = doc.clone();
    // Files an example names without a folder (a trace) are written here.
    let dir = tmp("docs");
    std::fs::create_dir_all(&dir).unwrap();
    // A plan or a run reads the device: the docs show the simulated one.
    let command = |args: &[String]| {
        let mut c = bin();
        c.current_dir(&dir).args(args);
        if args[0] != "predict" && args[0] != "replay" && !args.iter().any(|a| a == "--device") {
            c.args(["--device", "sim"]);
        }
        c
    };
    for Example {
        line,
        mut args,
        shown,
        before,
    } in examples
    {
        for b in &before {
            let out = command(b).output().unwrap();
            assert!(out.status.success(), "{rel}: repro-prefill {}", b.join(" "));
        }
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
        let mut c = command(&args);
        let log_only = line.ends_with(LOG_ONLY);
        if log_only {
            c.env("RUST_LOG", "warn");
        }
        let out = c.output().unwrap();
        let got = String::from_utf8_lossy(if log_only { &out.stderr } else { &out.stdout });
        let trim = |s: &str| s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n");
        let mask = |s: &str| s.lines().map(untimed).collect::<Vec<_>>().join("\n");
        if bless {
            let was = format!("$ repro-prefill {line}\n{shown}");
            let now = format!("$ repro-prefill {line}\n{}", trim(&got));
            blessed = blessed.replacen(&was, &now, 1);
        } else {
            assert_eq!(mask(&got), mask(&shown), "{rel}: repro-prefill {line}");
        }
        for path in written {
            std::fs::remove_file(path).unwrap();
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    if bless && blessed != doc {
        std::fs::write(&path, blessed).unwrap();
    }
    count
}

#[test]
fn every_documented_example_prints_what_the_docs_show() {
    let n = check("docs/repro-prefill.md");
    assert!(n >= 6, "{n} examples in docs/repro-prefill.md");
    let n = check("docs/runtime.md");
    assert!(n >= 1, "{n} examples in docs/runtime.md");
}

/// The timeline picture in docs/repro-prefill.md is the plot its command draws now, byte for
/// byte (`CUPOOL_BLESS=1` redraws it).
#[test]
fn the_documented_timeline_is_what_its_command_draws() {
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(format!("{root}/docs/repro-prefill.md")).unwrap();
    let args = ["--device", "sim", "--vram", "12", "--plot"];
    let shown = format!("`repro-prefill {}", args.join(" "));
    assert!(
        doc.contains(&shown),
        "docs/repro-prefill.md names `{shown} …`"
    );
    let dir = tmp("docs-plot");
    std::fs::create_dir_all(&dir).unwrap();
    let drawn = dir.join("timeline.png");
    let out = bin().args(args).arg(&drawn).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    same_picture(
        "docs/img/repro-prefill-sim-vram12.png",
        &drawn,
        "repro-prefill --device sim --vram 12 --plot timeline.png",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The GPU run docs/runtime.md shows is its raw output under data/, and the simulated card
/// prints the same table for the same scenario: every row, the time column aside.
#[test]
fn the_simulation_equals_the_documented_gpu_run() {
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let gpu = std::fs::read_to_string(format!(
        "{root}/data/h100-2026-11-25-readme-command/readme-command.txt"
    ))
    .unwrap();
    let doc = std::fs::read_to_string(format!("{root}/docs/runtime.md")).unwrap();
    assert!(
        doc.contains(&format!("```text\n{}\n```", gpu.trim_end())),
        "docs/runtime.md shows the GPU run as data/h100-2026-11-25-readme-command/readme-command.txt has it"
    );
    let out = bin()
        .args(["--device", "sim", "--vram", "12"])
        .output()
        .unwrap();
    let sim = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(" MiB ") && !l.contains(':'))
            .map(untimed)
            .collect()
    };
    assert_eq!(rows(&gpu).len(), 6, "{gpu}");
    assert_eq!(rows(&sim), rows(&gpu));
}
