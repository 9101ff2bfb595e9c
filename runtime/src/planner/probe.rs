//! A probe of the search for the largest context: whether every prompt up to a context
//! completes from the free memory, beside a given compute buffer: the prompt that fills the
//! context and the one ending in the worst short ubatch (short ubatches split the KV range and
//! take `dst_tmp`); under a legacy pool never purged or purged `auto`, every prompt ending in a
//! short ubatch (`tail.rs`). Where the pool keeps snapshots (legacy and vmm) they run in one dry
//! run, what they share once (`dry::dry_runs`); else in two, at once on two threads.

use super::dry::{dry_runs, keeps_snapshots};
use super::scout::Scout;
use super::tail::{every_tail_prompt, tail_prompt};
use super::{pool_peaks, room_beside, simulate_beside, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::profiled::LayerBytes;
use cupool_pool::driver::sim::MAX_CAPACITY;

/// Contexts are searched in multiples of this many tokens.
pub(crate) const STEP: usize = 256;

/// The worst pool peak any prompt up to the full context can reach, on a card the pool never
/// fills.
pub fn worst_case_pool_peak(cfg: &RunConfig, target: &PlanTarget) -> Result<usize, RuntimeError> {
    if keeps_snapshots(cfg, target) {
        let bytes = &mut LayerBytes::new(cfg);
        let mut prompts = match every_tail_prompt(cfg, target, bytes) {
            Some(every) => every,
            None => tail_prompt(cfg, target, bytes).into_iter().collect(),
        };
        prompts.push(cfg.n_ctx);
        let runs = dry_runs(cfg, target, &prompts, MAX_CAPACITY)?;
        if runs.iter().any(|r| !r.completed) {
            return Err(RuntimeError::Invalid(
                "the dry run ran out of a 256 TiB simulated card".into(),
            ));
        }
        return Ok(runs
            .iter()
            .map(|r| r.peak_reserved_bytes)
            .max()
            .unwrap_or(0));
    }
    let full = pool_peaks(cfg, target, cfg.n_ctx)?.0;
    let short = match tail_prompt(cfg, target, &mut LayerBytes::new(cfg)) {
        Some(p) => pool_peaks(cfg, target, p)?.0,
        None => 0,
    };
    Ok(full.max(short))
}

/// Whether every prompt up to a context of `n_ctx` completes from `target`'s free memory (the
/// one that fills it and those ending in short ubatches the module docs name) beside a compute buffer of
/// `compute` bytes: the context's own, or its floor. Where they do, the bytes of the pool's
/// room their peaks left unused (the search predicts from them where the next probe goes);
/// `None` where one stops. `bytes` answers for `cfg`'s profile; `scout`, one of `cfg`'s runs
/// (`scout.rs`), where the search has one.
pub(crate) fn fits_beside(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_ctx: usize,
    compute: usize,
    bytes: &mut LayerBytes,
    scout: Option<&mut Scout>,
) -> Result<Option<usize>, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    let (w, kv) = c.resident_bytes(n_ctx);
    let buffers = (w, kv, compute);
    let room = room_beside(target, buffers).unwrap_or(0);
    // The slack where the prompt completes.
    let completes = |n_prompt: usize| -> Result<Option<usize>, RuntimeError> {
        let s = simulate_beside(&c, target, n_prompt, buffers)?;
        Ok(s.stop
            .is_none()
            .then(|| room.saturating_sub(s.peak_reserved)))
    };
    if keeps_snapshots(&c, target) {
        // The prompts in one dry run, what they share run once (`dry::dry_runs`): every tail
        // where the pool carries the earlier ubatches' buffers into the last (`tail.rs`).
        let mut prompts = match every_tail_prompt(&c, target, bytes) {
            Some(every) => every,
            None => tail_prompt(&c, target, bytes).into_iter().collect(),
        };
        let Ok(room) = room_beside(target, buffers) else {
            return Ok(None);
        };
        prompts.push(n_ctx);
        let runs = match scout {
            Some(s) => s.runs(&c, target, &prompts, room)?,
            None => dry_runs(&c, target, &prompts, room)?,
        };
        return Ok(runs.iter().all(|r| r.completed).then(|| {
            let peak = runs.iter().map(|r| r.peak_reserved_bytes).max();
            room.saturating_sub(peak.unwrap_or(0))
        }));
    }
    let Some(p) = tail_prompt(&c, target, bytes) else {
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
            Err(_) if matches!(full, Ok(Some(_))) => completes(p),
            Err(_) => Ok(None),
        };
        Ok(match (full?, tail?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        })
    })
}
