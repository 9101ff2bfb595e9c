//! What to do, in one line: the plan's answer to "will my context fit, and if not, what do I
//! change?". A context that does not fit as configured is tried with the other purge policies
//! (`CUPOOL_PURGE`), then the other pools (`GGML_POOL`), then smaller ubatches (`-ub`), each
//! a whole simulated run; when none fits, the largest context that fits as configured.

use super::search::max_ctx_above_after;
use super::walk::Made;
use super::{plan_only, Plan, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The plan's advice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Advice {
    /// The asked context fits as configured; the largest that does.
    Fits {
        /// The largest context that fits.
        max_ctx: Option<usize>,
    },
    /// A change of settings that makes the asked context fit, and the plan with it.
    Change {
        /// The settings, as a user writes them (`GGML_POOL=vmm CUPOOL_PURGE=auto`, `-ub 256`).
        settings: String,
        /// The plan with them.
        plan: Box<Plan>,
    },
    /// No setting tried makes it fit: the largest context that fits as configured (`None`:
    /// none does), and the settings under which a larger one fits, if any.
    Lower {
        /// The largest context that fits.
        max_ctx: Option<usize>,
        /// Settings with a larger context that fits, and that context.
        better: Option<(String, usize)>,
    },
}

/// The advice for `p`, the plan of `cfg` on `target` (its `max_ctx_that_fits` searched).
pub fn advise(cfg: &RunConfig, target: &PlanTarget, p: &Plan) -> Result<Advice, RuntimeError> {
    if p.fits {
        return Ok(Advice::Fits {
            max_ctx: p.max_ctx_that_fits,
        });
    }
    match changes(cfg, target, p.n_prompt)? {
        Tried::Change(a) => Ok(a),
        Tried::Search(searched) => lower(target, p, &searched, &NoneAhead),
    }
}

/// What trying the other settings on the asked prompt gave: one that makes it fit, or the
/// settings whose largest context is searched (the pool and purge settings at `cfg`'s ubatch).
pub(super) enum Tried {
    Change(Advice),
    Search(Vec<(RunConfig, String)>),
}

