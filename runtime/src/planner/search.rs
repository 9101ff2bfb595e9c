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
//!    answer.
//!
//! Each walk downwards ends within the buffer's excess over its floor (ggml-alloc's holes, at
//! most 43.8 MiB in the MoE, 8 MiB in llama3-8b and 15.8 MiB in phi3-mini up to 65,536
//! positions) worth of KV cache and pool below where it starts, at a replay (0.02–1 ms) per
//! context. Both steps assume what the bisection always did: with a given compute buffer, a
//! longer context never needs less, and more room never hurts.
//!
//! Whether a context fits takes two dry runs, of the prompt that fills it and of the one
//! ending in the worst short ubatch; they run at once, on two threads.

use super::{pool_peaks, room_beside, simulate_beside, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::profiled::LayerBytes;
use std::collections::HashMap;

/// Contexts are searched in multiples of this many tokens.
const STEP: usize = 256;

/// The length of the short last ubatch whose requests are the largest at the full context
/// (cupool's scratch, or the engine profile's requests among the tails it models), or `None`.
/// `bytes` answers for `cfg`'s profile (kept across the contexts a search tries).
fn worst_tail(cfg: &RunConfig, bytes: &mut LayerBytes) -> Option<usize> {
    let attn = cfg.model.attn();
    let n_kv = cupool_kernels::fa::n_kv(cfg.n_ctx, cfg.n_ctx);
    let mut tails = Vec::with_capacity(cfg.n_ubatch);
    for t in 1..cfg.n_ubatch.min(cfg.n_ctx) {
        let bytes = match bytes.of(t, n_kv) {
            Some(Some(b)) => b,
            Some(None) => {
                cupool_kernels::fa::scratch(&attn, cfg.kv_type, t, n_kv, cfg.sms).total_bytes()
            }
            None => continue,
        };
        tails.push((bytes, t));
    }
    tails.into_iter().max().map(|(_, t)| t)
}

/// The prompt that ends in the worst tail, if one is shorter than the context.
fn tail_prompt(cfg: &RunConfig, bytes: &mut LayerBytes) -> Option<usize> {
    match worst_tail(cfg, bytes) {
        Some(t) if cfg.n_ctx > t => Some((cfg.n_ctx - t) / cfg.n_ubatch * cfg.n_ubatch + t),
        _ => None,
    }
}

/// The worst pool peak any prompt up to the full context can reach, on a card the pool never
/// fills.
pub fn worst_case_pool_peak(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, RuntimeError> {
    let full = pool_peaks(cfg, target, cfg.n_ctx)?.0;
    let short = match tail_prompt(cfg, &mut LayerBytes::new(cfg)) {
        Some(p) => pool_peaks(cfg, target, p)?.0,
        None => 0,
    };
    Ok(full.max(short))
}

/// Whether every prompt up to a context of `n_ctx` completes from `target`'s free memory (the
/// one that fills it and the one ending in the worst short ubatch) beside a compute buffer of
/// `compute` bytes: the context's own, or its floor. `bytes` answers for `cfg`'s profile.
fn fits_beside(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_ctx: usize,
    compute: usize,
    bytes: &mut LayerBytes,
) -> Result<bool, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    let (w, kv) = c.resident_bytes(n_ctx);
    let buffers = (w, kv, compute);
    let completes = |n_prompt: usize| -> Result<bool, RuntimeError> {
        Ok(simulate_beside(&c, target, n_prompt, buffers)?
            .stop
            .is_none())
    };
    let Some(p) = tail_prompt(&c, bytes) else {
        return completes(n_ctx);
    };
    // The two prompts at once, on two threads: the search's time is these dry runs. The
    // shorter one runs as long as the other even where the longer stops early (both see the
    // same ubatches up to the shorter's last batch), so waiting for it costs nothing. The
    // answer is the sequential one: the tail's result counts only where the full prompt
    // completes (and where no thread can be had, the tail runs after it, as it did).
    std::thread::scope(|s| {
        let tail = std::thread::Builder::new().spawn_scoped(s, || completes(p));
        let full = completes(n_ctx);
        let tail = match tail {
            Ok(t) => t
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) if matches!(full, Ok(true)) => completes(p),
            Err(_) => Ok(false),
        };
        Ok(full? && tail?)
    })
}

