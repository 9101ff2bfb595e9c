// The settings table against everything that repeats it: the C function's JSON, libcupool's
// own defaults, the README's table and the shim header's list (generated from the table:
// `CUPOOL_BLESS=1` rewrites them), the Python package's keywords, every variable the front
// ends and docs name, and every list of pool kinds in the tree.
use crate::config::{Config, Devices};
use crate::cupool_settings_json;
use cupool_pool::settings::{self, FrontEnd, Setting, SETTINGS};
use cupool_pool::{AutoHeadroom, PoolConfig, PoolKind, PurgePolicy};
use std::ffi::CStr;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Replaces the lines between the line starting with `begin` and the line starting with `end`
/// in `rel` with `fresh`, or fails when they differ (unless `CUPOOL_BLESS` is set).
fn generated(rel: &str, begin: &str, end: &str, fresh: &str) {
    let text = read(rel);
    let at = |marker: &str, from: usize| {
        text[from..]
            .find(&format!("\n{marker}"))
            .map(|i| from + i + 1)
            .unwrap_or_else(|| panic!("{rel} has no line starting with {marker:?}"))
    };
    let b = at(begin, 0);
    let start = b + text[b..].find('\n').expect("the begin line ends") + 1;
    let stop = at(end, start - 1);
    if text[start..stop] == *fresh {
        return;
    }
    if std::env::var_os("CUPOOL_BLESS").is_some() {
        let out = format!("{}{fresh}{}", &text[..start], &text[stop..]);
        std::fs::write(root().join(rel), out).expect("write the generated block");
        return;
    }
    panic!("{rel}: the settings block is stale: regenerate it with `CUPOOL_BLESS=1 cargo test -p cupool-capi settings`");
}

/// The front ends that read `s`, grouped by default: `library, cli: off; libcupool: 2097152`.
fn defaults(s: &Setting) -> String {
    let mut groups: Vec<(Vec<&str>, &str)> = Vec::new();
    for r in s.read_by {
        assert!(!r.default.contains(';'), "{}: a default holds ';'", s.name);
        match groups.iter_mut().find(|(_, d)| *d == r.default) {
            Some((names, _)) => names.push(r.front_end.name()),
            None => groups.push((vec![r.front_end.name()], r.default)),
        }
    }
    let groups: Vec<String> = groups
        .iter()
        .map(|(names, d)| format!("{}: {d}", names.join(", ")))
        .collect();
    groups.join("; ")
}

fn values(s: &Setting, sep: &str) -> String {
    match s.accepts.choices() {
        c if c.is_empty() => s.accepts.describe(),
        c => format!("`{}`", c.join(sep)),
    }
}

