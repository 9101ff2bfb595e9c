//! libcupool's log: one line per event on stderr (`cupool  WARN what happened key=value ...`),
//! filtered by `CUPOOL_LOG`, else `RUST_LOG`, else warnings and errors (`off` silences it).
//!
//! A subscriber of its own rather than `tracing_subscriber::fmt`: fmt formats into a thread
//! local buffer and looks the current span up in thread locals, so an event logged after those
//! were destroyed (a free refused from another thread local's destructor at thread or process
//! exit) panics. Nothing here touches a thread local. The filter is a `Targets` filter: RUST_LOG's
//! syntax of targets and levels (span directives are not supported and make the filter fall back
//! to the default, with a warning); libcupool opens no spans, so spans are ignored.

use std::fmt::{self, Write as _};
use std::io::Write as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::filter::Targets;

struct Stderr {
    filter: Targets,
}

/// An event's message and its other fields, in order.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Stderr {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // The filter reads nothing but the callsite, so its answer holds for good.
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.filter
            .would_enable(metadata.target(), metadata.level())
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        let text = format!(
            "cupool {:>5} {}{}\n",
            event.metadata().level(),
            line.message,
            line.fields
        );
        // One write per line, so threads' lines do not interleave; a failed write is dropped.
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the log unless the host installed a global subscriber first (in this library's
/// copy of `tracing`), which it then keeps.
pub(crate) fn init() {
    let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (filter, bad) = match var("CUPOOL_LOG").or_else(|| var("RUST_LOG")) {
        None => (Targets::new().with_default(tracing::Level::WARN), None),
        Some(text) => match text.parse::<Targets>() {
            Ok(f) => (f, None),
            Err(e) => (
                Targets::new().with_default(tracing::Level::WARN),
                Some((text, e)),
            ),
        },
    };
    if tracing::subscriber::set_global_default(Stderr { filter }).is_ok() {
        if let Some((text, e)) = bad {
            tracing::warn!(
                "the log filter {text:?} is not understood ({e}): logging warnings and errors; \
                 accepted: a level (error, warn, info, debug, trace, off) or target=level pairs \
                 separated by commas"
            );
        }
    }
}
