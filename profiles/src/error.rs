//! Why a profile gave no answer: what it was asked about that it does not model, and what it
//! accepts. The messages name the profile and its commit, so a run that went through several
//! says which one refused.

use std::fmt;

/// What a profile (or a prediction's schedule) refused; the message says what was wrong and what
/// is accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileError {
    /// The profile does not model this model, weight type, ubatch or device.
    Unsupported {
        /// The engine (`ik_llama`, `llama`).
        engine: &'static str,
        /// The commit (or release) its profile models.
        commit: &'static str,
        /// What was asked, and what is accepted.
        what: String,
    },
    /// A prediction's schedule is not one the engine runs (what was asked, and what is accepted).
    Schedule(String),
}

impl ProfileError {
    pub(crate) fn unsupported(engine: &'static str, commit: &'static str, what: String) -> Self {
        Self::Unsupported {
            engine,
            commit,
            what,
        }
    }
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported {
                engine,
                commit,
                what,
            } => write!(f, "the {engine} ({commit}) profile: {what}"),
            Self::Schedule(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for ProfileError {}
