//! The workspace's shape, checked: no import circle between modules and no source file over
//! 400 lines (docs/architecture.md).
//!
//! Modules are files. A reference from one module to another (`use crate::a::b`, `super::x`,
//! an inline `crate::a::f()`, a `use` of a child module) is lifted to the two siblings under
//! their closest common parent, so `engine/ubatch.rs` using `profiled.rs` counts as
//! `engine → profiled`; references between a module and its own ancestors or descendants are
//! not edges (a parent declares its children; they use what it defines). Every parent's
//! children must form a graph without a cycle.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a non-test source file may have.
const MAX_LINES: usize = 400;
/// A longer file says why in a line that starts with this, near its top.
const EXCEPTION: &str = "//! Longer than 400 lines because";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `src` folders of every crate in the workspace (and of the fuzz targets' crate).
fn crate_sources() -> Vec<PathBuf> {
    let mut out = vec![root().join("src")];
    for entry in std::fs::read_dir(root()).unwrap() {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            out.push(dir.join("src"));
        }
    }
    out.sort();
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A file's module path inside its crate: `engine/mod.rs` → `[engine]`, `lib.rs` → `[]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The text without comments and string literals (so paths in docs and messages are not
/// references).
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            // A raw string (r"..", r#".."#) ends at its own delimiter; an ordinary one at an
            // unescaped quote.
            let raw_hashes = {
                let mut j = i;
                let mut n = 0;
                while j > 0 && b[j - 1] == b'#' {
                    j -= 1;
                    n += 1;
                }
                (j > 0 && b[j - 1] == b'r').then_some(n)
            };
            i += 1;
            match raw_hashes {
                Some(n) => {
                    let end: Vec<u8> = std::iter::once(b'"')
                        .chain(std::iter::repeat_n(b'#', n))
                        .collect();
                    while i < b.len() && !b[i..].starts_with(&end) {
                        i += 1;
                    }
                    i += end.len();
                }
                None => {
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
            }
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\n'); lifetimes ('a) are left alone.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The code outside `#[cfg(test)]` modules: tests may reach anywhere.
fn without_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // Skip the item: to the end of its braces, or of its `;`.
        let open = after.find('{');
        let semi = after.find(';');
        match (open, semi) {
            (Some(o), Some(s)) if s < o => rest = &after[s + 1..],
            (Some(o), _) => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, c) in after[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            _ => rest = "",
        }
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands a `use` tree (`a::{b::C, d}`) into its paths.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    fn go(prefix: &[String], t: &str, out: &mut Vec<Vec<String>>) {
        if let Some(open) = t.find('{') {
            let head: Vec<String> = t[..open]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let mut base = prefix.to_vec();
            base.extend(head);
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&base, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            go(&base, &inner[start..], out);
        } else if !t.is_empty() {
            let mut p = prefix.to_vec();
            p.extend(
                t.split(" as ")
                    .next()
                    .unwrap()
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], &tree, &mut out);
    out
}

/// Every path a module names: its `use` trees, and inline `crate::`, `super::` and `self::`
/// paths.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` statements (any visibility).
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let ok_before = at == 0 || !is_ident(rest[..at].chars().last().unwrap());
        let after = &rest[at + 4..];
        if ok_before {
            let end = after.find(';').unwrap_or(after.len());
            out.extend(expand_use(&after[..end]));
            rest = &after[end..];
        } else {
            rest = after;
        }
    }
    // Inline paths.
    for key in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(at) = rest.find(key) {
            let ok_before = at == 0 || !is_ident(rest[..at].chars().last().unwrap());
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(is_ident(c) || c == ':'))
                .unwrap_or(tail.len());
            if ok_before {
                out.push(
                    tail[..len]
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                );
            }
            rest = &tail[len.max(1)..];
        }
    }
    out
}

