//! The budget warning's projection of where the run dies, checked against where it dies.
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::{PoolConfig, PoolKind};
use cupool_runtime::executor::dry_run::DryRun;
use cupool_runtime::*;
use std::sync::Arc;

mod common;

/// The projection at the first crossing simulates the rest of the prefill under the run's own
/// pool and purge policy: on the simulated device the run dies exactly where it said, for
/// every pool, policy and card size, and a run that completes was projected to.
#[test]
fn the_projected_oom_token_is_where_the_run_dies() {
    let mut dies = 0;
    let mut checked = 0;
    let mut kinds_checked = std::collections::BTreeSet::new();
    for kind in [PoolKind::Legacy, PoolKind::Vmm] {
        for purge in [PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always] {
            for card_kib in (600..1_300).step_by(25) {
                let mut cfg = common::small_cfg(PoolKind::Legacy);
                cfg.pool = PoolConfig::default().kind(kind);
                cfg.purge = purge;
                cfg.margin_bytes = 0; // every run crosses at once: each one projects
                                      // A small VMM granularity, so that the VMM pool gets past its first ubatch.
                let mut sim = SimConfig::gib(0.0).backed(false).granularity(64 << 10);
                sim.capacity = card_kib << 10;
                let device: Arc<dyn Driver> = Arc::new(SimDevice::new(sim).unwrap());
                let mut rt = match Runtime::new(device, cfg, Box::new(DryRun)) {
                    Ok(rt) => rt,
                    Err(_) => continue, // the startup buffers do not fit this card
                };
                let r = rt.prefill(1000).unwrap();
                if r.budget_warnings == 0 {
                    continue;
                }
                checked += 1;
                assert_eq!(
                    r.projected_oom_at_token, r.oom_at_token,
                    "{kind:?} {purge:?} on {card_kib} KiB"
                );
                dies += usize::from(r.oom_at_token.is_some());
                kinds_checked.insert(format!("{kind:?}"));
            }
        }
    }
    assert!(checked > 100, "{checked} runs projected");
    assert_eq!(kinds_checked.len(), 2, "{kinds_checked:?}");
    assert!(
        dies > 5 && dies < checked,
        "{dies} of {checked} runs died: both outcomes are covered"
    );
}
