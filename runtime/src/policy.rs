//! What happens at a prefill ubatch boundary, and what the run is allowed to use.

pub use cupool_pool::PurgePolicy;

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
    /// Every mode, in the order of [`BudgetMode::NAMES`].
    pub const ALL: [BudgetMode; 2] = [BudgetMode::Ggml, BudgetMode::Planned];

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
