//! The advice's searches: at once, one after the other, and from what was made ahead.

use super::*;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::planner::{Outside, GPU_MALLOC_PAGE};
use cupool_profiles::Profile;
use proptest::prelude::*;

/// A card with `room_mib` MiB beside `cfg`'s weights and what lies outside the buffers.
fn card(cfg: &RunConfig, room_mib: usize) -> PlanTarget {
    let (w, _) = cfg.resident_bytes(256);
    let outside = Outside::of(cfg.engine, None, cfg.weight_type, 900);
    PlanTarget {
        free_bytes: w + outside.at_compute() + (room_mib << 20),
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside,
    }
}

/// A configured answer at the end of `usize` (a `Plan` a caller filled in) starts the
/// searches at the largest context, and they answer at once.
#[test]
fn a_start_beyond_every_context_ends_the_searches() {
    let mut shape = ModelShape::preset("llama3-8b").unwrap();
    shape.n_layer = 2;
    let mut c = RunConfig::new(shape, 4096);
    c.pool.kind = Some(PoolKind::Vmm);
    c.purge = PurgePolicy::Always;
    let (w, _) = c.resident_bytes(256);
    let outside = Outside::of(c.engine, None, c.weight_type, 900);
    let target = PlanTarget {
        free_bytes: w + outside.at_compute() + (600 << 20),
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside,
    };
    for start in [usize::MAX, usize::MAX - 255, usize::MAX - 256] {
        let m = super::super::search::max_ctx_above(&c, &target, start, &|| start);
        assert_eq!(m.unwrap(), None, "start {start}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// However many tries are searched at once, the one whose larger context the advice
    /// names is the one the whole searches, one after the other, name.
    #[test]
    fn searching_tries_at_once_names_what_one_after_the_other_does(
        profile in prop::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833)]),
        purges in prop::collection::vec(
            (prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
             prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always])),
            1..5),
        room_mib in 0usize..1200,
        configured_steps in 0usize..600,
        at_once in 1usize..5,
    ) {
        let mut shape = ModelShape::preset("llama3-8b").unwrap();
        shape.n_layer = 2;
        let mut base = RunConfig::new(shape, 4096);
        if let Some(profile) = profile {
            base.engine = EngineKind::Profile { profile, cc: 900 };
        }
        let tries: Vec<(RunConfig, String)> = purges
            .iter()
            .map(|&(kind, purge)| {
                let mut c = base.clone();
                c.pool.kind = Some(kind);
                c.purge = purge;
                (c, format!("{kind:?} {purge:?}"))
            })
            .collect();
        let target = card(&base, room_mib);
        let configured = configured_steps * 256;
        let pick = |answers: Vec<Result<Option<usize>, String>>| {
            let mut better: Option<(String, usize)> = None;
            for ((_, settings), m) in tries.iter().zip(answers) {
                let best = better.as_ref().map_or(configured, |(_, b)| *b);
                if let Some(m) = m?.filter(|&m| m > best) {
                    better = Some((settings.clone(), m));
                }
            }
            Ok::<_, String>(better)
        };
        // The whole searches, one after the other, each from the start the advice gives
        // it: the first vmm try (else the first) from the configured answer, the others
        // from the larger of that and the first's answer.
        let first = tries
            .iter()
            .position(|(c, _)| c.pool.kind == Some(PoolKind::Vmm))
            .unwrap_or(0);
        let whole_of = |c: &RunConfig, start: usize| {
            super::super::search::max_ctx_above(c, &target, start, &|| 0)
                .map_err(|e| e.to_string())
        };
        let first_answer = whole_of(&tries[first].0, configured);
        let start = match &first_answer {
            Ok(Some(m)) => configured.max(*m),
            _ => configured,
        };
        let whole = tries
            .iter()
            .enumerate()
            .map(|(i, (c, _))| match i == first {
                true => first_answer.clone(),
                false => whole_of(c, start),
            })
            .collect();
        let found = larger_contexts(&tries, &target, configured, (at_once, &NoneAhead))
            .into_iter()
            .map(|m| m.map_err(|e| e.to_string()))
            .collect();
        prop_assert_eq!(pick(found), pick(whole));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// The plan and its advice at once (the advice's tries and its searches' first runs beside
    /// the configured search) are those of `plan` then `advise`, errors included.
    #[test]
    fn planning_and_advising_at_once_answers_as_one_after_the_other(
        profile in prop::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833)]),
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in prop::sample::select(vec![64usize, 256]),
        room_mib in 0usize..1200,
        n_ctx in prop::sample::select(vec![4096usize, 65536]),
    ) {
        let mut cfg = crate::planner::test_setup::two_layers(profile, kind, purge, ubatch);
        cfg.n_ctx = n_ctx;
        let target = card(&cfg, room_mib);
        let apart = crate::planner::plan(&cfg, &target, cfg.n_ctx)
            .and_then(|p| advise(&cfg, &target, &p).map(|a| (p, a)))
            .map_err(|e| e.to_string());
        let together = crate::planner::plan_and_advise(&cfg, &target, cfg.n_ctx)
            .map_err(|e| e.to_string());
        prop_assert_eq!(together, apart);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A search going on from what was made ahead of its start (its scouted run and first
    /// probes) answers as one from nothing, errors included, whatever its start and bar.
    #[test]
    fn a_search_from_what_was_made_ahead_answers_as_one_from_nothing(
        profile in prop::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in prop::sample::select(vec![64usize, 256]),
        room_mib in 0usize..1200,
        (start_steps, bar_steps) in (0usize..600, 0usize..600),
    ) {
        use crate::planner::search::{made_ahead, max_ctx_above, max_ctx_above_after};
        let cfg = crate::planner::test_setup::two_layers(profile, kind, purge, ubatch);
        let target = card(&cfg, room_mib);
        let (start, bar) = (start_steps * 256, bar_steps * 256);
        let made = made_ahead(&cfg, &target);
        let ahead = max_ctx_above_after(&cfg, &target, (start, &|| bar), made);
        let alone = max_ctx_above(&cfg, &target, start, &|| bar);
        prop_assert_eq!(ahead.map_err(|e| e.to_string()), alone.map_err(|e| e.to_string()));
    }
}
