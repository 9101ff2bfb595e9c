//! What happens at a prefill ubatch boundary, and what the run is allowed to use.

/// Purge policy at the boundary of prefill ubatches (more than one token). Decode ubatches
/// (one token) are never purged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PurgePolicy {
    /// Keep everything cached (ggml).
    Never,
    /// Synchronize, then return every cached buffer at each prefill ubatch boundary.
    Always,
    /// Return only what the next ubatch cannot reuse: the pool is asked which cached buffers
    /// best fit would hand to the next ubatch's scratch requests, and releases the rest. It
    /// synchronizes only when there is something to release.
    Auto,
}

impl PurgePolicy {
    /// The names accepted on the command line.
    pub const NAMES: &'static str = "never, always, auto";

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            PurgePolicy::Never => "never",
            PurgePolicy::Always => "always",
            PurgePolicy::Auto => "auto",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "never" => Some(PurgePolicy::Never),
            "always" => Some(PurgePolicy::Always),
            "auto" => Some(PurgePolicy::Auto),
            _ => None,
        }
    }
}

/// How the compute budget is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BudgetMode {
    /// The compute buffer plus a fixed margin, as llama.cpp (margin 0) or ik's `--fit-margin`
    /// reserve it: pool scratch is not counted, which is the bug.
    Ggml,
    /// The compute buffer plus the pool peak that a dry run of the whole context predicts for
    /// the chosen pool and purge policy; startup fails if that does not fit.
    Planned,
}

impl BudgetMode {
    /// The names accepted on the command line.
    pub const NAMES: &'static str = "ggml, planned";

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            BudgetMode::Ggml => "ggml",
            BudgetMode::Planned => "planned",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ggml" => Some(BudgetMode::Ggml),
            "planned" => Some(BudgetMode::Planned),
            _ => None,
        }
    }
}
