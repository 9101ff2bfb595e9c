//! Configurations and cards the planner's tests share.

use super::{Outside, PlanTarget, GPU_MALLOC_PAGE};
use crate::config::RunConfig;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;

/// An H100 with `free` bytes free before the engine starts.
pub(super) fn h100(cfg: &RunConfig, free: usize) -> PlanTarget {
    PlanTarget {
        free_bytes: free,
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside: Outside::of(cfg.engine, cfg.engine_model.as_ref(), cfg.weight_type, 900),
    }
}

/// A 2-layer Llama-3-8B-shaped configuration for the property tests.
pub(super) fn two_layers(
    profile: Option<Profile>,
    kind: PoolKind,
    purge: PurgePolicy,
    ubatch: usize,
) -> RunConfig {
    let mut shape = ModelShape::preset("llama3-8b").unwrap();
    shape.n_layer = 2;
    let mut cfg = RunConfig::new(shape, 4096);
    if let Some(profile) = profile {
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
    }
    cfg.n_ubatch = ubatch;
    cfg.n_batch = 4 * ubatch;
    cfg.purge = purge;
    cfg.pool.kind = Some(kind);
    cfg
}
