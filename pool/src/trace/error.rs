//! Why a trace could not be parsed or replayed.

use crate::error::PoolError;
use std::fmt;

/// Why a trace could not be parsed or replayed.
#[derive(Debug)]
pub enum TraceError {
    /// A line is not an event; the message says what was expected.
    Parse {
        /// The line, from 1.
        line: usize,
        /// What was wrong and what is accepted.
        message: String,
    },
    /// An event contradicts the ones before it (a double alloc, a free of nothing).
    Inconsistent {
        /// The event, from 1.
        event: usize,
        /// What was wrong.
        message: String,
    },
    /// The pool failed in a way other than running out of memory.
    Pool(PoolError),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Parse { line, message } => write!(f, "line {line}: {message}"),
            TraceError::Inconsistent { event, message } => write!(f, "event {event}: {message}"),
            TraceError::Pool(e) => write!(f, "replay failed: {e}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Pool(e) => Some(e),
            _ => None,
        }
    }
}

impl From<PoolError> for TraceError {
    fn from(e: PoolError) -> Self {
        TraceError::Pool(e)
    }
}
