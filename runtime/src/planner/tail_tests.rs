//! The tail the search checks against every tail, by brute force.

use super::*;
use crate::planner::test_setup::{h100, two_layers};
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use cupool_profiles::Profile;

/// The short last ubatch the search checks is the one whose prompt peaks highest, over a VMM
/// pool and a legacy pool purged `always`: every prompt of a context's whole ubatches and a short last one, tried one by one on a
/// card the pool never fills, peaks no higher than the search's tail prompt (or the full one).
/// For the profiles that model tails, every purge policy, two ubatch sizes, contexts that are
/// and are not multiples of the ubatch. (The sum of the requests, which chose before, missed
/// mainline's 496-token tail: at -c 4096 the 4,080-token prompt peaked at 28 MiB, the checked
/// ones at 20.)
#[test]
fn the_tail_checked_is_the_prompt_that_peaks_highest() {
    let pools = [
        (PoolKind::Vmm, PurgePolicy::Never),
        (PoolKind::Vmm, PurgePolicy::Always),
        (PoolKind::Vmm, PurgePolicy::Auto),
        (PoolKind::Legacy, PurgePolicy::Always),
        (PoolKind::Legacy, PurgePolicy::Never),
        (PoolKind::Legacy, PurgePolicy::Auto),
    ];
    let mut worse = Vec::new();
    for profile in [Profile::IkLlama, Profile::LlamaB8833, Profile::Llama] {
        for (kind, purge) in pools {
            for ubatch in [256usize, 512] {
                for n_ctx in [2048usize, 4096, 4352, 9216, 9472] {
                    let mut cfg = two_layers(Some(profile), kind, purge, ubatch);
                    cfg.n_ctx = n_ctx;
                    let t = h100(&cfg, usize::MAX / 4);
                    let peak = |p: usize| super::super::pool_peaks(&cfg, &t, p).unwrap().0;
                    let bytes = &mut LayerBytes::new(&cfg);
                    let checked = match every_tail_prompt(&cfg, &t, bytes) {
                        Some(every) => every.into_iter().map(peak).max().unwrap_or(0),
                        None => tail_prompt(&cfg, &t, bytes).map_or(0, peak),
                    }
                    .max(peak(n_ctx));
                    let base = (n_ctx - 1) / ubatch * ubatch;
                    let (most, at) = (1..n_ctx - base)
                        .map(|k| (peak(base + k), base + k))
                        .chain((1..ubatch).map(|k| (peak(base - ubatch + k), base - ubatch + k)))
                        .max()
                        .unwrap();
                    if most > checked {
                        worse.push(format!(
                            "{profile:?} {kind:?} {purge:?} -ub {ubatch} -c {n_ctx}: the prompt of {at} peaks at {most}, the checked ones at {checked}"
                        ));
                    }
                }
            }
        }
    }
    assert!(worse.is_empty(), "{worse:#?}");
}

/// The prompt a tail names is the longest whose last ubatch has that many tokens, cut as the
/// engine cuts it (batches from the first token, ubatches within each), for batches that are
/// and are not multiples of the ubatch: checked against every prompt.
#[test]
fn the_prompt_ending_in_a_tail_is_the_longest_so_cut() {
    for ub in 1..9usize {
        for batch in ub..22 {
            for n_ctx in 1..70usize {
                let mut cfg = two_layers(None, PoolKind::Legacy, PurgePolicy::Never, ub);
                (cfg.n_batch, cfg.n_ctx) = (batch, n_ctx);
                let last = |p: usize| ((p - 1) % batch) % ub + 1;
                for t in 1..=ub {
                    let want = (1..=n_ctx).rev().find(|&p| last(p) == t);
                    assert_eq!(
                        prompt_ending_in(&cfg, t),
                        want,
                        "-ub {ub} -b {batch} -c {n_ctx}, tail {t}"
                    );
                }
            }
        }
    }
}
