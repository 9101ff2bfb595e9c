//! The prompt ending in the short last ubatch that takes the most from the pool: the search
//! checks it beside the prompt that fills the context, so that every prompt up to the context
//! completes. Prompts of one context share every ubatch but their last, so the one to check is
//! the one whose last ubatch makes the pool peak highest.
//!
//! A profile's short ubatches do not grow steadily with their tokens: where the flash
//! attention splits the KV range it takes `dst_tmp`, and a tail just below that threshold holds
//! more at once than a longer one (mainline at 496 tokens of 512 held 8.5 MiB more than at 497;
//! ik_llama.cpp's 257-384 more than 511). So the candidates are the longest tail of each run of
//! tails the profile computes one way (as many requests, the most held at once not falling),
//! and the longest of all; each candidate's ubatch runs alone on a fresh
//! pool of the run's kind, and the one whose pool peaks highest is checked (the longest of a
//! tie). Over a VMM pool (whose peak is the most its ubatches hold at once) that is the prompt
//! that peaks highest (`tail_tests.rs` checks every tail of the profiles, by brute force).
//!
//! Over a legacy pool it is not always: best fit and the 1.05 growth strand buffers differently
//! from one token count to the next, so the peak can fall inside a run, and a pool that keeps
//! its buffers carries the earlier ubatches' into the last. A brute force over contexts of
//! 1,024-16,384 positions, ubatches of 256-2,048, both KV types and every purge found 30-odd
//! legacy cases where a prompt peaks above both checked ones (up to 25% of the pool's peak:
//! mainline, `always`, `-ub 512 -c 2048`, the 2,023-token prompt: 41.2 MiB against 32.8),
//! against 319 with the sum of the requests this replaced. A legacy pool purged `always` starts
//! every ubatch empty, so there every tail of a ubatch up to 512 tokens is ranked by its peak
//! alone on a fresh pool, which is the prompt's last ubatch's exactly (`tail_tests.rs` checks
//! it by brute force); larger ubatches keep the candidates, each tail being a dry run. A legacy pool
//! never purged or purged `auto` carries the earlier ubatches' buffers into the last, so no
//! tail alone says how its prompt peaks: for ubatches up to 512 tokens the search checks every
//! one ([`every_tail_prompt`]), their prompts run together, the ubatches they share once and
//! each one's own from a snapshot of the pool (`dry::dry_runs`); larger ubatches keep the
//! candidates. The candidates missed mainline's 4,336-token prompt at `-ub 512 -c 4352`, 68.3
//! MiB against 59.3 for those checked (`tail_tests.rs`).

use super::PlanTarget;
use crate::config::RunConfig;
use crate::fast_forward::FastForward;
use crate::policy::PurgePolicy;
use crate::profiled::{self, LayerBytes};
use cupool_pool::driver::sim::MAX_CAPACITY;
use cupool_pool::driver::Driver;
use cupool_pool::PoolKind;
use cupool_profiles::UbatchShape;
use std::sync::Arc;

/// At most this many candidates run alone: those holding the most at once.
const MOST_CANDIDATES: usize = 8;

/// Ubatches up to this many tokens have every tail of a legacy pool checked: ranked alone
/// where it is purged `always`, run from a snapshot of the shared ubatches otherwise.
const EVERY_TAIL_UP_TO: usize = 512;

/// The prompt of `cfg`'s context that ends in its worst short ubatch, if one is shorter than
/// the context. `bytes` answers for `cfg`'s profile (kept across the contexts a search tries).
pub(crate) fn tail_prompt(
    cfg: &RunConfig,
    target: &PlanTarget,
    bytes: &mut LayerBytes,
) -> Option<usize> {
    match worst_tail(cfg, target, bytes) {
        Some(t) if cfg.n_ctx > t => prompt_ending_in(cfg, t),
        _ => None,
    }
}

/// Every prompt of `cfg`'s context that ends in a short ubatch the profile accepts, where the
/// search checks them all (ubatches up to `EVERY_TAIL_UP_TO` tokens): a legacy pool never
/// purged or purged `auto` carries the earlier ubatches' buffers into the last, so which tail
/// peaks highest depends on them, and only a run of each says. Those runs share every ubatch
/// but their last one or two, which run from a snapshot of the pool (`dry::dry_runs`): a
/// ubatch each. `None` for the other pools (the tail they check is [`tail_prompt`]'s).
pub(crate) fn every_tail_prompt(
    cfg: &RunConfig,
    target: &PlanTarget,
    bytes: &mut LayerBytes,
) -> Option<Vec<usize>> {
    // Each tail costs a ubatch of its own at every probe: beyond `EVERY_TAIL_UP_TO` tokens a
    // ubatch keeps the candidates (every tail of a 4,096-token ubatch took a MoE plan from 1.0
    // to 3.2 s).
    if cfg.purge == PurgePolicy::Always
        || cfg.n_ubatch > EVERY_TAIL_UP_TO
        || cfg.pool.resolve(target.vmm) != Ok(PoolKind::Legacy)
    {
        return None;
    }
    let ub = cfg.n_ubatch;
    Some(
        (1..ub.min(cfg.n_ctx))
            .filter_map(|t| Some((prompt_ending_in(cfg, t)?, t)))
            .filter(|&(p, t)| {
                p < cfg.n_ctx
                    && bytes
                        .of(t, cupool_kernels::fa::n_kv(p, cfg.n_ctx))
                        .is_some()
            })
            .map(|(p, _)| p)
            .collect(),
    )
}

