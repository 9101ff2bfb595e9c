//! Startup owns what it allocates: a failure at any startup step leaves nothing behind.
use cupool_kernels::KvType;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::{PoolConfig, PoolKind};
use cupool_runtime::executor::cpu::CpuExecutor;
use cupool_runtime::executor::dry_run::DryRun;
use cupool_runtime::{RunConfig, Runtime, RuntimeError};
use std::sync::Arc;

mod common;
use common::small_model;

fn cfg(kind: PoolKind) -> RunConfig {
    let mut c = RunConfig::new(small_model(), 1024);
    c.n_batch = 128;
    c.n_ubatch = 64;
    c.kv_type = KvType::Q8_0;
    c.pool = PoolConfig::default().kind(kind);
    c
}

fn card(vmm: bool) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::gib(1.0).vmm(vmm).record_calls(false)).unwrap())
}

#[test]
fn a_failed_startup_allocation_frees_the_earlier_ones() {
    for n in 1..=3 {
        let dev = card(true);
        let faults = Arc::new(FaultInjector::new(dev.clone()));
        faults.fail_nth(CallKind::Malloc, n, ErrorCode::Injected);
        let e = Runtime::new(faults, cfg(PoolKind::Vmm), Box::new(DryRun)).unwrap_err();
        assert!(
            matches!(e, RuntimeError::DoesNotFit { .. }),
            "malloc #{n}: {e}"
        );
        assert!(
            std::error::Error::source(&e).is_some(),
            "the driver error is the source"
        );
        assert!(
            dev.ledger().is_empty(),
            "malloc #{n}: leaked {:?}",
            dev.ledger()
        );
    }
}

#[test]
fn a_pool_that_cannot_be_built_frees_the_startup_memory() {
    let dev = card(false);
    let e = Runtime::new(dev.clone(), cfg(PoolKind::Vmm), Box::new(DryRun)).unwrap_err();
    assert!(e.to_string().contains("virtual memory management"), "{e}");
    assert!(dev.ledger().is_empty(), "leaked {:?}", dev.ledger());
}

#[test]
fn a_failed_model_init_frees_the_startup_memory_and_the_pool() {
    // The executor works on another card: the runtime's buffers are not memory it can touch.
    let dev = card(true);
    let other = card(true);
    let exec = Box::new(CpuExecutor::new(other).unwrap());
    let e = Runtime::new(dev.clone(), cfg(PoolKind::Legacy), exec).unwrap_err();
    assert!(e.to_string().contains("not live"), "{e}");
    assert!(dev.ledger().is_empty(), "leaked {:?}", dev.ledger());
}

#[test]
fn a_finished_runtime_gives_everything_back() {
    for kind in PoolKind::ALL {
        let dev = card(true);
        let driver: Arc<dyn Driver> = dev.clone();
        let mut rt = Runtime::new(
            driver,
            cfg(*kind),
            Box::new(CpuExecutor::new(dev.clone()).unwrap()),
        )
        .unwrap();
        assert!(rt.prefill(300).unwrap().completed);
        drop(rt);
        assert!(dev.ledger().is_empty(), "{kind}: leaked {:?}", dev.ledger());
    }
}