/// Resolves `path`, named in module `from`, to the longest known module it points into.
fn resolve(
    from: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("super") | Some("self") => {
            base = from.to_vec();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "super" => {
                        base.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A `use` of a child module (2018 paths are relative to the module).
            let mut child = from.to_vec();
            child.push(first.to_string());
            if !modules.contains(&child) {
                return None;
            }
            base = from.to_vec();
        }
        None => return None,
    }
    let mut best = None;
    for seg in rest {
        base.push(seg.clone());
        if modules.contains(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

/// A cycle in `edges` (over `nodes`), if any.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The sibling edges of one crate: for each parent module, `child → child` edges.
fn sibling_edges(src: &Path) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let files: Vec<(Vec<String>, PathBuf)> = files
        .into_iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "tests"))
        .map(|f| (module_of(src, &f), f))
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, file) in &files {
        let code = without_test_modules(&code_of(&std::fs::read_to_string(file).unwrap()));
        for path in paths_in(&code) {
            let Some(to) = resolve(from, &path, &modules) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // an ancestor or a descendant
            }
            graph
                .entry(from[..common].to_vec())
                .or_default()
                .entry(from[common].clone())
                .or_default()
                .insert(to[common].clone());
        }
    }
    graph
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mut circles = Vec::new();
    for src in crate_sources() {
        for (parent, edges) in sibling_edges(&src) {
            if let Some(cycle) = find_cycle(&edges) {
                let krate = src.parent().unwrap().file_name().unwrap().to_string_lossy();
                circles.push(format!(
                    "{krate} {}: {}",
                    parent.join("::"),
                    cycle.join(" → ")
                ));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_check_finds_a_circle() {
    // Two siblings that use each other, through a `use` group and an inline path.
    let dir = std::env::temp_dir().join(format!("cupool-arch-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\n").unwrap();
    std::fs::write(dir.join("a/inner.rs"), "use crate::{b::B, x};\n").unwrap();
    std::fs::write(
        dir.join("b.rs"),
        "// crate::a in a comment is no reference\nfn f() { crate::a::g(); }\n",
    )
    .unwrap();
    let edges = sibling_edges(&dir);
    let cycle = find_cycle(&edges[&Vec::<String>::new()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(cycle, Some(vec!["a".into(), "b".into(), "a".into()]));
}

#[test]
fn no_source_file_is_over_400_lines() {
    let mut long = Vec::new();
    for src in crate_sources() {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            if f.components().any(|c| c.as_os_str() == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let n = text.lines().count();
            let excused = text.lines().take(20).any(|l| l.starts_with(EXCEPTION));
            if n > MAX_LINES && !excused {
                long.push(format!(
                    "{} has {n} lines",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(long.is_empty(), "split these by idea:\n{}", long.join("\n"));
}

/// The `a|b|c` lists of names in the docs and the command line's sources (markdown escapes
/// the bars as `\|`).
fn bar_lists(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.replace("\\|", "|");
        for run in line.split(|c: char| !(c.is_ascii_alphanumeric() || "_-|.".contains(c))) {
            let names: Vec<String> = run
                .split('|')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if names.len() >= 2 && run.contains('|') {
                out.push(names);
            }
        }
    }
    out
}

/// Adding an engine profile: every list of engine names in the README, the docs and the CLI
/// names it, and the profiles' table in docs/repro-prefill.md has its row.
#[test]
fn every_list_of_engines_names_every_profile() {
    use cupool::profiles::Profile;
    // As the command line spells them (`ik-llama` for `ik_llama`).
    let names: Vec<String> = Profile::ALL
        .iter()
        .map(|p| p.name().replace('_', "-"))
        .collect();
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "cli/src"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "md" || e == "rs") {
                files.push(p);
            }
        }
    }
    let mut stale = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for list in bar_lists(&text) {
            let named = names
                .iter()
                .filter(|n| list.iter().any(|l| l == *n))
                .count();
            if named >= 2 && named < names.len() {
                stale.push(format!("{}: {}", f.display(), list.join("|")));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "lists missing an engine profile:\n{}",
        stale.join("\n")
    );
    let table = std::fs::read_to_string(root().join("docs/repro-prefill.md")).unwrap();
    for n in &names {
        assert!(
            table.contains(&format!("| `{n}`")),
            "docs/repro-prefill.md has no row for the {n} profile"
        );
    }
}
