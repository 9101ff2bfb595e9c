//! The budget warning fires exactly once per crossing. In a binary of its own, with a global
//! subscriber: tracing caches each call site's interest, which makes capturing through a
//! thread-scoped subscriber unreliable while other tests run in parallel.
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::PoolKind;
use cupool_runtime::executor::dry_run::DryRun;
use cupool_runtime::*;
use std::sync::{Arc, Mutex};

mod common;

/// Collects tracing warnings.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);
impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn budget_warning_fires_once_per_crossing() {
    let capture = Capture::default();
    let sink = capture.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .init();
    let mut cfg = common::small_cfg(PoolKind::Legacy);
    cfg.purge = PurgePolicy::Always;
    // Room for the scratch of the early ubatches, not the later ones.
    cfg.margin_bytes = 150 << 10;
    let device: Arc<dyn Driver> =
        Arc::new(SimDevice::new(SimConfig::gib(1.0).backed(false)).unwrap());
    let mut rt = Runtime::new(device, cfg, Box::new(DryRun)).unwrap();
    let report = rt.prefill(1000).unwrap();
    let log = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let warned = log.matches("compute budget exceeded").count();
    let mut crossings = 0;
    let mut over = false;
    for u in &report.ubatches {
        let hw = report.compute_bytes + u.reserved_bytes;
        assert_eq!(u.over_budget, hw > u.budget_bytes, "ubatch {}", u.index);
        if u.over_budget && !over {
            crossings += 1;
        }
        over = u.over_budget;
    }
    assert!(crossings >= 1, "the scenario must cross the budget");
    assert!(
        report.ubatches.iter().any(|u| !u.over_budget),
        "and start below it"
    );
    assert_eq!(warned, crossings, "one warning per crossing:\n{log}");
    assert_eq!(report.budget_warnings, crossings);
    // A purging run that only overshoots its small margin completes: the warning says so.
    assert!(report.completed);
    assert!(log.contains("the rest of the prefill still fits"), "{log}");
    assert_eq!(report.projected_oom_at_token, None);
}