fn readme_table() -> String {
    let mut out = String::from(
        "| variable | values | unset (by front end) | Python keyword | meaning |\n|---|---|---|---|---|\n",
    );
    for s in SETTINGS {
        let keyword = s.keyword.map(|k| format!("`{k}=`")).unwrap_or_default();
        let row = [
            format!("`{}`", s.name),
            values(s, "|"),
            defaults(s),
            keyword,
            s.doc.to_string(),
        ]
        .map(|cell| cell.replace('|', "\\|"));
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// The settings llama.cpp's shim and the libcupool it opens read, a comment wrapped at 100
/// columns: `NAME=VALUES: what it does. Unset: the default.`
fn shim_list() -> String {
    let mut out = String::new();
    for s in SETTINGS
        .iter()
        .filter(|s| s.is_read_by(FrontEnd::Shim) || s.is_read_by(FrontEnd::Libcupool))
    {
        let default = s
            .default_for(FrontEnd::Shim)
            .or(s.default_for(FrontEnd::Libcupool))
            .unwrap_or_default();
        let values = match s.accepts.choices() {
            c if c.is_empty() => format!(" ({})", s.accepts.describe()),
            c => format!("={}", c.join("|")),
        };
        let text = format!("{}{values}: {}. Unset: {default}.", s.name, s.doc).replace('`', "");
        let mut line = String::from("//  ");
        for word in text.split(' ') {
            if line.len() + 1 + word.len() > 100 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("//      ");
            }
            line.push(' ');
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn the_readme_table_and_the_shim_header_are_generated_from_the_table() {
    generated(
        "README.md",
        "<!-- settings: begin",
        "<!-- settings: end",
        &readme_table(),
    );
    generated(
        "ggml/ggml-cupool.h",
        "// Environment (generated",
        "// (end of the generated list)",
        &shim_list(),
    );
}

#[test]
fn the_c_function_returns_the_table_as_json() {
    let p = cupool_settings_json();
    assert!(!p.is_null());
    assert_eq!(p, cupool_settings_json(), "one static string");
    // SAFETY: a NUL-terminated string valid for the process.
    let text = unsafe { CStr::from_ptr(p) }.to_str().unwrap();
    assert_eq!(text, settings::json());
    let v: serde_json::Value = serde_json::from_str(text).expect("valid JSON");
    let rows = v["settings"].as_array().unwrap();
    assert_eq!(rows.len(), SETTINGS.len());
    let pool = rows.iter().find(|r| r["name"] == "GGML_POOL").unwrap();
    let kinds: Vec<_> = PoolKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(pool["choices"], serde_json::json!(kinds));
    assert_eq!(pool["keyword"], "pool");
    let purge = rows.iter().find(|r| r["name"] == "CUPOOL_PURGE").unwrap();
    assert_eq!(purge["defaults"]["libcupool"], "auto");
    assert_eq!(purge["read_by"], serde_json::json!(["libcupool"]));
}

#[test]
fn libcupool_names_and_defaults_are_the_table_s() {
    let names: Vec<_> = crate::config::names().collect();
    let expected: Vec<_> = SETTINGS
        .iter()
        .filter(|s| s.is_read_by(FrontEnd::Libcupool) && !s.env_only)
        .map(|s| s.name)
        .collect();
    assert_eq!(names, expected);
    assert!(names.starts_with(cupool_pool::config::ENV_NAMES));
    let default = |name: &str, front_end| {
        settings::setting(name)
            .and_then(|s| s.default_for(front_end))
            .unwrap_or_else(|| panic!("{name} has no default for {front_end:?}"))
    };
    let number = |name: &str, front_end| -> usize {
        let d = default(name, front_end);
        d.split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {d}"))
    };
    let c = Config::parse(Some("")).unwrap();
    assert_eq!(
        Some(c.purge),
        PurgePolicy::parse(default("CUPOOL_PURGE", FrontEnd::Libcupool))
    );
    assert_eq!(
        Some(c.headroom),
        AutoHeadroom::parse(default("CUPOOL_AUTO_HEADROOM", FrontEnd::Libcupool))
    );
    let (gib, count) = (
        number("CUPOOL_SIM_GIB", FrontEnd::Libcupool),
        number("CUPOOL_SIM_DEVICES", FrontEnd::Libcupool),
    );
    assert_eq!(default("CUPOOL_DEVICE", FrontEnd::Libcupool), "auto");
    assert_eq!(
        c.devices,
        Devices::Auto {
            gib: gib as f64,
            count
        }
    );
    assert_eq!(
        c.pool.vmm.large_rounding,
        number("CUPOOL_VMM_ROUND_LARGE", FrontEnd::Libcupool)
    );
    assert_eq!(
        c.pool.size_classes,
        [number("CUPOOL_SIZE_CLASSES", FrontEnd::Libcupool)]
    );
    assert!(c.pool.vmm.recycle);
    assert!(default("CUPOOL_VMM_RECYCLE", FrontEnd::Libcupool).starts_with("on "));
    assert_eq!(
        c.pool.vmm.recycle_free as usize,
        number("CUPOOL_VMM_RECYCLE_FREE", FrontEnd::Libcupool)
    );
    assert_eq!(
        PoolConfig::default().vmm.recycle_free as usize,
        number("CUPOOL_VMM_RECYCLE_FREE", FrontEnd::Library)
    );
    let two = Config::parse(Some("CUPOOL_VMM_RECYCLE_FREE=2")).unwrap();
    assert_eq!(two.pool.vmm.recycle_free, 2);
    for bad in ["101", "-1", "six", ""] {
        let e = Config::parse(Some(&format!("CUPOOL_VMM_RECYCLE_FREE={bad}")))
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"))
            .text;
        assert!(
            e.contains("CUPOOL_VMM_RECYCLE_FREE") && e.contains("a percent from 0 to 100"),
            "{e}"
        );
    }
    // The page size, in MiB (the table's defaults are the library's, in MiB).
    assert_eq!(
        c.pool.vmm.recycle_page >> 20,
        number("CUPOOL_VMM_RECYCLE_PAGE", FrontEnd::Libcupool)
    );
    assert_eq!(
        PoolConfig::default().vmm.recycle_page >> 20,
        number("CUPOOL_VMM_RECYCLE_PAGE", FrontEnd::Library)
    );
    let big = Config::parse(Some("CUPOOL_VMM_RECYCLE_PAGE=64")).unwrap();
    assert_eq!(big.pool.vmm.recycle_page, 64 << 20);
    for bad in ["0", "1025", "-8", "8MiB", ""] {
        let e = Config::parse(Some(&format!("CUPOOL_VMM_RECYCLE_PAGE={bad}")))
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"))
            .text;
        assert!(
            e.contains("CUPOOL_VMM_RECYCLE_PAGE") && e.contains("a number of MiB from 1 to 1024"),
            "{e}"
        );
    }
    let lib = PoolConfig::default();
    assert!(!lib.vmm.recycle);
    assert_eq!(default("CUPOOL_VMM_RECYCLE", FrontEnd::Library), "off");
    assert_eq!(
        lib.vmm.large_rounding,
        number("CUPOOL_VMM_ROUND_LARGE", FrontEnd::Library)
    );
    assert_eq!(default("CUPOOL_SIZE_CLASSES", FrontEnd::Library), "none");
    assert!(lib.size_classes.is_empty());
}

#[test]
fn the_python_keywords_are_the_table_s() {
    let text = read("python/cupool/__init__.py");
    let start = text
        .find("OPTIONS = {")
        .expect("python/cupool/__init__.py has OPTIONS");
    let block = &text[start..start + text[start..].find('}').unwrap()];
    let mut options: Vec<(String, String)> = block
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.trim().trim_end_matches(',').split_once(':')?;
            Some((
                k.trim().trim_matches('"').into(),
                v.trim().trim_matches('"').into(),
            ))
        })
        .collect();
    let mut table: Vec<(String, String)> = SETTINGS
        .iter()
        .filter(|s| s.name != "GGML_POOL")
        .filter_map(|s| Some((s.keyword?.to_string(), s.name.to_string())))
        .collect();
    options.sort();
    table.sort();
    assert_eq!(
        options, table,
        "cupool.OPTIONS against the table's keywords"
    );
    assert_eq!(
        settings::setting("GGML_POOL").unwrap().keyword,
        Some("pool")
    );
    assert!(text.contains("def config_string(pool=None"));
}

/// Files where settings are read or documented.
fn scanned() -> Vec<(String, String)> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if e.path().is_dir() {
                if name != "tests" && name != "__pycache__" {
                    walk(&e.path(), &path, out);
                }
            } else if [".rs", ".md", ".py", ".h", ".cu"]
                .iter()
                .any(|x| name.ends_with(x))
            {
                if let Ok(text) = std::fs::read_to_string(e.path()) {
                    out.push((path, text));
                }
            }
        }
    }
    let mut out = vec![("README.md".to_string(), read("README.md"))];
    for dir in [
        "docs",
        "ggml",
        "python/cupool",
        "pool/src",
        "capi/src",
        "cli/src",
        "runtime/src",
        "src",
    ] {
        walk(&root().join(dir), dir, &mut out);
    }
    out
}

