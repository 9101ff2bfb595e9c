//! One trace event and its JSON line. The writer ([`super::Recorder`]) and the parser
//! ([`super::parse`]) share this type, so what is recorded and what is replayed cannot drift apart.

use std::fmt::Write as _;

/// One traced event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceEvent {
    /// A successful allocation.
    Alloc {
        /// Sequence number of the allocation.
        id: u64,
        /// Bytes asked for.
        size: usize,
        /// The stream whose pool served it.
        stream: u64,
        /// What was allocated, where the caller said ([`label`](crate::adaptors::label)).
        name: Option<String>,
    },
    /// The requests a purge at the end of the open phase keeps cached buffers for, on one
    /// stream's pool (libcupool's `auto` purge decides them from the phase that ends).
    Keep {
        /// The stream.
        stream: u64,
        /// Request sizes, as `Purge::KeepFor` takes them; `None`: everything stays (no purge).
        sizes: Option<Vec<usize>>,
    },
    /// A free of allocation `id`.
    Free {
        /// The allocation's id.
        id: u64,
    },
    /// A phase opened.
    PhaseBegin {
        /// Its name.
        name: String,
    },
    /// A phase closed.
    PhaseEnd {
        /// Its name.
        name: String,
        /// Whether it was a prefill ubatch (a purge boundary).
        prefill: bool,
    },
    /// The device was synchronized.
    Sync,
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl TraceEvent {
    /// The event as one JSON line (no newline).
    pub fn to_json(&self) -> String {
        match self {
            TraceEvent::Alloc {
                id,
                size,
                stream,
                name: None,
            } => format!(r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream}}}"#),
            TraceEvent::Alloc {
                id,
                size,
                stream,
                name: Some(name),
            } => format!(
                r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream},"name":{}}}"#,
                json_str(name)
            ),
            TraceEvent::Keep {
                stream,
                sizes: Some(sizes),
            } => {
                let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
                format!(
                    r#"{{"op":"keep","stream":{stream},"sizes":[{}]}}"#,
                    list.join(",")
                )
            }
            TraceEvent::Keep {
                stream,
                sizes: None,
            } => format!(r#"{{"op":"keep","stream":{stream},"all":true}}"#),
            TraceEvent::Free { id } => format!(r#"{{"op":"free","id":{id}}}"#),
            TraceEvent::PhaseBegin { name } => {
                format!(r#"{{"op":"phase_begin","name":{}}}"#, json_str(name))
            }
            TraceEvent::PhaseEnd { name, prefill } => {
                format!(
                    r#"{{"op":"phase_end","name":{},"prefill":{prefill}}}"#,
                    json_str(name)
                )
            }
            TraceEvent::Sync => r#"{"op":"sync"}"#.to_string(),
        }
    }
}