/// The largest context, in multiples of 256 up to [`crate::config::MAX_CTX`], whose prompts
/// all complete; `None` if none does. Exact where the compute buffer is not monotone in the
/// context (see the module docs).
pub fn max_ctx_that_fits(
    cfg: &RunConfig,
    target: &PlanTarget,
) -> Result<Option<usize>, RuntimeError> {
    max_ctx_above(cfg, target, &|| 0)
}

/// [`max_ctx_that_fits`] where only an answer above `above()` counts (the advice's other
/// settings, against the largest context found so far, which may grow meanwhile): the answer
/// if it is above `above()`, else `None`. The search stops as soon as every context it can
/// still answer is at most `above()`, the dry runs up to there the same; it stops early only
/// where none of the dry runs it leaves out could fail (the engine profile refuses no ubatch it
/// could ask), so an error comes back as it did.
pub(crate) fn max_ctx_above(
    cfg: &RunConfig,
    target: &PlanTarget,
    above: &dyn Fn() -> usize,
) -> Result<Option<usize>, RuntimeError> {
    Ok(search(cfg, target, above)?.filter(|&m| m > above()))
}

/// [`max_ctx_above`]'s search: the answer, or `None` where none fits or where it stopped early.
fn search(
    cfg: &RunConfig,
    target: &PlanTarget,
    above: &dyn Fn() -> usize,
) -> Result<Option<usize>, RuntimeError> {
    const LIMIT: usize = crate::config::MAX_CTX;
    let floor = |c: usize| cfg.compute_floor_bytes(c);
    // The start-up buffers with the floor, beside what lies outside them: no dry run.
    let static_fits = |c: usize| {
        let (w, kv) = cfg.resident_bytes(c);
        room_beside(target, (w, kv, floor(c))).is_ok()
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
    if s_lo == 0 {
        return Ok(None);
    }
    let mut walk = Walk {
        cfg,
        target,
        buffer: HashMap::new(),
        fits: HashMap::new(),
        above,
        refuses_nothing: None,
        bytes: LayerBytes::new(cfg),
    };
    // The exact start-up buffers, downwards from the floor's bound (a few contexts, where the
    // buffer is above its floor): none above `bound` starts. When the pool fits beside them
    // there, that is the answer, with one dry run.
    let Some(bound) = walk.starts_at_or_below(s_lo * STEP) else {
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
        if !walk.fits_floor(STEP)? {
            return Ok(None);
        }
        let mut lo = STEP;
        while lo * 2 < bound && walk.fits_floor(lo * 2)? {
            lo *= 2;
        }
        let mut hi = (lo * 2).min(bound);
        // lo fits beside the floor, hi does not.
        while hi - lo > STEP {
            // `top` ends below `hi`.
            if walk.answers_at_most(hi - STEP) {
                return Ok(None);
            }
            let mid = (lo + hi) / 2 / STEP * STEP;
            if walk.fits_floor(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    // Where the buffer is its floor, `top` fits as it did beside the floor.
    if walk.compute(top) == floor(top) {
        return Ok(Some(top));
    }
    walk.largest_from(top)
}

/// The exact search below the bound: each context's own compute buffer, replayed once.
struct Walk<'a> {
    cfg: &'a RunConfig,
    target: &'a PlanTarget,
    /// Each context's compute buffer.
    buffer: HashMap<usize, usize>,
    /// Whether each context probed fits.
    fits: HashMap<usize, bool>,
    /// Only an answer above this counts ([`max_ctx_above`]).
    above: &'a dyn Fn() -> usize,
    /// Whether no dry run can fail (its pool is one the device has, and the engine profile
    /// refuses no ubatch it could ask), once asked.
    refuses_nothing: Option<bool>,
    /// The profile's bytes for the short last ubatches.
    bytes: LayerBytes,
}

impl Walk<'_> {
    /// Whether the search may stop with no answer, every answer it has left being at most
    /// `most`: only one above `above()` counts, and where no dry run left out could fail.
    fn answers_at_most(&mut self, most: usize) -> bool {
        let (cfg, vmm) = (self.cfg, self.target.vmm);
        most <= (self.above)()
            && *self.refuses_nothing.get_or_insert_with(|| {
                cfg.pool.resolve(vmm).is_ok() && crate::profiled::refuses_no_ubatch(cfg)
            })
    }

    fn compute(&mut self, n_ctx: usize) -> usize {
        let cfg = self.cfg;
        *self
            .buffer
            .entry(n_ctx)
            .or_insert_with(|| cfg.compute_buffer_bytes(n_ctx))
    }

    fn fits(&mut self, n_ctx: usize) -> Result<bool, RuntimeError> {
        if let Some(&f) = self.fits.get(&n_ctx) {
            return Ok(f);
        }
        let compute = self.compute(n_ctx);
        let f = fits_beside(self.cfg, self.target, n_ctx, compute, &mut self.bytes)?;
        self.fits.insert(n_ctx, f);
        Ok(f)
    }

    /// Whether every prompt up to `n_ctx` completes beside the floor of its compute buffer.
    fn fits_floor(&mut self, n_ctx: usize) -> Result<bool, RuntimeError> {
        let floor = self.cfg.compute_floor_bytes(n_ctx);
        fits_beside(self.cfg, self.target, n_ctx, floor, &mut self.bytes)
    }

    /// The largest context at or below `bound` whose start-up buffers fit beside what lies
    /// outside them; `None` if none does.
    fn starts_at_or_below(&mut self, bound: usize) -> Option<usize> {
        (1..=bound / STEP).rev().map(|s| s * STEP).find(|&c| {
            let (w, kv) = self.cfg.resident_bytes(c);
            let compute = self.compute(c);
            room_beside(self.target, (w, kv, compute)).is_ok()
        })
    }

    /// The largest context from `lo` (which fits) below `fail` (which does not), both in one
    /// run of contexts whose buffer does not decrease: there whether a context fits is monotone.
    fn bisect(&mut self, mut lo: usize, mut fail: usize) -> Result<Option<usize>, RuntimeError> {
        while fail - lo > STEP {
            // The answer is below `fail`.
            if self.answers_at_most(fail - STEP) {
                return Ok(None);
            }
            let mid = (lo + fail) / 2 / STEP * STEP;
            if self.fits(mid)? {
                lo = mid;
            } else {
                fail = mid;
            }
        }
        Ok(Some(lo))
    }

    /// The largest context at or below `top` that fits, when none above `top` does: run by run
    /// downwards, each run probed at its top, at doubling distances below it and at its bottom.
    fn largest_from(&mut self, top: usize) -> Result<Option<usize>, RuntimeError> {
        let mut hi = top;
        loop {
            // What is left to answer is at most `hi`.
            if self.answers_at_most(hi) {
                return Ok(None);
            }
            // Every context above `hi` fails; the run goes down from `hi` while the buffer
            // does not grow below.
            let mut fail = hi + STEP;
            let (mut c, mut probe, mut gap) = (hi, hi, STEP);
            loop {
                if c == probe {
                    if self.fits(c)? {
                        return self.bisect(c, fail);
                    }
                    fail = c;
                    // What is left to answer is below `fail`.
                    if self.answers_at_most(fail - STEP) {
                        return Ok(None);
                    }
                    probe = c.saturating_sub(gap);
                    gap *= 2;
                }
                if c == STEP || self.compute(c - STEP) > self.compute(c) {
                    break;
                }
                c -= STEP;
            }
            // `c` is the run's bottom: if it fails, so does the whole run.
            if fail != c && self.fits(c)? {
                return self.bisect(c, fail);
            }
            if c == STEP {
                return Ok(None);
            }
            hi = c - STEP;
        }
    }
}

/// Whether every prompt up to a context of `n_ctx` completes beside its own compute buffer.
#[cfg(test)]
fn fits(cfg: &RunConfig, target: &PlanTarget, n_ctx: usize) -> Result<bool, RuntimeError> {
    let compute = cfg.compute_buffer_bytes(n_ctx);
    fits_beside(cfg, target, n_ctx, compute, &mut LayerBytes::new(cfg))
}

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
