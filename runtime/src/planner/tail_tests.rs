//! The tail the search checks against every tail, by brute force.

use super::*;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::planner::{Outside, GPU_MALLOC_PAGE};
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;

/// A 2-layer Llama-3-8B shape under `profile`, its pool and purge, 512-token ubatches, a
/// context of `n_ctx`.
fn two_layers(profile: Profile, kind: PoolKind, purge: PurgePolicy, n_ctx: usize) -> RunConfig {
    let mut shape = ModelShape::preset("llama3-8b").unwrap();
    shape.n_layer = 2;
    let mut cfg = RunConfig::new(shape, n_ctx);
    cfg.engine = EngineKind::Profile { profile, cc: 900 };
    cfg.n_ubatch = 512;
    cfg.n_batch = 2048;
    cfg.purge = purge;
    cfg.pool.kind = Some(kind);
    cfg
}

/// An H100 with room for anything.
fn roomy(cfg: &RunConfig) -> PlanTarget {
    PlanTarget {
        free_bytes: usize::MAX / 4,
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside: Outside::of(cfg.engine, cfg.engine_model.as_ref(), cfg.weight_type, 900),
    }
}

/// The short last ubatch the search checks is the one whose prompt peaks highest: every prompt
/// of a whole context's ubatches and a short last one, tried one by one on a card the pool never
/// fills, peaks no higher than the search's tail prompt (or the full one). For the profiles
/// that model tails, both pools, purged never and always.
#[test]
fn the_tail_checked_is_the_prompt_that_peaks_highest() {
    let mut worse = Vec::new();
    for profile in [Profile::IkLlama, Profile::LlamaB8833, Profile::Llama] {
        for kind in [PoolKind::Vmm, PoolKind::Legacy] {
            for purge in [PurgePolicy::Never, PurgePolicy::Always] {
                for n_ctx in [4096usize, 9216, 36864] {
                    let cfg = two_layers(profile, kind, purge, n_ctx);
                    let t = roomy(&cfg);
                    let peak = |p: usize| super::super::pool_peaks(&cfg, &t, p).unwrap().0;
                    let checked = tail_prompt(&cfg, &t, &mut LayerBytes::new(&cfg))
                        .map_or(0, peak)
                        .max(peak(n_ctx));
                    let base = (n_ctx - 1) / 512 * 512;
                    let (most, at) = (1..512).map(|k| (peak(base + k), base + k)).max().unwrap();
                    if most > checked {
                        worse.push(format!(
                            "{profile:?} {kind:?} {purge:?} -c {n_ctx}: the prompt of {at} peaks at {most}, the checked ones at {checked}"
                        ));
                    }
                }
            }
        }
    }
    assert!(worse.is_empty(), "{worse:#?}");
}
