//! Every setting cupool's front ends read from the environment: the one table of them.
//!
//! [`SETTINGS`] names each `GGML_POOL`, `GGML_CUDA_*` and `CUPOOL_*` variable, what it accepts,
//! which front ends read it with their default, the Python package's keyword for it and a line
//! of documentation. What reads it:
//! - [`config::ENV_NAMES`](crate::config::ENV_NAMES), the variables `PoolConfig::from_env`
//!   reads, is the table's [`FrontEnd::Library`] rows; libcupool's configuration names are its
//!   [`FrontEnd::Libcupool`] rows that are not [`Setting::env_only`];
//! - libcupool returns the table as JSON ([`json`]; `cupool_settings_json` in its C API);
//! - the README's settings table and the comment of llama.cpp's shim header are generated from
//!   it, and the Python package's keywords and every list of pool kinds are checked against
//!   it, by libcupool's tests (`CUPOOL_BLESS=1 cargo test -p cupool-capi` rewrites what is
//!   generated).
//!
//! Variables only tests, benchmarks and scripts read (`CUPOOL_BLESS`, `CUPOOL_FOOTPRINT_OUT`,
//! `CUPOOL_PREFILL_LAYERS`, the engine tarballs) are not settings and are not here.

use crate::kind::PoolKind;
use crate::purge_policy::PurgePolicy;
use std::fmt::Write as _;

mod table;
pub use table::SETTINGS;

/// A program that reads settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontEnd {
    /// The Rust library: [`PoolConfig::from_env`](crate::PoolConfig::from_env).
    Library,
    /// The `repro-prefill` command line, through `PoolConfig::from_env`.
    Cli,
    /// libcupool, the C library: `cupool_init`'s configuration string, or the environment.
    Libcupool,
    /// llama.cpp's shim (`ggml/ggml-cupool.cu`), which opens libcupool from the environment.
    Shim,
    /// The Python package (`python/cupool`), where its default is not libcupool's; it passes
    /// its keywords ([`Setting::keyword`]) to libcupool.
    Python,
}

impl FrontEnd {
    /// Every front end.
    pub const ALL: &'static [FrontEnd] = &[
        FrontEnd::Library,
        FrontEnd::Cli,
        FrontEnd::Libcupool,
        FrontEnd::Shim,
        FrontEnd::Python,
    ];

    /// Its name in the JSON and the tables.
    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Library => "library",
            FrontEnd::Cli => "cli",
            FrontEnd::Libcupool => "libcupool",
            FrontEnd::Shim => "shim",
            FrontEnd::Python => "python",
        }
    }

    const fn is(self, other: FrontEnd) -> bool {
        self as u8 == other as u8
    }
}

/// The values a setting accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepts {
    /// A boolean: `1`, `0`, `true`, `false`, `yes`, `no`, `on`, `off` (any case).
    Bool,
    /// A pool kind's name ([`PoolKind::ALL`]).
    PoolKind,
    /// A purge policy's name ([`PurgePolicy::ALL`]).
    PurgePolicy,
    /// One of these names.
    OneOf(&'static [&'static str]),
    /// A value described in words.
    Text(&'static str),
}

/// The words of [`Accepts::Bool`].
pub(crate) const BOOLS: &[&str] = &["1", "0", "true", "false", "yes", "no", "on", "off"];

impl Accepts {
    /// The names it accepts; empty for [`Accepts::Text`].
    pub fn choices(self) -> Vec<&'static str> {
        match self {
            Accepts::Bool => BOOLS.to_vec(),
            Accepts::PoolKind => PoolKind::ALL.iter().map(|k| k.name()).collect(),
            Accepts::PurgePolicy => PurgePolicy::ALL.iter().map(|p| p.name()).collect(),
            Accepts::OneOf(names) => names.to_vec(),
            Accepts::Text(_) => Vec::new(),
        }
    }

    /// In words: the choices separated by commas, or the description.
    pub fn describe(self) -> String {
        match self {
            Accepts::Text(words) => words.to_string(),
            _ => self.choices().join(", "),
        }
    }
}

/// One front end reading a setting, and what it does when the variable is unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reader {
    /// Who reads it.
    pub front_end: FrontEnd,
    /// What unset means there.
    pub default: &'static str,
}

/// One setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable (and libcupool's configuration name).
    pub name: &'static str,
    /// What it accepts.
    pub accepts: Accepts,
    /// The front ends that read it, each with its default.
    pub read_by: &'static [Reader],
    /// The Python package's keyword for it (`cupool.init(purge="never")`), if it has one.
    pub keyword: Option<&'static str>,
    /// Read from the environment only: `cupool_init`'s configuration string does not take it.
    pub env_only: bool,
    /// What it does, in a line.
    pub doc: &'static str,
}

