//! Allocation traces, in one place: the event type, the writer (the [`Recorder`] adaptor), the
//! parser and the replay.
//!
//! A trace is JSON lines, one event a line:
//! `{"op":"alloc","id":7,"size":1048576,"stream":0}`, `{"op":"free","id":7}`,
//! `{"op":"phase_begin","name":"ubatch 3"}`, `{"op":"phase_end","name":"ubatch 3","prefill":true}`,
//! `{"op":"sync"}`, and `{"op":"keep","stream":0,"sizes":[...]}` (or `"all":true`) before a
//! prefill phase ends: what the run's `auto` purge kept buffers for, so that a replay purges as
//! the run did (both decide through [`crate::boundary`]). `repro-prefill replay` reads it;
//! docs/repro-prefill.md describes it.

mod error;
mod event;
#[cfg(feature = "check")]
pub mod fuzz;
mod parse;
mod recorder;
mod replay;
mod timeline;

pub use error::TraceError;
pub use event::TraceEvent;
pub use parse::parse;
pub use recorder::Recorder;
pub use replay::{replay, replay_on, replay_on_card, Card, ReplayReport};
pub use timeline::Point;

/// The parser's and the replay's name for an event.
pub type Op = TraceEvent;
