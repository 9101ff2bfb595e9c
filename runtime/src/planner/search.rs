//! The largest context that fits, and the worst pool peak over every prompt length: a prompt
//! that fills the context, and one whose last, short ubatch takes the most (short ubatches
//! split the KV range and take `dst_tmp`).

use super::{pool_peaks, simulate, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;

/// Contexts are searched in multiples of this many tokens.
const STEP: usize = 256;

/// The length of the short last ubatch whose requests are the largest at the full context
/// (cupool's scratch, or the engine profile's requests among the tails it models), or `None`.
fn worst_tail(cfg: &RunConfig) -> Option<usize> {
    let attn = cfg.model.attn();
    let n_kv = cupool_kernels::fa::n_kv(cfg.n_ctx, cfg.n_ctx);
    let mut tails = Vec::with_capacity(cfg.n_ubatch);
    for t in 1..cfg.n_ubatch.min(cfg.n_ctx) {
        let bytes = match crate::profiled::layer_bytes(cfg, t, n_kv) {
            Ok(Some(b)) => b,
            Ok(None) => {
                cupool_kernels::fa::scratch(&attn, cfg.kv_type, t, n_kv, cfg.sms).total_bytes()
            }
            Err(_) => continue,
        };
        tails.push((bytes, t));
    }
    tails.into_iter().max().map(|(_, t)| t)
}

/// The prompt that ends in the worst tail, if one is shorter than the context.
fn tail_prompt(cfg: &RunConfig) -> Option<usize> {
    match worst_tail(cfg) {
        Some(t) if cfg.n_ctx > t => Some((cfg.n_ctx - t) / cfg.n_ubatch * cfg.n_ubatch + t),
        _ => None,
    }
}

/// The worst pool peak any prompt up to the full context can reach, on a card the pool never
/// fills.
pub fn worst_case_pool_peak(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, RuntimeError> {
    let full = pool_peaks(cfg, target, cfg.n_ctx)?.0;
    let short = match tail_prompt(cfg) {
        Some(p) => pool_peaks(cfg, target, p)?.0,
        None => 0,
    };
    Ok(full.max(short))
}

/// Whether every prompt up to a context of `n_ctx` completes from `target`'s free memory: the
/// one that fills it and the one ending in the worst short ubatch.
fn fits(cfg: &RunConfig, target: &PlanTarget, n_ctx: usize) -> Result<bool, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    if simulate(&c, target, n_ctx)?.stop.is_some() {
        return Ok(false);
    }
    Ok(match tail_prompt(&c) {
        Some(p) => simulate(&c, target, p)?.stop.is_none(),
        None => true,
    })
}

/// The largest context, in multiples of 256, whose prompts all complete; `None` if none does.
pub fn max_ctx_that_fits(
    cfg: &RunConfig,
    target: &PlanTarget,
) -> Result<Option<usize>, RuntimeError> {
    const LIMIT: usize = crate::config::MAX_CTX;
    // The start-up buffers and what lies outside them bound the answer without a dry run; when
    // the pool fits beside them there, that is the answer, found with one dry run.
    let o = &target.outside;
    let beside = o.at_startup().max(o.at_compute());
    let static_fits = |c: usize| {
        let (w, kv, compute) = cfg.startup_bytes(c);
        w + kv + compute + beside <= target.free_bytes
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
    let bound = s_lo * STEP;
    if bound < STEP || !fits(cfg, target, STEP)? {
        return Ok(None);
    }
    if fits(cfg, target, bound)? {
        return Ok(Some(bound));
    }
    let mut lo = STEP;
    while lo * 2 <= bound && fits(cfg, target, lo * 2)? {
        lo *= 2;
    }
    let mut hi = (lo * 2).min(bound);
    // lo fits, hi does not.
    while hi - lo > STEP {
        let mid = (lo + hi) / 2 / STEP * STEP;
        if fits(cfg, target, mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}
