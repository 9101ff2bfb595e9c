//! docs/repro-prefill.md's examples are the binary's real output: every `text` block that opens
//! with one `$ repro-prefill ...` line is run (on the simulated device) and its stdout compared
//! with the lines that follow.

mod common;

use common::bin;

/// The documented examples: (the command's arguments, the output shown).
fn examples(doc: &str) -> Vec<(Vec<String>, String)> {
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
        out.push((args, output.join("\n")));
    }
    out
}

#[test]
fn every_documented_example_prints_what_the_docs_show() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/repro-prefill.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let examples = examples(&doc);
    assert!(examples.len() >= 4, "{} examples", examples.len());
    for (args, shown) in examples {
        let mut c = bin();
        c.args(&args);
        // A plan or a run reads the device: the docs show the simulated one.
        if args[0] != "predict" && args[0] != "replay" {
            c.args(["--device", "sim"]);
        }
        let out = c.output().unwrap();
        let got = String::from_utf8_lossy(&out.stdout);
        let trim = |s: &str| s.lines().map(str::trim_end).collect::<Vec<_>>().join("\n");
        assert_eq!(trim(&got), trim(&shown), "repro-prefill {}", args.join(" "));
    }
}
