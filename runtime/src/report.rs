//! What a run reports: a row per ubatch and the run's totals.

use crate::policy::{BudgetMode, PurgePolicy};
use cupool_pool::{OomReport, PoolKind};

/// One ubatch's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct UbatchRow {
    /// Index within the run.
    pub index: usize,
    /// Position of its first token.
    pub pos0: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// KV length its attention saw.
    pub n_kv: usize,
    /// Highest live pool bytes during the ubatch.
    pub live_peak_bytes: usize,
    /// Highest pool reserve during the ubatch.
    pub reserved_bytes: usize,
    /// Pool cache after the boundary purge.
    pub cached_bytes: usize,
    /// Device bytes in use after the ubatch (by everyone).
    pub device_used_bytes: usize,
    /// The reserved compute budget.
    pub budget_bytes: usize,
    /// Whether compute buffer + pool reserve exceeded the budget.
    pub over_budget: bool,
    /// Driver allocations (mallocs and maps) during the ubatch.
    pub driver_mallocs: u64,
    /// Bytes the boundary purge returned.
    pub purged_bytes: usize,
    /// Wall time of the ubatch, in seconds.
    pub seconds: f64,
}

/// A run's outcome.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Pool kind.
    pub pool: PoolKind,
    /// Purge policy.
    pub purge: PurgePolicy,
    /// Budget mode.
    pub budget_mode: BudgetMode,
    /// Whether every token was processed.
    pub completed: bool,
    /// Tokens processed before the OOM, if one happened.
    pub oom_at_token: Option<usize>,
    /// The OOM's full picture.
    pub oom: Option<Box<OomReport>>,
    /// Pool peak live bytes.
    pub peak_live_bytes: usize,
    /// Pool peak reserve.
    pub peak_reserved_bytes: usize,
    /// The reserved compute budget.
    pub budget_bytes: usize,
    /// The compute buffer.
    pub compute_bytes: usize,
    /// Budget warnings emitted.
    pub budget_warnings: usize,
    /// Where the first budget warning's simulation of the rest of the prefill said the run
    /// dies (tokens processed before the failing allocation), if it does.
    pub projected_oom_at_token: Option<usize>,
    /// Driver allocations by the pool (mallocs, managed mallocs and maps).
    pub driver_mallocs: u64,
    /// Driver releases by the pool.
    pub driver_frees: u64,
    /// Allocations served by the managed fallback.
    pub fallbacks: u64,
    /// The most managed-fallback bytes live at once.
    pub fallback_peak_bytes: usize,
    /// Per ubatch.
    pub ubatches: Vec<UbatchRow>,
    /// Wall time of the run.
    pub seconds: f64,
}
