//! The largest context that fits, and the worst pool peak over every prompt length: a prompt
//! that fills the context, and one whose last, short ubatch takes the most (short ubatches
//! split the KV range and take `dst_tmp`).
//!
//! Whether a context fits is not monotone in the context. The weights, the KV cache and the
//! pool's needs only grow with it, but mainline's compute buffer is ggml-alloc's placement of
//! the reserve graph (`cupool_profiles::llama`), and the placement moves as the KQ mask (f16,
//! `n_kv × n_ubatch`, live through every layer) grows. In a mixture of experts (qwen3moe,
//! `-ub 512`) the CUDA backend's `ggml_backend_cuda_graph_optimize` has the scheduler keep the
//! inputs of two fusions alive (the weighted expert sum's and the top-k routing's): from 512
//! positions the last layer's output lands above the experts' output and its weighted copy,
//! and the logits above it, 341.3–344.6 MiB to 3,840 positions, 341.5352 MiB to 37,376 and
//! 337.5 MiB to 38,144; from 38,400 the mask has moved what lies under the logits and the
//! buffer is the logits and final norm alone, 300.75 MiB, as at 256 (then it grows with the
//! mask: 444 MiB at 131,072).
//! So a context can fail where a longer one fits, and a bisection over the contexts is fooled:
//! with the 4 layers of data/h100-2026-11-25-mainline-predict's `qwen3-q8` and 3.925 GiB free,
//! 31,232 fits, 31,488–38,144 do not and 38,400–40,960 do; the bisection answered 31,232
//! (`search_tests.rs`).
//!
//! The search therefore bisects on bounds that are monotone, and decides exactly below them:
//!
//! 1. The compute buffer's floor ([`RunConfig::compute_floor_bytes`]: what any placement holds
//!    at once, never decreasing with the context) bounds the start-up buffers from below:
//!    bisecting on it gives a context above which none starts. Below it the exact buffers are
//!    checked downwards to the first context that starts, `bound`; where the pool fits beside
//!    them there, that is the answer, with one dry run.
//! 2. Else, with the floor in place of the buffer whether a context fits is monotone, and it
//!    fits whenever the context does: a bisection with dry runs gives `top`, above which none
//!    fits. Below `top` the exact buffer is replayed context by context, downwards. Over a run
//!    of contexts where it does not decrease, whether a context fits is monotone again, so each
//!    run is probed with dry runs at its top, at doubling distances and at its bottom, and
//!    bisected where one fits: the first run from the top with a fitting context holds the
//!    answer. Where the slack of the probes that fit predicts the boundary (`narrow.rs`), the
//!    bisections probe there first, and the walk starts where `top`'s slack covers the
//!    buffer's excess over its floor. Where the slack's prediction misses (a legacy pool grows
//!    in steps of 5%) and the pool's run does not follow its room until an allocation fails,
//!    one dry run's trajectory (`trajectory.rs`) says where the boundary is expected, and the
//!    bracket is narrowed from there; the answer is the bisection's wherever whether a context
//!    fits is monotone.
//!
//! Each walk downwards ends within the buffer's excess over its floor (ggml-alloc's holes, at
//! most 43.8 MiB in the MoE, 8 MiB in llama3-8b and 15.8 MiB in phi3-mini up to 65,536
//! positions) worth of KV cache and pool below where it starts, at a replay (0.02–1 ms) per
//! context. Both steps assume what the bisection always did: with a given compute buffer, a
//! longer context never needs less, and more room never hurts.
//!
//! Whether a context fits is a probe (`probe.rs`); where the next probe goes, `narrow.rs`.

