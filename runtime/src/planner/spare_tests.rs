//! A search whose bisection takes probes from a helper answers as one without.

use super::*;
use crate::planner::max_ctx_that_fits;
use crate::planner::test_setup::{h100, two_layers};
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;

/// The answer of a search of `cfg` on `t` with (`helper`) or without a helper, errors as text,
/// and the probes it took from the helper.
fn search(cfg: &RunConfig, t: &PlanTarget, helper: bool) -> (Result<Option<usize>, String>, usize) {
    HELPER.set(Some(helper));
    TAKEN.set(0);
    let m = max_ctx_that_fits(cfg, t).map_err(|e| e.to_string());
    HELPER.set(None);
    (m, TAKEN.get())
}

/// `cfg` on a card with `room_mib` MiB beside the weights and what lies outside them.
fn card(cfg: &RunConfig, room_mib: usize) -> PlanTarget {
    let (w, _) = cfg.resident_bytes(256);
    let outside = h100(cfg, 0).outside.at_compute();
    h100(cfg, w + outside + (room_mib << 20))
}

/// The helper's probes are taken (so the property below compares searches that used them):
/// a legacy pool purged `auto` bisects, a dozen probes, and the helper's guess is right for
/// some of them. A helper the scheduler has not yet run when its probe is due leaves that
/// probe to the bisection (on a loaded machine, every one of a search's), so the search is
/// repeated until one takes a probe, each answering as alone.
#[test]
fn a_bisection_takes_probes_from_its_helper() {
    let cfg = two_layers(
        Some(Profile::LlamaB8833),
        PoolKind::Legacy,
        PurgePolicy::Auto,
        64,
    );
    let t = card(&cfg, 600);
    let alone = search(&cfg, &t, false).0;
    let mut taken = 0;
    for _ in 0..20 {
        let (with, n) = search(&cfg, &t, true);
        assert_eq!(with, alone);
        taken += n;
        if taken > 0 {
            break;
        }
    }
    assert!(taken > 0, "no probe taken from the helper in 20 searches");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]

    /// With a helper making the bisection's next probe ahead, a search answers as it does
    /// alone, errors included, for the pools whose probes it makes (a legacy pool that reads
    /// its room or retries; its bisection where it does not predict).
    #[test]
    fn a_helper_changes_no_answer(
        profile in proptest::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        purge in proptest::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in proptest::sample::select(vec![64usize, 256]),
        room_mib in 0usize..1500,
    ) {
        let cfg = two_layers(profile, PoolKind::Legacy, purge, ubatch);
        let t = card(&cfg, room_mib);
        proptest::prop_assert_eq!(search(&cfg, &t, true).0, search(&cfg, &t, false).0);
    }
}