/// The other settings for a plan of `cfg` on `target` that does not fit, each tried on a prompt
/// of `n_prompt` tokens, the least change first; none of this reads the configured search's
/// answer, so it may run beside it (`ahead.rs`).
pub(super) fn changes(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<Tried, RuntimeError> {
    let kind = cfg.pool.resolve(target.vmm)?;
    let mut tries: Vec<(RunConfig, String)> = Vec::new();
    let with = |k: PoolKind, purge: PurgePolicy, ub: usize| {
        let mut c = cfg.clone();
        c.pool.kind = Some(k);
        c.purge = purge;
        c.n_ubatch = ub;
        c
    };
    // The least change first: the purge policy, then the pool, then the ubatch.
    for purge in [PurgePolicy::Auto, PurgePolicy::Always] {
        if purge != cfg.purge {
            let s = format!("GGML_POOL={} CUPOOL_PURGE={}", kind.name(), purge.name());
            tries.push((with(kind, purge, cfg.n_ubatch), s));
        }
    }
    let kinds = [PoolKind::Vmm, PoolKind::Legacy]
        .into_iter()
        .filter(|&k| k != kind && (k != PoolKind::Vmm || target.vmm && !cfg.pool.no_vmm));
    for k in kinds {
        for purge in [PurgePolicy::Auto, PurgePolicy::Always] {
            let s = format!("GGML_POOL={} CUPOOL_PURGE={}", k.name(), purge.name());
            tries.push((with(k, purge, cfg.n_ubatch), s));
        }
    }
    let mut ub = cfg.n_ubatch / 2;
    while ub >= 64 {
        let s = format!("-ub {ub} (GGML_POOL={} CUPOOL_PURGE=auto)", kind.name());
        tries.push((with(kind, PurgePolicy::Auto, ub), s));
        ub /= 2;
    }
    for (c, settings) in &tries {
        let q = plan_only(c, target, n_prompt)?;
        if q.fits {
            return Ok(Tried::Change(Advice::Change {
                settings: settings.clone(),
                plan: Box::new(q),
            }));
        }
    }
    tries.retain(|(c, _)| c.n_ubatch == cfg.n_ubatch);
    Ok(Tried::Search(tries))
}

/// What searches of the tries made before their start was known (`ahead.rs`): try `i`'s, once
/// (`Made::default()` where none was made), and the end of making more.
pub(super) trait Ahead: Sync {
    fn take(&self, i: usize) -> Made;
    /// No more is made ahead: the searches that need both cores start.
    fn close(&self);
}

/// Nothing made ahead.
struct NoneAhead;

impl Ahead for NoneAhead {
    fn take(&self, _: usize) -> Made {
        Made::default()
    }
    fn close(&self) {}
}

/// The advice where `p` does not fit and no try made it fit: the largest context as
/// configured, and the first of `searched` under which a larger one fits, if any.
pub(super) fn lower(
    target: &PlanTarget,
    p: &Plan,
    searched: &[(RunConfig, String)],
    ahead: &dyn Ahead,
) -> Result<Advice, RuntimeError> {
    // A probe's prompts run in one dry run where the pool keeps snapshots (the tries' legacy
    // and vmm pools do: `dry::dry_runs`), else two at a time: as many searches at once as that
    // leaves cores.
    let per_search = match searched
        .iter()
        .all(|(c, _)| super::dry::keeps_snapshots(c, target))
    {
        true => 1,
        false => 2,
    };
    let at_once = std::thread::available_parallelism().map_or(1, |n| n.get() / per_search);
    let configured = p.max_ctx_that_fits.unwrap_or(0);
    let answers = larger_contexts(searched, target, configured, (at_once, ahead));
    let mut better: Option<(String, usize)> = None;
    for ((_, settings), m) in searched.iter().zip(answers) {
        let best = better
            .as_ref()
            .map_or(p.max_ctx_that_fits.unwrap_or(0), |(_, b)| *b);
        if let Some(m) = m?.filter(|&m| m > best) {
            better = Some((settings.clone(), m));
        }
    }
    Ok(Advice::Lower {
        max_ctx: p.max_ctx_that_fits,
        better,
    })
}

/// The order [`larger_contexts`] searches `tries` in (indices): the vmm pool's first.
pub(super) fn search_order(tries: &[(RunConfig, String)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tries.len()).collect();
    order.sort_by_key(|&i| tries[i].0.pool.kind != Some(PoolKind::Vmm));
    order
}

/// The largest context of each of `tries` where it may beat `configured` and the tries before
/// it and reach those after it (`None` where it cannot: each search stops once it knows),
/// `at_once` searched at a time, each going on from what `ahead` made for it.
///
/// Only the first of the largest answers is used, so a try needs to beat the answers of the
/// tries before it and to reach those after it: its search stops once it cannot (a search that
/// stops early has run a prefix of the whole one, and answers as it would have where it beats
/// its bar). So the order they are searched in changes no answer the caller uses, and the
/// tries whose answers are usually the largest go first, to end the others' searches sooner:
/// the vmm pool's (it strands nothing). A try searched beside others knows only the answers
/// that have finished, a lower bar, so it may answer more, never less; the caller compares the
/// answers in order, as one after the other. What was made ahead changes no answer either: a
/// probe's result is its context's and buffer's alone.
fn larger_contexts(
    tries: &[(RunConfig, String)],
    target: &PlanTarget,
    configured: usize,
    (at_once, ahead): (usize, &dyn Ahead),
) -> Vec<Result<Option<usize>, RuntimeError>> {
    // The largest context each try has answered so far (0: none yet, or none above its bar).
    let found: Vec<AtomicUsize> = tries.iter().map(|_| AtomicUsize::new(0)).collect();
    let order = search_order(tries);
    // The first try searched alone, from the configured answer; the others start from the
    // larger of the two (the answers of the rest, still coming in, only end searches), so each
    // search's probes are the same however many run at once.
    let start = std::cell::Cell::new(configured);
    let search = |i: usize, start: usize| {
        let bar = || {
            let before = found[..i].iter().map(|f| f.load(Ordering::Relaxed));
            // A try after this one wins only with more: this one needs as much.
            let after = found[i + 1..]
                .iter()
                .map(|f| f.load(Ordering::Relaxed).saturating_sub(1));
            before.chain(after).fold(configured, usize::max)
        };
        let m = max_ctx_above_after(&tries[i].0, target, (start, &bar), ahead.take(i));
        if let Ok(Some(m)) = m {
            found[i].store(m, Ordering::Relaxed);
        }
        m
    };
    // (try, answer), in the order searched.
    let mut answers = Vec::with_capacity(tries.len());
    if let Some((&first, _)) = order.split_first() {
        let a = search(first, configured);
        if let Ok(Some(m)) = a {
            start.set(m.max(configured));
        }
        answers.push((first, a));
    }
    ahead.close();
    let start = start.get();
    // The rest from a queue, `at_once` at a time: each thread takes the next try as it ends
    // one (a slow search holds up no other).
    let rest = &order[answers.len()..];
    let next = AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::with_capacity(rest.len()));
    let work = || {
        while let Some(&i) = rest.get(next.fetch_add(1, Ordering::Relaxed)) {
            let a = search(i, start);
            // A poisoned list: a thread panicked, and its panic is resumed below.
            if let Ok(mut d) = done.lock() {
                d.push((i, a));
            }
        }
    };
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..at_once.clamp(1, rest.len().max(1)))
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(s, work).ok())
            .collect();
        work();
        for h in helpers {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
    });
    answers.extend(done.into_inner().unwrap_or_else(|e| e.into_inner()));
    answers.sort_by_key(|&(i, _)| i);
    answers.into_iter().map(|(_, a)| a).collect()
}

impl Advice {
    /// The advice as one line, with the numbers behind it (`ctx`: the asked context).
    pub fn line(&self, ctx: usize, p: &Plan) -> String {
        let gib = |b: usize| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
        let free = gib(p.device_bytes);
        match self {
            Self::Fits { max_ctx } => format!(
                "to do: nothing: -c {ctx} fits, peak {} of {free} free{}",
                gib(p.peak_device_bytes),
                max_ctx.map_or(String::new(), |m| format!(
                    "; the largest -c that fits as configured is {m}"
                ))
            ),
            Self::Change { settings, plan } => format!(
                "to do: set {settings}: -c {ctx} then fits, peak {} of {free} free",
                gib(plan.peak_device_bytes)
            ),
            Self::Lower {
                max_ctx: Some(m),
                better,
            } => format!(
                "to do: lower -c to {m}, the largest that fits as configured{} (-c {ctx} needs more than {free}; no pool, purge policy or smaller -ub makes it fit)",
                better.as_ref().map_or(String::new(), |(s, b)| format!(
                    ", or to {b} with {s}"
                ))
            ),
            Self::Lower {
                max_ctx: None,
                better: Some((s, b)),
            } => format!(
                "to do: set {s} and lower -c to {b}: nothing fits as configured in {free}"
            ),
            Self::Lower { max_ctx: None, .. } => format!(
                "to do: free more memory: no context fits in {free} (the weights {} and what lies outside the buffers {} alone)",
                gib(p.weights_bytes),
                gib(p.outside.at_compute())
            ),
        }
    }
}

#[cfg(test)]
#[path = "advice_tests.rs"]
mod tests;
