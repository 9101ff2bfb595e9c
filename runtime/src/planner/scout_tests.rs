//! Probes answered from a scouted run's checkpoints report what dry runs from the start do.

use super::dry::dry_runs;
use super::scout::Scout;
use super::test_setup::{h100, two_layers};
use crate::policy::PurgePolicy;
use crate::report::RunReport;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;
use proptest::prelude::*;

fn figures(r: &RunReport) -> (bool, Option<usize>, usize, usize, u64, u64) {
    (
        r.completed,
        r.oom_at_token,
        r.peak_reserved_bytes,
        r.peak_live_bytes,
        r.driver_mallocs,
        r.driver_frees,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Over cupool's engine and the profiles, both pools, every purge policy (`auto` with the
    /// ubatch's headroom and with a fixed one), batches that are and are not multiples of the
    /// ubatch, with and without the warm-up, one scout of a context and a series of probes on
    /// its engine (shorter contexts, their tail prompts, rooms where they fail anywhere and
    /// where they complete, rooms near the last probe's, address space reserved in pieces
    /// smaller than the room and larger):
    /// each probe reports what fresh dry runs of its prompts in its room
    /// and context report, however many probes ran on the engine before it.
    #[test]
    fn probes_from_checkpoints_report_as_from_the_start(
        profile in prop::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in prop::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in prop::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        headroom_mib in prop::option::of(0usize..200),
        ubatch in prop::sample::select(vec![64usize, 100, 256, 512]),
        batch_extra in prop::sample::select(vec![0usize, 3, 37]),
        warm_up in any::<bool>(),
        top in 600usize..8000,
        free_mib in 64usize..4096,
        scout_room_mib in 1usize..2000,
        probes in prop::collection::vec((0usize..8000, 1usize..600, prop::collection::vec(0usize..700, 0..4), prop::option::of(-4096i64..4096)), 1..8),
    ) {
        let mut cfg = two_layers(profile, kind, purge, ubatch);
        cfg.n_batch = ubatch * (1 + batch_extra % 4) + batch_extra;
        cfg.warm_up = warm_up;
        if let Some(h) = headroom_mib {
            cfg.auto_headroom = cupool_pool::AutoHeadroom::Bytes(h << 20);
        }
        // The free memory sizes a VMM pool's address space (`dry::dry_config`): some smaller
        // than the rooms.
        let t = h100(&cfg, free_mib << 20);
        // Checkpoints as far as this room would use them.
        let most = scout_room_mib << 20;
        let scout = Scout::new(&cfg, &t, top, move |_| Some(most)).unwrap();
        let Some(mut scout) = scout else {
            return Ok(());
        };
        let mut last_room = None;
        for (c, room_mib, ends, near) in probes {
            let mut probe = cfg.clone();
            probe.n_ctx = c.clamp(1, top);
            let n = probe.n_ctx;
            let mut lens: Vec<usize> = ends.iter().map(|&e| n.saturating_sub(e).max(1)).collect();
            lens.push(n);
            // Some in a room near the last probe's, as a bisection's last probes are (their
            // runs go alike for long: checkpoints of probe runs serve them).
            let room = match (near, last_room) {
                (Some(d), Some(r)) => (r as i64 + d * 1024).max(1 << 20) as usize,
                _ => room_mib << 20,
            };
            last_room = Some(room);
            let from_scout = scout.runs(&probe, &t, &lens, room).unwrap();
            let fresh = dry_runs(&probe, &t, &lens, room).unwrap();
            prop_assert_eq!(from_scout.len(), lens.len());
            for ((a, b), len) in from_scout.iter().zip(&fresh).zip(&lens) {
                prop_assert_eq!(figures(a), figures(b), "prompt of {} tokens, context {}, room {} bytes", len, n, room);
            }
        }
    }
}

/// A checkpoint of a probe run in a context that is not a multiple of the padding: the boundary
/// before it read the next ubatch's KV length capped by that context, so it serves no probe
/// whose own cap differs there (a review found it, 2,400 cases into 20,000: the third probe
/// went on from the second's checkpoint and ran out of memory where a fresh run completes).
#[test]
fn a_checkpoint_whose_boundary_read_a_capped_ubatch_serves_no_other_context() {
    let mut cfg = two_layers(None, PoolKind::Legacy, PurgePolicy::Auto, 64);
    cfg.n_batch = 64;
    cfg.warm_up = false;
    cfg.auto_headroom = cupool_pool::AutoHeadroom::Bytes(159 << 20);
    let t = h100(&cfg, 64 << 20);
    let mut scout = Scout::new(&cfg, &t, 5108, |_| Some(1 << 20))
        .unwrap()
        .expect("a scout");
    for (c, room) in [
        (1, 61 << 20),
        (4782, (61 << 20) + (1 << 20)),
        (4839, (62 << 20)),
    ] {
        let mut probe = cfg.clone();
        probe.n_ctx = c;
        let from_scout = scout.runs(&probe, &t, &[c], room).unwrap();
        let fresh = dry_runs(&probe, &t, &[c], room).unwrap();
        assert_eq!(figures(&from_scout[0]), figures(&fresh[0]), "context {c}");
    }
}
