//! A fast-forwarded dry run reports what the full one does. The fast one skips repeating ops,
//! layers and ubatches (read from the counting driver), keeps its ubatches' live peaks itself
//! instead of through the pool's phases, asks the profile once per kind of layer, and skips
//! working out the next ubatch's requests at a boundary where nothing would be released; the
//! full one does none of it. A plan is a function of its dry runs' results, so equal results
//! are equal plans.

use super::*;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::policy::PurgePolicy;
use cupool_kernels::KvType;
use cupool_pool::{AutoHeadroom, PoolConfig, PoolKind};
use cupool_profiles::{Profile, Weights};
use proptest::prelude::*;

fn shape(n_layer: usize) -> ModelShape {
    let mut m = ModelShape::preset("phi3-mini").unwrap();
    m.n_layer = n_layer;
    m
}

/// A fast-forwarded dry run reports what the full one does, on a card whose pool has
/// `pool_mib` (unlimited when `None`): the same figures, or the same error.
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
    let full = dry_run(cfg, &target, n_prompt, bytes, false);
    let fast = dry_run(cfg, &target, n_prompt, bytes, true);
    let (full, fast) = match (full, fast) {
        (Ok(full), Ok(fast)) => (full, fast),
        (Err(full), Err(fast)) => {
            prop_assert_eq!(fast.to_string(), full.to_string());
            return Ok(());
        }
        (full, fast) => {
            return Err(TestCaseError::fail(format!(
                "full: {:?}, fast: {:?}",
                full.map(|r| r.oom_at_token),
                fast.map(|r| r.oom_at_token)
            )))
        }
    };
    prop_assert_eq!(fast.completed, full.completed);
    prop_assert_eq!(fast.peak_reserved_bytes, full.peak_reserved_bytes);
    prop_assert_eq!(fast.peak_live_bytes, full.peak_live_bytes);
    prop_assert_eq!(fast.driver_mallocs, full.driver_mallocs);
    prop_assert_eq!(fast.driver_frees, full.driver_frees);
    prop_assert_eq!(fast.oom_at_token, full.oom_at_token);
    Ok(())
}

fn headrooms() -> impl Strategy<Value = AutoHeadroom> {
    prop_oneof![
        Just(AutoHeadroom::Ubatch),
        Just(AutoHeadroom::Infinite),
        (0usize..300).prop_map(|m| AutoHeadroom::Bytes(m << 20)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Skipping what repeats changes nothing a plan reports: peaks, driver calls, where it
    /// runs out, for every pool kind and purge policy, card size and batch shape.
    #[test]
    fn fast_forward_reports_what_the_full_dry_run_does(
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm, PoolKind::Torch]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        headroom in headrooms(),
        n_layer in 1usize..4,
        ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
        batch_mult in 1usize..4,
        n_prompt in 1usize..6000,
        ctx_extra in 0usize..3000,
        pool_mib in prop::option::of(8usize..200),
    ) {
        let mut cfg = RunConfig::new(shape(n_layer), n_prompt + ctx_extra);
        cfg.n_ubatch = ubatch;
        cfg.n_batch = ubatch * batch_mult;
        cfg.purge = purge;
        cfg.auto_headroom = headroom;
        cfg.pool = PoolConfig::default().kind(kind);
        same_fast_and_full(&cfg, n_prompt, pool_mib)?;
    }

    /// The same with an engine profile's requests (every op of every layer, the last
    /// layer on its output rows only), including a profile that refuses the single-token
    /// ubatch after the prompt (ik_llama's vector kernel over an f16 cache without GQA).
    #[test]
    fn fast_forward_holds_for_an_engine_profile(
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        headroom in headrooms(),
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
        kv in prop::sample::select(vec![KvType::Q8_0, KvType::F16]),
        no_gqa in any::<bool>(),
        n_layer in 1usize..6,
        ubatch in prop::sample::select(vec![1usize, 7, 64, 256, 512]),
        batch_mult in 1usize..4,
        n_prompt in 1usize..6000,
        ctx_extra in 0usize..3000,
        pool_mib in prop::option::of(8usize..400),
    ) {
        let mut m = ModelShape::preset(model).unwrap();
        m.n_layer = n_layer;
        if no_gqa && model == "llama3-8b" {
            m.n_head_kv = m.n_head;
        }
        let mut cfg = RunConfig::new(m, n_prompt + ctx_extra);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        // What a profile refuses (f16 experts, DeepSeek on mainline) is refused by both
        // runs alike: only the modelled cases compare.
        let refused = (model == "qwen3-30b-a3b" || model == "deepseek-v3") && weights == Weights::F16
            || model == "deepseek-v3" && profile != Profile::IkLlama;
        prop_assume!(!refused);
        cfg.weight_type = weights;
        cfg.kv_type = kv;
        cfg.n_ubatch = ubatch;
        cfg.n_batch = ubatch * batch_mult;
        cfg.purge = purge;
        cfg.auto_headroom = headroom;
        cfg.pool = PoolConfig::default().kind(kind);
        same_fast_and_full(&cfg, n_prompt, pool_mib)?;
    }
}

/// Long prompts: the KV length grows every ubatch, so no two ubatches repeat, the VMM pool
/// maps more at nearly every one, and the fast run's savings (statistics it does not read,
/// requests it does not work out) are where its time goes. Fewer cases, longer runs.
#[test]
fn fast_forward_holds_over_long_prompts() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    let strategy = (
        prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        prop::sample::select(vec![
            PurgePolicy::Never,
            PurgePolicy::Auto,
            PurgePolicy::Always,
        ]),
        prop::sample::select(vec![
            None,
            Some(Profile::LlamaB8833),
            Some(Profile::IkLlama),
        ]),
        prop::sample::select(vec![128usize, 256, 512]),
        20_000usize..60_000,
        prop::option::of(100usize..3000),
    );
    runner
        .run(
            &strategy,
            |(kind, purge, profile, ubatch, n_prompt, pool_mib)| {
                let mut m = ModelShape::preset("llama3-8b").unwrap();
                m.n_layer = 3;
                let mut cfg = RunConfig::new(m, n_prompt);
                if let Some(profile) = profile {
                    cfg.engine = EngineKind::Profile { profile, cc: 900 };
                }
                cfg.n_ubatch = ubatch;
                cfg.n_batch = 4 * ubatch;
                cfg.purge = purge;
                cfg.pool = PoolConfig::default().kind(kind);
                same_fast_and_full(&cfg, n_prompt, pool_mib)
            },
        )
        .unwrap();
}
