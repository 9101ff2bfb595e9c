//! `--plot`: the legend says what the table says, and a run that died is marked where it died.

mod common;

use common::{bin, tmp};

/// The table's rows: configuration, outcome, peak reserved (`840.0 MiB`).
fn table_rows(table: &str) -> Vec<(String, String, String)> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("configuration"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let label = l[..22].trim().to_string();
            let outcome = l[23..43].trim().to_string();
            let cols: Vec<&str> = l[43..].split_whitespace().collect();
            // peak live (2 words), then peak reserved (2 words).
            (label, outcome, format!("{} {}", cols[2], cols[3]))
        })
        .collect()
}

/// The SVG's text elements.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(body.split("</text>").next()?.trim().to_string())
        })
        .collect()
}

#[test]
fn the_legend_s_peaks_and_outcomes_are_the_table_s() {
    let svg = tmp("legend.svg");
    let out = bin()
        .args([
            "--device",
            "sim",
            "--quiet",
            "--plot",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8(out.stdout).unwrap();
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 6, "{table}");
    let texts = texts(&std::fs::read_to_string(&svg).unwrap());
    for (label, outcome, peak) in &rows {
        let line = texts
            .iter()
            .find(|t| t.starts_with(&format!("{label}: reserve")))
            .unwrap_or_else(|| panic!("no legend line for {label}: {texts:?}"));
        assert!(
            line.contains(&format!("peak {peak},")),
            "{label}: the table says {peak}, the legend {line}"
        );
        match outcome.strip_prefix("OOM at token ") {
            Some(t) => {
                assert!(line.contains(&format!("OOM at token {t}")), "{line}");
                // ...and the plot marks it where it happened, named.
                let mark = format!("{label}: OOM at token {t}");
                assert!(texts.iter().any(|x| x == &mark), "{mark}: {texts:?}");
            }
            None => assert!(line.ends_with("completes"), "{outcome}: {line}"),
        }
    }
    // The scenario's legacy/never dies: the comparison is of no use without it.
    assert!(rows.iter().any(|r| r.1.starts_with("OOM")), "{table}");
}
