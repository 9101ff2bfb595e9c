//! What `--help` lists is what the commands accept: every output format a subcommand lists
//! gives that format, and every engine listed runs.

mod common;

use common::{bin, tmp};
use std::process::Output;

/// The values `--help` of `sub` lists for `opt`: from `[possible values: a, b]`, or from the
/// `- a: ...` lines of a long help.
fn listed(sub: &str, opt: &str) -> Vec<String> {
    let out = bin().args([sub, "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = help.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{opt} <")))
        .unwrap_or_else(|| panic!("{sub} --help has no {opt}:\n{help}"));
    let mut values = Vec::new();
    for (i, line) in lines[start..].iter().enumerate() {
        let t = line.trim_start();
        if i > 0 && (t.starts_with("--") || t.starts_with("-h,")) {
            break;
        }
        if let Some(rest) = line.split("[possible values: ").nth(1) {
            let list = rest.trim_end().trim_end_matches(']');
            values.extend(list.split(", ").map(str::to_string));
        } else if let Some(item) = t.strip_prefix("- ") {
            values.push(item.split(':').next().unwrap().trim().to_string());
        }
    }
    assert!(!values.is_empty(), "{sub} --help lists no values of {opt}");
    values
}

/// The command's output; it must have ended as a command that ran (0, or 3: does not fit).
fn ran(args: &[&str]) -> Output {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{args:?} exited {:?}: {err}",
        out.status.code()
    );
    assert!(!out.stdout.is_empty(), "{args:?} printed nothing");
    out
}

/// A header line and rows of as many fields, each row with a number in it.
fn assert_csv(args: &[&str], text: &str) {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let columns = header.split(',').count();
    assert!(columns > 3, "{args:?}: not a CSV header: {header}");
    assert!(
        header.split(',').all(|c| !c.is_empty() && !c.contains(' ')),
        "{args:?}: {header}"
    );
    let rows: Vec<&str> = lines.collect();
    assert!(!rows.is_empty(), "{args:?}: no rows");
    for r in rows {
        assert_eq!(r.split(',').count(), columns, "{args:?}: {r}");
        assert!(r.chars().any(|c| c.is_ascii_digit()), "{args:?}: {r}");
    }
}

#[test]
fn every_format_a_subcommand_lists_is_the_format_it_prints() {
    let trace = tmp("formats.jsonl");
    ran(&[
        "predict",
        "--prompt",
        "4096",
        "--trace-out",
        trace.to_str().unwrap(),
    ]);
    let commands: [(&str, Vec<&str>); 4] = [
        (
            "run",
            vec!["run", "--device", "sim", "--pool", "vmm", "--quiet"],
        ),
        ("plan", vec!["plan", "--device", "sim"]),
        ("predict", vec!["predict", "--prompt", "4096"]),
        ("replay", vec!["replay", trace.to_str().unwrap()]),
    ];
    for (sub, args) in commands {
        let formats = listed(sub, "--format");
        let mut outputs = Vec::new();
        for f in &formats {
            let args = [&args[..], &["--format", f]].concat();
            let text = String::from_utf8(ran(&args).stdout).unwrap();
            match f.as_str() {
                "json" => {
                    serde_json::from_str::<serde_json::Value>(&text)
                        .unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"));
                }
                "csv" => assert_csv(&args, &text),
                "table" => {}
                other => panic!("{sub} lists a format this test does not know: {other}"),
            }
            outputs.push(text);
        }
        // Each format its own: none prints another's output.
        for (i, a) in outputs.iter().enumerate() {
            for b in &outputs[i + 1..] {
                assert_ne!(a, b, "{sub}: two formats print the same:\n{a}");
            }
        }
    }
}

#[test]
fn every_engine_a_subcommand_lists_runs() {
    for (sub, args) in [
        ("predict", &["predict", "--prompt", "4096"][..]),
        ("plan", &["plan", "--device", "sim", "--prompt", "4096"]),
    ] {
        for e in listed(sub, "--engine") {
            ran(&[args, &["--engine", &e]].concat());
        }
    }
    // predict models an engine's requests: cupool's own runtime is `run`'s, and not listed.
    assert!(!listed("predict", "--engine").contains(&"cupool".to_string()));
}