use super::narrow::Beside;
use super::probe::STEP;
use super::walk::{Made, Walk};
use super::{room_beside, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;

/// The largest context, in multiples of 256 up to [`crate::config::MAX_CTX`], whose prompts
/// all complete; `None` if none does. Exact where the compute buffer is not monotone in the
/// context (see the module docs).
pub fn max_ctx_that_fits(
    cfg: &RunConfig,
    target: &PlanTarget,
) -> Result<Option<usize>, RuntimeError> {
    max_ctx_above(cfg, target, 0, &|| 0)
}

/// [`max_ctx_that_fits`] where only an answer above `above()` counts (the advice's other
/// settings, against the largest context found so far, which may grow meanwhile): the answer
/// if it is above `above()`, else `None`. The search stops as soon as every context it can
/// still answer is at most `above()`, the dry runs up to there the same; it stops early only
/// where none of the dry runs it leaves out could fail (the engine profile refuses no ubatch it
/// could ask), so an error comes back as it did.
///
/// `start` is a context the caller expects the answer to beat, fixed before the search (the
/// advice's: the configured settings' answer): where the search predicts, it probes one step
/// above it first and the slack never predicts at or below it (a trajectory's expectation is
/// probed where it is: `walk.rs`), so a search that cannot beat it ends in a probe or two. The probes depend on `start` and on earlier probes' results, never on
/// `above()`: a search that stops early has run a prefix of the whole one with the same
/// `start`, and its answer is that one's however `above()` grows meanwhile. Where whether a
/// context fits is monotone, `start` changes no answer either.
pub(crate) fn max_ctx_above(
    cfg: &RunConfig,
    target: &PlanTarget,
    start: usize,
    above: &dyn Fn() -> usize,
) -> Result<Option<usize>, RuntimeError> {
    max_ctx_above_after(cfg, target, (start, above), Made::default())
}

/// [`max_ctx_above`], its walk given what [`made_ahead`] made for `cfg` on `target`: the same
/// answer, the probes made there not run again.
pub(crate) fn max_ctx_above_after(
    cfg: &RunConfig,
    target: &PlanTarget,
    (start, above): (usize, &dyn Fn() -> usize),
    made: Made,
) -> Result<Option<usize>, RuntimeError> {
    let m = search_with(cfg, target, (start, above), predicts(cfg, target), made)?;
    Ok(m.filter(|&m| m > above()))
}

/// What a search of `cfg` on `target` makes before its start counts: its scouted run and its
/// first probes (the longest context that starts, beside its own buffer and beside its
/// floor), as [`search_with`] makes them. A search from any start then goes on from it
/// (`max_ctx_above_after`). An error ends it early: the search meets it again.
pub(crate) fn made_ahead(cfg: &RunConfig, target: &PlanTarget) -> Made {
    let Some(s_lo) = floor_bound(cfg, target) else {
        return Made::default();
    };
    let mut walk = Walk::new(cfg, target, (0, s_lo), &|| 0, (false, Made::default()));
    if let Some(bound) = walk.starts_at_or_below(s_lo) {
        if let Ok(false) = walk.fits(bound) {
            if walk.compute(bound) != cfg.compute_floor_bytes(bound) {
                // Its result or error is the search's to meet.
                let _ = walk.fits_floor(bound);
            }
        }
    }
    walk.into_made()
}

/// Whether the search predicts its probes from the slack (`narrow.rs`) for `cfg`'s pool: the
/// vmm pool, and the legacy pool unless purged `auto`. A legacy pool purged `auto` fills its
/// room before it purges: its slack is near nothing wherever it fits and predicts nothing, and
/// whether a context fits is not monotone there (22,272-23,040 positions fit, 23,296-23,552 do
/// not, 23,808-24,576 do for cupool's engine, llama3-8b's shape in 2 layers and 360 MiB of
/// room), where probes elsewhere could find another boundary; the other pools (managed,
/// PyTorch's) were not measured. Those keep the bisection's probes, and its answers.
fn predicts(cfg: &RunConfig, target: &PlanTarget) -> bool {
    match cfg.pool.resolve(target.vmm) {
        Ok(PoolKind::Vmm) => true,
        Ok(PoolKind::Legacy) => cfg.purge != PurgePolicy::Auto,
        _ => false,
    }
}

/// The largest context whose start-up buffers, with the compute buffer's floor, fit beside what
/// lies outside them (no dry run): none above it starts. `None` where none does.
fn floor_bound(cfg: &RunConfig, target: &PlanTarget) -> Option<usize> {
    const LIMIT: usize = crate::config::MAX_CTX;
    let static_fits = |c: usize| {
        let (w, kv) = cfg.resident_bytes(c);
        room_beside(target, (w, kv, cfg.compute_floor_bytes(c))).is_ok()
    };
    let (mut s_lo, mut s_hi) = (0, LIMIT / STEP + 1);
    while s_hi - s_lo > 1 {
        let mid = (s_lo + s_hi) / 2;
        if static_fits(mid * STEP) {
            s_lo = mid;
        } else {
            s_hi = mid;
        }
    }
    (s_lo > 0).then_some(s_lo * STEP)
}

/// [`max_ctx_above`]'s search, predicting its probes from the slack or (`predict` false)
/// bisecting, going on from `made`: the answer, or `None` where none fits or where it stopped
/// early.
fn search_with(
    cfg: &RunConfig,
    target: &PlanTarget,
    (start, above): (usize, &dyn Fn() -> usize),
    predict: bool,
    made: Made,
) -> Result<Option<usize>, RuntimeError> {
    let floor = |c: usize| cfg.compute_floor_bytes(c);
    let Some(s_lo) = floor_bound(cfg, target) else {
        return Ok(None);
    };
    let mut walk = Walk::new(cfg, target, (start, s_lo), above, (predict, made));
    // The exact start-up buffers, downwards from the floor's bound (a few contexts, where the
    // buffer is above its floor): none above `bound` starts. When the pool fits beside them
    // there, that is the answer, with one dry run. (`made_ahead` makes these first probes.)
    let Some(bound) = walk.starts_at_or_below(s_lo) else {
        return Ok(None);
    };
    if walk.answers_at_most(bound) {
        return Ok(None);
    }
    if walk.fits(bound)? {
        return Ok(Some(bound));
    }
    let top = if walk.compute(bound) != floor(bound) && walk.fits_floor(bound)? {
        bound
    } else {
        let (mut lo, mut end) = (STEP, bound);
        // Where the answer is expected above `start` and fitting beside the floor is taken as
        // monotone, the first probe is one step above it: where it fails, so does every context
        // above it (one probe, where the bisection below it took a score); where it fits, the
        // bracket starts there.
        let bar = walk.start;
        if walk.predicting && bar >= STEP && bar + STEP < bound {
            if walk.fits_floor(bar + STEP)? {
                lo = bar + STEP;
            } else if walk.answers_at_most(bar) {
                return Ok(None);
            } else {
                end = bar + STEP;
            }
        }
        if lo == STEP && !walk.fits_floor(STEP)? {
            return Ok(None);
        }
        while lo * 2 < end && walk.fits_floor(lo * 2)? {
            lo *= 2;
        }
        // lo fits beside the floor, the bracket's end does not.
        match walk.bisect(Beside::Floor, lo, (lo * 2).min(end))? {
            Some(top) => top,
            None => return Ok(None),
        }
    };
    // Where the buffer is its floor, `top` fits as it did beside the floor.
    if walk.compute(top) == floor(top) {
        return Ok(Some(top));
    }
    walk.largest_from(top)
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
