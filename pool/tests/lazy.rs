//! A device opened on its first use: nothing opens it before a pool needs memory, a synchronize
//! of a device never opened waits for nothing, it is opened once however many pools and threads
//! race to use it, and a device that cannot be opened fails each call, and each pool built on
//! it, with its reason.
mod common;

use cupool_pool::driver::lazy::LazyDriver;
use cupool_pool::driver::{CallKind, Driver, DriverError, ErrorCode};
use cupool_pool::pools::{NcclPool, VmmPool};
use cupool_pool::{synchronize, Pool, Purge};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::MIB;

fn counted(opens: Arc<AtomicUsize>) -> Arc<LazyDriver> {
    Arc::new(LazyDriver::new(
        3,
        Box::new(move |_| {
            opens.fetch_add(1, Ordering::SeqCst);
            Ok(common::sim(1.0) as Arc<dyn Driver>)
        }),
    ))
}

#[test]
fn a_device_opens_at_the_first_allocation_and_once() {
    let opens = Arc::new(AtomicUsize::new(0));
    let lazy = counted(opens.clone());
    let d: Arc<dyn Driver> = lazy.clone();
    assert_eq!(d.ordinal(), 3);
    // A synchronize (every purge takes one) of a device never opened opens nothing.
    let token = synchronize(d.as_ref()).unwrap();
    assert!(!lazy.is_open());
    let pools: Vec<Arc<dyn Pool>> = vec![
        Arc::new(VmmPool::new(d.clone())),
        Arc::new(NcclPool::new(d.clone())),
    ];
    for p in &pools {
        p.purge(&token, Purge::All).unwrap();
    }
    assert_eq!(opens.load(Ordering::SeqCst), 0, "no memory asked for yet");
    std::thread::scope(|s| {
        for p in &pools {
            for _ in 0..4 {
                s.spawn(|| {
                    let b = p.alloc(3 * MIB).unwrap();
                    p.free(b).unwrap();
                });
            }
        }
    });
    assert!(lazy.is_open());
    // Eight threads raced to the first use: it opened once.
    assert_eq!(opens.load(Ordering::SeqCst), 1);
    let b = pools[0].alloc(MIB).unwrap();
    pools[0].free(b).unwrap();
    assert_eq!(opens.load(Ordering::SeqCst), 1);
    let token = synchronize(d.as_ref()).unwrap();
    for p in &pools {
        p.purge(&token, Purge::All).unwrap();
        assert_eq!(p.stats().reserved_bytes, 0);
    }
}

#[test]
fn a_device_that_cannot_open_fails_each_use_with_its_reason() {
    let d: Arc<dyn Driver> = Arc::new(LazyDriver::new(
        1,
        Box::new(|i| {
            Err(DriverError::new(
                CallKind::Init,
                ErrorCode::LibraryMissing,
                format!("device {i}: no driver here"),
            ))
        }),
    ));
    assert!(!d.vmm_supported());
    // A pool is not built on it: the reason is the open's, not a guess at what it supports.
    for kind in [
        None,
        Some(cupool_pool::PoolKind::Vmm),
        Some(cupool_pool::PoolKind::Nccl),
    ] {
        let mut c = cupool_pool::PoolConfig::default();
        if let Some(k) = kind {
            c = c.kind(k);
        }
        let e = c.build(d.clone()).unwrap_err().to_string();
        assert!(e.contains("no driver here"), "{kind:?}: {e}");
    }
    assert!(d.name().contains("could not be opened"), "{}", d.name());
    let pool = cupool_pool::pools::LegacyPool::new(d.clone());
    let e = pool.alloc(MIB).unwrap_err().to_string();
    assert!(e.contains("no driver here"), "{e}");
    assert!(d.mem_info().is_err());
    assert_eq!(pool.stats().reserved_bytes, 0);
}
