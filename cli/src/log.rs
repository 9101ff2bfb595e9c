//! The log on stderr: `RUST_LOG`'s filter, else the command's default, and repeated lines
//! collapsed. A warning that one place logs again and again in a row (a replay or a sweep that
//! keeps running out of memory: the pool logs its 1st, 2nd, 4th, ... failure, each a long
//! report) is printed once, when it first happens, and followed by one short line with how
//! many more came, once something else is logged or the command ends ([`flush`]).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, OnceLock};
use tracing::callsite::Identifier;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// Installs the log; returns whether `RUST_LOG` chose its filter. A comparison (`summarize`)
/// keeps each configuration's budget warning out of the default log and says it once after
/// the table (`budget_summary`). With `quiet`, errors alone.
pub fn init(quiet: bool, summarize: bool) -> bool {
    let default = match (quiet, summarize) {
        (true, _) => "error",
        (false, true) => "warn,cupool_runtime::budget=error",
        (false, false) => "warn",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let user = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let layer = Collapse::new(Box::new(std::io::stderr()), std::io::stderr().is_terminal());
    let shared = layer.state.clone();
    if tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init()
        .is_ok()
    {
        let _ = INSTALLED.set(shared);
    }
    user
}

/// Writes the count of a warning's repeats still held: called when the command ends.
pub fn flush() {
    if let Some(state) = INSTALLED.get() {
        if let Ok(mut s) = state.lock() {
            s.flush();
        }
    }
}

/// The installed layer's state, for [`flush`].
static INSTALLED: OnceLock<Arc<Mutex<State>>> = OnceLock::new();

/// The layer that writes events, one line each, collapsing repeats of one callsite.
pub struct Collapse {
    state: Arc<Mutex<State>>,
}

struct State {
    out: Box<dyn Write + Send>,
    colour: bool,
    /// The callsite of the line written last, and how many times it came again since.
    last: Option<(Identifier, Level)>,
    repeats: u64,
    /// The fields of the latest repeat (the running counts a repeated warning carries).
    latest: Vec<(String, String)>,
}

impl Collapse {
    /// A layer writing to `out` (`colour`: the level in colour, for a terminal).
    pub fn new(out: Box<dyn Write + Send>, colour: bool) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                out,
                colour,
                last: None,
                repeats: 0,
                latest: Vec::new(),
            })),
        }
    }
}

impl State {
    /// Says how many more times the last line came, if it did.
    fn flush(&mut self) {
        if let (Some((_, level)), n @ 1..) = (&self.last, self.repeats) {
            let times = if n == 1 { "time" } else { "times" };
            let mut line = format!("{} the line above came {n} more {times}", self.level(level));
            let counts: Vec<String> = self
                .latest
                .iter()
                .filter(|(k, _)| k.ends_with("_so_far"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            if !counts.is_empty() {
                let _ = write!(line, ", the last with {}", counts.join(" "));
            }
            line.push_str(" (RUST_LOG=debug shows every one)");
            let _ = writeln!(self.out, "{line}");
        }
        self.repeats = 0;
        self.latest.clear();
    }

    fn level(&self, level: &Level) -> String {
        let code = match *level {
            Level::ERROR => "31",
            Level::WARN => "33",
            Level::INFO => "32",
            _ => "34",
        };
        if self.colour {
            format!("\x1b[{code}m{level:>5}\x1b[0m")
        } else {
            format!("{level:>5}")
        }
    }
}

impl<S: Subscriber> Layer<S> for Collapse {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let here = meta.callsite();
        if s.last.as_ref().is_some_and(|(id, _)| *id == here) {
            s.repeats += 1;
            s.latest = fields.rest;
            return;
        }
        s.flush();
        let mut line = format!("{} {}", s.level(meta.level()), fields.message);
        for (k, v) in &fields.rest {
            let _ = write!(line, " {k}={v}");
        }
        let _ = writeln!(s.out, "{line}");
        s.last = Some((here, *meta.level()));
    }
}

/// An event's message and its other fields, in order.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest
                .push((field.name().to_string(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer into a shared buffer, to read what the layer wrote.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the layer writes for `n` events of one callsite (each with a running count), one
    /// of another, then `m` of the first again.
    fn log(n: u64, m: u64) -> String {
        let buf = Buf::default();
        let layer = Collapse::new(Box::new(buf.clone()), false);
        let state = layer.state.clone();
        let repeated = |i: u64| tracing::warn!(ooms_so_far = i, "out of memory: report {i}");
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            for i in 1..=n {
                repeated(i);
            }
            tracing::warn!(ubatch = 3, "run ended");
            for i in 1..=m {
                repeated(i);
            }
        });
        state.lock().unwrap().flush();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn a_line_repeated_in_a_row_is_written_once_then_counted() {
        for (n, m) in [(1, 0), (2, 0), (12, 0), (12, 5), (1, 1), (3, 2)] {
            let text = log(n, m);
            let lines: Vec<&str> = text.lines().collect();
            // The first of each run of repeats in full, a count line after a run of more than
            // one, and the other event between them.
            let runs = [n, m].iter().filter(|&&k| k > 0).count();
            let counts = [n, m].iter().filter(|&&k| k > 1).count();
            assert_eq!(lines.len(), runs + counts + 1, "{n} {m}:\n{text}");
            assert_eq!(
                text.matches("out of memory: report 1").count(),
                runs,
                "{text}"
            );
            assert_eq!(text.matches("run ended").count(), 1, "{text}");
            if n > 1 {
                let says = format!("came {} more time", n - 1);
                assert!(lines[1].contains(&says), "{n} {m}:\n{text}");
                assert!(lines[1].contains(&format!("ooms_so_far={n}")), "{text}");
                assert!(lines[2].contains("run ended ubatch=3"), "{text}");
            }
            if m > 1 {
                let last = lines.last().unwrap();
                assert!(
                    last.contains(&format!("came {} more time", m - 1)),
                    "{text}"
                );
            }
        }
    }
}
