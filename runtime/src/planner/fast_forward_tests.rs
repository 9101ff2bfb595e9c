//! A fast-forwarded dry run reports what the full one does.

use super::*;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::policy::PurgePolicy;
use cupool_pool::{PoolConfig, PoolKind};
use cupool_profiles::{Profile, Weights};
use proptest::prelude::*;

fn shape(n_layer: usize) -> ModelShape {
    let mut m = ModelShape::preset("phi3-mini").unwrap();
    m.n_layer = n_layer;
    m
}

/// A fast-forwarded dry run reports what the full one does, on a card whose pool has
/// `pool_mib` (unlimited when `None`).
fn same_fast_and_full(
    cfg: &RunConfig,
    n_prompt: usize,
    pool_mib: Option<usize>,
) -> Result<(), TestCaseError> {
    let target = PlanTarget {
        free_bytes: 0,
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside: Outside::NONE,
    };
    let bytes = pool_mib.map_or(MAX_CAPACITY, |m| m << 20);
    let full = dry_run(cfg, &target, n_prompt, bytes, false).unwrap();
    let fast = dry_run(cfg, &target, n_prompt, bytes, true).unwrap();
    prop_assert_eq!(fast.peak_reserved_bytes, full.peak_reserved_bytes);
    prop_assert_eq!(fast.peak_live_bytes, full.peak_live_bytes);
    prop_assert_eq!(fast.driver_mallocs, full.driver_mallocs);
    prop_assert_eq!(fast.driver_frees, full.driver_frees);
    prop_assert_eq!(fast.oom_at_token, full.oom_at_token);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Skipping what repeats changes nothing a plan reports: peaks, driver calls, where it
    /// runs out, for every pool kind and purge policy, card size and batch shape.
    #[test]
    fn fast_forward_reports_what_the_full_dry_run_does(
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm, PoolKind::Torch]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        n_layer in 1usize..4,
        ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
        batch_mult in 1usize..4,
        n_prompt in 1usize..3000,
        pool_mib in prop::option::of(8usize..200),
    ) {
        let mut cfg = RunConfig::new(shape(n_layer), 4096);
        cfg.n_ubatch = ubatch;
        cfg.n_batch = ubatch * batch_mult;
        cfg.purge = purge;
        cfg.pool = PoolConfig::default().kind(kind);
        same_fast_and_full(&cfg, n_prompt, pool_mib)?;
    }

    /// The same with an engine profile's requests (every op of every layer, the last
    /// layer on its output rows only).
    #[test]
    fn fast_forward_holds_for_an_engine_profile(
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
        n_layer in 1usize..6,
        ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
        batch_mult in 1usize..4,
        n_prompt in 1usize..3000,
        pool_mib in prop::option::of(8usize..400),
    ) {
        let mut m = ModelShape::preset(model).unwrap();
        m.n_layer = n_layer;
        let mut cfg = RunConfig::new(m, 4096);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        // What a profile refuses (f16 experts, DeepSeek on mainline) is refused by both
        // runs alike: only the modelled cases compare.
        let refused = (model == "qwen3-30b-a3b" || model == "deepseek-v3") && weights == Weights::F16
            || model == "deepseek-v3" && profile != Profile::IkLlama;
        prop_assume!(!refused);
        cfg.weight_type = weights;
        cfg.n_ubatch = ubatch;
        cfg.n_batch = ubatch * batch_mult;
        cfg.purge = purge;
        cfg.pool = PoolConfig::default().kind(kind);
        same_fast_and_full(&cfg, n_prompt, pool_mib)?;
    }
}