/// Variables named in those files that are not settings: libcupool's C names, the engine's own
/// switches, and what only tests and benchmarks read.
const NOT_SETTINGS: &[&str] = &[
    "CUPOOL_API_VERSION",
    "CUPOOL_H",
    "CUPOOL_BLESS",
    "CUPOOL_FOOTPRINT_OUT",
    "CUPOOL_PREFILL_LAYERS",
    "CUPOOL_SKIP_NVRTC",
    "CUPOOL_REQUIRE_GPU",
    "CUPOOL_REQUIRE_TWO_GPUS",
    "CUPOOL_TWO_GPUS_DATA",
    "CUPOOL_TWO_GPUS_SUMMARY",
    "CUPOOL_IK_TWO_GPUS_DATA",
    "CUPOOL_IK_TWO_GPUS_SUMMARY",
    "CUPOOL_COMMIT",
    "CUPOOL_ENGINE_TARBALL",
    "CUPOOL_MAINLINE_TARBALL",
    "GGML_CUDA_DISABLE_GRAPHS",
    "GGML_CUDA_MAX_DEVICES",
];

#[test]
fn every_variable_the_front_ends_and_docs_name_is_in_the_table() {
    let mut stale = Vec::new();
    for (path, text) in scanned() {
        for (i, _) in text.match_indices(['G', 'C']) {
            let word: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let preceded = text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let variable = word == "GGML_POOL"
                || word.starts_with("GGML_CUDA_")
                || word.starts_with("CUPOOL_");
            if preceded || !variable || word.ends_with('_') {
                continue;
            }
            if settings::setting(&word).is_none()
                && !NOT_SETTINGS.contains(&word.as_str())
                && !word.starts_with("CUPOOL_STATUS_")
            {
                stale.push(format!("{path}: {word}"));
            }
        }
    }
    stale.dedup();
    assert!(stale.is_empty(), "not in the settings table: {stale:#?}");
    let c_api = read("docs/c-api.md");
    for name in crate::config::names() {
        assert!(
            c_api.contains(&format!("`{name}`")),
            "docs/c-api.md does not name {name}"
        );
    }
}

