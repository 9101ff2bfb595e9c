//! Prompts decoded together from a snapshot report what each reports alone.

use super::dry::{dry_run, dry_runs};
use super::test_setup::{h100, two_layers};
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Over cupool's engine and the profiles, both pools, every purge policy, batches that are
    /// and are not multiples of the ubatch, with and without the warm-up, rooms small enough that prompts fail
    /// anywhere, and prompts ending in the last two ubatches of a context (and shorter ones),
    /// each prompt's report from `dry_runs` is its lone dry run's: where it stops, its pool's
    /// peaks, its driver calls.
    #[test]
    fn prompts_run_together_report_as_alone(
        profile in prop::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in prop::sample::select(vec![64usize, 100, 256, 512]),
        batch_extra in prop::sample::select(vec![0usize, 3, 37]),
        warm_up in any::<bool>(),
        n_ctx in 300usize..6000,
        room_mib in 1usize..400,
        ends in prop::collection::vec(0usize..1024, 1..12),
    ) {
        let mut cfg = two_layers(profile, kind, purge, ubatch);
        cfg.n_ctx = n_ctx;
        // Batches that are and are not multiples of the ubatch.
        cfg.n_batch = ubatch * (1 + batch_extra % 4) + batch_extra;
        cfg.warm_up = warm_up;
        let t = h100(&cfg, usize::MAX / 4);
        let room = room_mib << 20;
        let mut lens: Vec<usize> = ends.iter().map(|&e| n_ctx.saturating_sub(e).max(1)).collect();
        lens.push(n_ctx);
        let together = dry_runs(&cfg, &t, &lens, room).unwrap();
        prop_assert_eq!(together.len(), lens.len());
        for (r, &len) in together.iter().zip(&lens) {
            let alone = dry_run(&cfg, &t, len, room, true).unwrap();
            let figures = |r: &crate::report::RunReport| {
                (r.completed, r.oom_at_token, r.peak_reserved_bytes, r.peak_live_bytes, r.driver_mallocs, r.driver_frees)
            };
            prop_assert_eq!(figures(r), figures(&alone), "prompt of {} tokens", len);
        }
    }
}

/// A pool behind the managed-memory fallback (`GGML_CUDA_ALLOC_FALLBACK_MANAGED=1`) keeps no
/// snapshot: its probes run one dry run a prompt, as before, and plan as without it where
/// nothing falls back (an endless card). The snapshots' first version refused every probe.
#[test]
fn a_pool_with_the_managed_fallback_plans_without_snapshots() {
    for kind in [PoolKind::Legacy, PoolKind::Vmm] {
        let mut cfg = two_layers(Some(Profile::LlamaB8833), kind, PurgePolicy::Never, 512);
        cfg.n_ctx = 8192;
        let t = h100(&cfg, usize::MAX / 4);
        let bare = super::worst_case_pool_peak(&cfg, &t).unwrap();
        cfg.pool.fallback_managed = true;
        assert!(!super::dry::keeps_snapshots(&cfg, &t));
        assert_eq!(
            super::worst_case_pool_peak(&cfg, &t).unwrap(),
            bare,
            "{kind:?}"
        );
    }
}