/// The longest prompt of `cfg`'s context whose last ubatch has `t` tokens (1 to `n_ubatch`),
/// if one has. A prompt is cut into batches of `n_batch` from its first token and each batch
/// into ubatches of `n_ubatch`, so its last ubatch has `t` tokens where its last batch's
/// `o` tokens are `t` more than a multiple of `n_ubatch` (where `n_batch` is a multiple of
/// `n_ubatch`: where the prompt is).
pub(crate) fn prompt_ending_in(cfg: &RunConfig, t: usize) -> Option<usize> {
    let (c, batch, ub) = (cfg.n_ctx, cfg.n_batch.max(1), cfg.n_ubatch.max(1));
    if t == 0 || t > ub || c == 0 {
        return None;
    }
    // The last batch of the whole context: where it starts, and its tokens.
    let base = (c - 1) / batch * batch;
    let o = c - base;
    if o >= t {
        return Some(base + o - (o - t) % ub);
    }
    // Else in the batch before, where there is one (`t` is at most a batch).
    let full = batch.min(c);
    (base >= batch && full >= t).then(|| base - batch + full - (full - t) % ub)
}

/// The length of the short last ubatch whose prompt peaks highest at the full context, or
/// `None` (no tail the profile accepts). Without a profile, cupool's own engine: the tail
/// whose flash-attention scratch is largest (its only request that grows with the tokens).
fn worst_tail(cfg: &RunConfig, target: &PlanTarget, bytes: &mut LayerBytes) -> Option<usize> {
    let attn = cfg.model.attn();
    // The KV length of the prompt ending in a tail of `t` tokens.
    let n_kv = |t: usize| {
        let prompt = prompt_ending_in(cfg, t).unwrap_or(t);
        cupool_kernels::fa::n_kv(prompt, cfg.n_ctx)
    };
    let tails = 1..cfg.n_ubatch.min(cfg.n_ctx);
    if !bytes.profiled() {
        return tails
            .map(|t| {
                let s = cupool_kernels::fa::scratch(&attn, cfg.kv_type, t, n_kv(t), cfg.sms);
                (s.total_bytes(), t)
            })
            .max()
            .map(|(_, t)| t);
    }
    // (tokens, most held at once, requests) of each tail the profile accepts.
    let held: Vec<(usize, usize, usize)> = tails
        .filter_map(|t| {
            let h = bytes.of(t, n_kv(t)).flatten()?;
            Some((t, h.most, h.requests))
        })
        .collect();
    // A legacy pool purged `always` starts every ubatch empty (the boundary before it
    // released everything), so a prompt's last ubatch peaks as it does alone on a fresh pool:
    // every tail is ranked so, exactly (best fit and the 1.05 growth make the peak fluctuate
    // from one token count to the next, where the runs below miss it).
    // Each tail is a dry run of its own at every probe: beyond `EVERY_TAIL_UP_TO` tokens a
    // ubatch keeps the candidates below (every tail of a 4,096-token ubatch took a MoE plan
    // from 0.19 to 1.56 s).
    if cfg.purge == PurgePolicy::Always
        && cfg.n_ubatch <= EVERY_TAIL_UP_TO
        && cfg.pool.resolve(target.vmm) == Ok(PoolKind::Legacy)
    {
        let longest = held.last().map(|&(t, _, _)| t);
        return held
            .iter()
            .filter_map(|&(t, _, _)| Some((alone_peak(cfg, target, t, n_kv(t))?, t)))
            .max()
            .map(|(_, t)| t)
            .or(longest);
    }
    // The longest tail of each run computed one way (the requests grow with the tokens
    // there), and the longest of all.
    let mut candidates: Vec<(usize, usize)> = held
        .windows(2)
        .filter(|w| w[1].2 != w[0].2 || w[1].1 < w[0].1)
        .map(|w| (w[0].0, w[0].1))
        .chain(held.last().map(|&(t, most, _)| (t, most)))
        .collect();
    if candidates.len() > MOST_CANDIDATES {
        candidates.sort_unstable_by_key(|&(t, most)| std::cmp::Reverse((most, t)));
        candidates.truncate(MOST_CANDIDATES);
    }
    if let [(t, _)] = candidates[..] {
        return Some(t);
    }
    let longest = candidates.iter().map(|&(t, _)| t).max();
    candidates
        .into_iter()
        .filter_map(|(t, _)| Some((alone_peak(cfg, target, t, n_kv(t))?, t)))
        .max()
        .map(|(_, t)| t)
        .or(longest)
}

/// The pool's peak when the last ubatch of a prompt, `n_tokens` over `n_kv` positions, runs
/// alone on a fresh pool of `cfg`'s kind on a simulated `target` it never fills; `None` where
/// the run cannot say (no profile, or the profile refuses the ubatch).
fn alone_peak(cfg: &RunConfig, target: &PlanTarget, n_tokens: usize, n_kv: usize) -> Option<usize> {
    let (profile, setup) = profiled::setup(cfg).ok()??;
    // Layers that repeat one that made no driver call are skipped, as in a dry run.
    let counted = super::dry_device(target, MAX_CAPACITY).ok()?;
    let driver: Arc<dyn Driver> = counted.clone();
    let mut owned = None;
    let cfg = super::dry::reproducible_ref(cfg, &mut owned);
    let pool = crate::engine::build_pool(cfg, driver).ok()?;
    let u = UbatchShape {
        n_tokens,
        n_kv,
        n_outputs: 1,
    };
    let ff = FastForward::new(Some(counted));
    profiled::take_ubatch((pool.as_ref(), false), u, (profile, setup), &ff, None).ok()?;
    Some(pool.stats().reserved_peak_bytes)
}

#[cfg(test)]
#[path = "tail_tests.rs"]
mod tests;