impl Setting {
    /// Whether `front_end` reads it.
    pub const fn is_read_by(&self, front_end: FrontEnd) -> bool {
        let mut i = 0;
        while i < self.read_by.len() {
            if self.read_by[i].front_end.is(front_end) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// The default of `front_end`, if it reads the setting.
    pub fn default_for(&self, front_end: FrontEnd) -> Option<&'static str> {
        self.read_by
            .iter()
            .find(|r| r.front_end == front_end)
            .map(|r| r.default)
    }
}

/// The setting called `name`.
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// How many settings `front_end` reads.
pub(crate) const fn count_read_by(front_end: FrontEnd) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < SETTINGS.len() {
        if SETTINGS[i].is_read_by(front_end) {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The names of the `N` settings `front_end` reads, in the table's order (`N` is
/// [`count_read_by`]; a const, so that `config::ENV_NAMES` stays a slice).
pub(crate) const fn names_read_by<const N: usize>(front_end: FrontEnd) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < SETTINGS.len() {
        if SETTINGS[i].is_read_by(front_end) {
            out[n] = SETTINGS[i].name;
            n += 1;
        }
        i += 1;
    }
    out
}

/// The table as JSON: `{"front_ends": [...], "settings": [{"name", "accepts", "choices",
/// "defaults": {front end: default}, "read_by", "keyword", "env_only", "doc"}, ...]}`.
pub fn json() -> String {
    let mut out = String::from("{\"front_ends\":[");
    for (i, f) in FrontEnd::ALL.iter().enumerate() {
        out.push_str(if i > 0 { "," } else { "" });
        string(&mut out, f.name());
    }
    out.push_str("],\"settings\":[");
    for (i, s) in SETTINGS.iter().enumerate() {
        out.push_str(if i > 0 { ",{" } else { "{" });
        out.push_str("\"name\":");
        string(&mut out, s.name);
        out.push_str(",\"accepts\":");
        string(&mut out, &s.accepts.describe());
        out.push_str(",\"choices\":[");
        for (j, c) in s.accepts.choices().iter().enumerate() {
            out.push_str(if j > 0 { "," } else { "" });
            string(&mut out, c);
        }
        out.push_str("],\"defaults\":{");
        for (j, r) in s.read_by.iter().enumerate() {
            out.push_str(if j > 0 { "," } else { "" });
            string(&mut out, r.front_end.name());
            out.push(':');
            string(&mut out, r.default);
        }
        out.push_str("},\"read_by\":[");
        for (j, r) in s.read_by.iter().enumerate() {
            out.push_str(if j > 0 { "," } else { "" });
            string(&mut out, r.front_end.name());
        }
        out.push_str("],\"keyword\":");
        match s.keyword {
            Some(k) => string(&mut out, k),
            None => out.push_str("null"),
        }
        let _ = write!(out, ",\"env_only\":{},\"doc\":", s.env_only);
        string(&mut out, s.doc);
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// Appends `s` as a JSON string.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_row_is_read() {
        for (i, s) in SETTINGS.iter().enumerate() {
            assert!(!s.read_by.is_empty(), "{} is read by nobody", s.name);
            assert!(
                SETTINGS[..i].iter().all(|t| t.name != s.name),
                "{} twice",
                s.name
            );
            let prefixed = s.name == "GGML_POOL"
                || s.name.starts_with("GGML_CUDA_")
                || s.name.starts_with("CUPOOL_");
            assert!(prefixed, "{}", s.name);
            // The README's table joins front ends' defaults with `; `.
            assert!(
                s.read_by.iter().all(|r| !r.default.contains(';')),
                "{}",
                s.name
            );
        }
    }

    #[test]
    fn the_library_reads_exactly_its_rows() {
        let asked = std::cell::RefCell::new(Vec::new());
        let _ = crate::PoolConfig::from_lookup(|k| {
            asked.borrow_mut().push(k.to_string());
            None
        });
        assert_eq!(asked.into_inner(), crate::config::ENV_NAMES);
    }

    #[test]
    fn libcupool_takes_every_library_setting() {
        // libcupool parses its configuration with `PoolConfig::from_lookup`.
        for s in SETTINGS.iter().filter(|s| s.is_read_by(FrontEnd::Library)) {
            assert!(s.is_read_by(FrontEnd::Libcupool), "{}", s.name);
            assert!(s.is_read_by(FrontEnd::Cli), "{}", s.name);
            assert!(!s.env_only, "{}", s.name);
        }
    }

    #[test]
    fn derived_values_follow_their_types() {
        let pool = setting("GGML_POOL").unwrap().accepts;
        assert_eq!(pool.describe(), PoolKind::names());
        let purge = setting("CUPOOL_PURGE").unwrap().accepts;
        assert_eq!(purge.describe(), PurgePolicy::NAMES);
        assert_eq!(Accepts::Bool.describe(), crate::config::BOOL_VALUES);
    }

    #[test]
    fn json_escapes_text() {
        let mut s = String::new();
        string(&mut s, "a \"b\" \\ c\n\u{1}");
        assert_eq!(s, r#""a \"b\" \\ c\n\u0001""#);
        assert!(json().starts_with("{\"front_ends\":[\"library\""));
    }
}