/// Lists of some pool kinds on purpose (what was measured), by file and text.
const PARTIAL_KIND_LISTS: &[(&str, &str)] = &[
    ("docs/benchmarks.md", "vmm | legacy | managed | vmm"),
    ("docs/pytorch.md", "vmm`, `legacy` and `torch"),
];

/// Runs of three or more different kind names joined by `|`, `,`, `/`, `or` or `and` (quotes,
/// backticks and a parenthesis after a name allowed).
fn kind_lists(line: &str) -> Vec<(String, Vec<&'static str>)> {
    let names: Vec<&'static str> = PoolKind::ALL.iter().map(|k| k.name()).collect();
    let word_at = |i: usize| {
        let boundary = line[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
        names
            .iter()
            .copied()
            .filter(|n| boundary && line[i..].starts_with(n))
            .find(|n| {
                !line[i + n.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        let Some(first) = word_at(i) else {
            i += line[i..].chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let (start, mut end, mut run) = (i, i + first.len(), vec![first]);
        loop {
            let mut j = end;
            let rest = &line[j..];
            // A parenthesis after a name: `vmm (the default), legacy`.
            let skipped = rest.trim_start_matches(['`', '\'', '"']);
            j += rest.len() - skipped.len();
            if let Some(p) = line[j..].strip_prefix(" (").and_then(|r| r.find(')')) {
                j += 2 + p + 1;
            }
            let sep_end = separator(&line[j..]).map(|n| j + n);
            match sep_end.and_then(|k| word_at(k).map(|w| (k, w))) {
                Some((k, w)) => {
                    run.push(w);
                    end = k + w.len();
                }
                None => break,
            }
        }
        let mut distinct = run.clone();
        distinct.sort();
        distinct.dedup();
        if distinct.len() >= 3 {
            out.push((line[start..end].to_string(), distinct));
        }
        i = end;
    }
    out
}

/// The length of a separator between two names at the start of `s`, quotes included.
fn separator(s: &str) -> Option<usize> {
    let quotes = |t: &str| t.len() - t.trim_start_matches(['`', '\'', '"']).len();
    let mut n = quotes(s);
    let rest = &s[n..];
    let trimmed = rest.trim_start();
    let ws = rest.len() - trimmed.len();
    let sep = ["\\|", "|", ",", "/"]
        .iter()
        .find(|p| trimmed.starts_with(**p));
    match sep {
        Some(p) => {
            n += ws + p.len();
            let after = &s[n..];
            let t = after.trim_start();
            n += after.len() - t.len();
            for w in ["or ", "and "] {
                if t.starts_with(w) {
                    n += w.len();
                }
            }
        }
        None if ws > 0 && (trimmed.starts_with("or ") || trimmed.starts_with("and ")) => {
            n += ws + trimmed.find(' ').unwrap() + 1;
        }
        None => return None,
    }
    Some(n + quotes(&s[n..]))
}

#[test]
fn every_list_of_pool_kinds_names_every_kind() {
    let all: Vec<&str> = {
        let mut v: Vec<_> = PoolKind::ALL.iter().map(|k| k.name()).collect();
        v.sort();
        v
    };
    let mut found = 0;
    let mut wrong = Vec::new();
    for (path, text) in scanned() {
        // One line, without comment markers, so that a list may wrap.
        let flat: Vec<&str> = text
            .lines()
            .map(|l| {
                l.trim_start()
                    .trim_start_matches(['/', '!', '#', '*'])
                    .trim()
            })
            .collect();
        for (list, kinds) in kind_lists(&flat.join(" ")) {
            found += 1;
            let partial = PARTIAL_KIND_LISTS
                .iter()
                .any(|(p, l)| *p == path && list == *l);
            if kinds != all && !partial {
                wrong.push(format!("{path}: {list}"));
            }
        }
    }
    assert!(found >= 5, "the scan finds the lists ({found})");
    assert!(
        wrong.is_empty(),
        "lists of pool kinds without every kind ({}): {wrong:#?}",
        all.join(", ")
    );
}

#[test]
fn the_kind_list_scanner_reads_the_house_spellings() {
    let all = 5;
    for line in [
        "GGML_POOL=vmm|legacy|managed|torch|direct every",
        "`GGML_POOL=vmm\\|legacy\\|managed\\|torch\\|direct` |",
        "accepted values are vmm, legacy, managed, torch, direct",
        "``pool`` is vmm (the default), legacy, managed, torch or direct;",
        "| `legacy` (ggml's), `vmm` (cupool's), `managed`, `torch`, `direct`; unset",
    ] {
        let lists = kind_lists(line);
        assert_eq!(lists.len(), 1, "{line}");
        assert_eq!(lists[0].1.len(), all, "{line}: {lists:?}");
    }
    assert!(kind_lists("the vmm pool, then legacy").is_empty());
    assert!(kind_lists("vmm, legacy, legacy with 4 slots").is_empty());
}

#[test]
fn vmm_recycling_follows_its_setting_and_refuses_a_bad_value() {
    let off = Config::parse(Some("CUPOOL_VMM_RECYCLE=off")).unwrap();
    assert!(!off.pool.vmm.recycle);
    let on = Config::parse(Some("CUPOOL_VMM_RECYCLE=1")).unwrap();
    assert!(on.pool.vmm.recycle);
    let err = Config::parse(Some("CUPOOL_VMM_RECYCLE=sometimes"))
        .unwrap_err()
        .text;
    assert!(
        err.contains("CUPOOL_VMM_RECYCLE") && err.contains("off"),
        "{err}"
    );
}
