//! What to do, in one line: the plan's answer to "will my context fit, and if not, what do I
//! change?". A context that does not fit as configured is tried with the other purge policies
//! (`CUPOOL_PURGE`), then the other pools (`GGML_POOL`), then smaller ubatches (`-ub`), each
//! a whole simulated run; when none fits, the largest context that fits as configured.

use super::{plan_only, Plan, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use crate::policy::PurgePolicy;
use cupool_pool::PoolKind;

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
        let q = plan_only(c, target, p.n_prompt)?;
        if q.fits {
            return Ok(Advice::Change {
                settings: settings.clone(),
                plan: Box::new(q),
            });
        }
    }
    // The pool and purge settings under which the largest context fits, if larger.
    let mut better: Option<(String, usize)> = None;
    for (c, settings) in tries.iter().filter(|(c, _)| c.n_ubatch == cfg.n_ubatch) {
        let m = super::max_ctx_that_fits(c, target)?;
        if let Some(m) = m.filter(|&m| m > p.max_ctx_that_fits.unwrap_or(0)) {
            if better.as_ref().is_none_or(|(_, b)| m > *b) {
                better = Some((settings.clone(), m));
            }
        }
    }
    Ok(Advice::Lower {
        max_ctx: p.max_ctx_that_fits,
        better,
    })
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
