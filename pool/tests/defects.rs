//! Safety contracts the structure must keep, each once broken in an earlier design: atomic
//! admission under a limit, managed memory capped per device, stats consistent through faults,
//! configurations that never panic, an address space that never wraps, and a defined drop of a
//! pool with live blocks.
mod common;
use common::*;
use cupool_pool::adaptors::{ManagedFallback, Phases};
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::{
    CallKind, DevicePtr, DeviceShared, Driver, DriverError, ErrorCode, MemInfo, PhysHandle,
};
use cupool_pool::placement::slots::SlotsConfig;
use cupool_pool::pools::{LegacyConfig, LegacyPool, ManagedConfig, ManagedPool, VmmPool};
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Pool, PoolError, Purge};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts the device bytes held through it and their peak; each malloc dawdles a little, so
/// threads overlap between an admission check and the call that follows it.
#[derive(Debug)]
struct Meter {
    inner: Arc<dyn Driver>,
    held: AtomicUsize,
    peak: AtomicUsize,
    sizes: parking_lot::Mutex<std::collections::HashMap<u64, usize>>,
}

impl Meter {
    fn new(inner: Arc<dyn Driver>) -> Self {
        Self {
            inner,
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            sizes: Default::default(),
        }
    }
}

impl Driver for Meter {
    fn ordinal(&self) -> usize {
        0
    }
    fn name(&self) -> String {
        "meter".into()
    }
    fn shared(&self) -> &DeviceShared {
        self.inner.shared()
    }
    fn mem_info(&self) -> Result<MemInfo, DriverError> {
        self.inner.mem_info()
    }
    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        std::thread::sleep(std::time::Duration::from_micros(200));
        let p = self.inner.malloc(bytes)?;
        self.sizes.lock().insert(p, bytes);
        let now = self.held.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Ok(p)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        // Forget the address before the driver may hand it out again to another thread.
        let b = self.sizes.lock().remove(&ptr).unwrap_or(0);
        if let Err(e) = self.inner.free(ptr) {
            self.sizes.lock().insert(ptr, b);
            return Err(e);
        }
        self.held.fetch_sub(b, Ordering::SeqCst);
        Ok(())
    }
    fn malloc_managed(&self, bytes: usize) -> Result<DevicePtr, DriverError> {
        self.inner.malloc_managed(bytes)
    }
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DriverError> {
        self.inner.free_managed(ptr)
    }
    fn vmm_supported(&self) -> bool {
        false
    }
    fn granularity(&self) -> Result<usize, DriverError> {
        self.inner.granularity()
    }
    fn reserve(&self, bytes: usize, hint: DevicePtr) -> Result<DevicePtr, DriverError> {
        self.inner.reserve(bytes, hint)
    }
    fn release_reservation(&self, base: DevicePtr, bytes: usize) -> Result<(), DriverError> {
        self.inner.release_reservation(base, bytes)
    }
    fn map(&self, at: DevicePtr, bytes: usize) -> Result<PhysHandle, DriverError> {
        self.inner.map(at, bytes)
    }
    fn unmap(&self, at: DevicePtr, bytes: usize, h: PhysHandle) -> Result<(), DriverError> {
        self.inner.unmap(at, bytes, h)
    }
    fn synchronize_device(&self) -> Result<(), DriverError> {
        self.inner.synchronize_device()
    }
}

#[test]
fn a_limit_admits_atomically_under_concurrent_mallocs() {
    let meter = Arc::new(Meter::new(sim(4.0)));
    let limited = Arc::new(LimitedDriver::new(meter.clone(), 256 * MIB));
    std::thread::scope(|s| {
        for _ in 0..16 {
            let d = limited.clone();
            s.spawn(move || {
                let mut held = Vec::new();
                for _ in 0..8 {
                    if let Ok(p) = d.malloc(4 * MIB) {
                        held.push(p);
                    }
                }
                held.into_iter().for_each(|p| d.free(p).unwrap());
            });
        }
    });
    let peak = meter.peak.load(Ordering::SeqCst);
    assert!(
        peak <= 256 * MIB,
        "reached {} MiB under a 256 MiB limit",
        peak / MIB
    );
    assert_eq!(limited.used(), 0);
}

#[test]
fn pools_sharing_a_limit_stay_under_it() {
    let meter = Arc::new(Meter::new(sim(4.0)));
    let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(meter.clone(), 256 * MIB));
    std::thread::scope(|s| {
        for _ in 0..16 {
            let d = limited.clone();
            s.spawn(move || {
                let pool = LegacyPool::new(d);
                let blocks: Vec<_> = (0..8).filter_map(|_| pool.alloc(4 * MIB).ok()).collect();
                blocks.into_iter().for_each(|b| pool.free(b).unwrap());
            });
        }
    });
    let peak = meter.peak.load(Ordering::SeqCst);
    assert!(
        peak <= 256 * MIB,
        "reached {} MiB under a 256 MiB limit",
        peak / MIB
    );
}

#[test]
fn managed_memory_is_capped_across_live_blocks() {
    let dev = sim(1.0);
    let pool = ManagedPool::new(as_driver(&dev), ManagedConfig::default());
    let live: Vec<_> = (0..20).filter_map(|_| pool.alloc(900 * MIB).ok()).collect();
    assert_eq!(
        live.len(),
        1,
        "a 1 GiB card holds one 900 MiB managed block, not {}",
        live.len()
    );
    assert!(dev.ledger().managed_bytes <= GIB);
    live.into_iter().for_each(|b| pool.free(b).unwrap());
}

#[test]
fn managed_memory_is_capped_across_pools_and_the_fallback() {
    let dev = sim(1.0);
    let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(as_driver(&dev), 64 * MIB));
    let fallback = ManagedFallback::new(Arc::new(VmmPool::new(limited)), false);
    let managed = ManagedPool::new(as_driver(&dev), ManagedConfig::default());
    let mut live = Vec::new();
    for _ in 0..40 {
        if let Ok(b) = fallback.alloc(100 * MIB) {
            live.push((true, b));
        }
        if let Ok(b) = managed.alloc(100 * MIB) {
            live.push((false, b));
        }
    }
    let managed_bytes = dev.ledger().managed_bytes;
    assert!(
        managed_bytes <= GIB,
        "{} MiB of managed memory on a 1 GiB card",
        managed_bytes / MIB
    );
    assert!(managed_bytes >= 900 * MIB, "the cap is the card, not less");
    for (fb, b) in live {
        if fb {
            fallback.free(b).unwrap();
        } else {
            managed.free(b).unwrap();
        }
    }
    drop((fallback, managed));
    assert_eq!(dev.shared().managed.outstanding(), 0);
}

#[test]
fn oversubscription_only_when_allowed() {
    let dev = sim(1.0);
    let pool = ManagedPool::new(
        as_driver(&dev),
        ManagedConfig {
            allow_oversubscription: true,
        },
    );
    let live: Vec<_> = (0..3).map(|_| pool.alloc(900 * MIB).unwrap()).collect();
    live.into_iter().for_each(|b| pool.free(b).unwrap());
}

#[test]
fn a_trim_that_fails_halfway_counts_what_it_released() {
    let faults = Arc::new(FaultInjector::new(sim(1.0)));
    let pool = VmmPool::with_config(
        faults.clone(),
        VmmConfig {
            reserve_bytes: None,
            min_grow: 0,
            max_grow: 0,
            ..VmmConfig::default()
        },
    )
    .unwrap();
    let blocks: Vec<_> = (0..3).map(|_| pool.alloc(2 * MIB).unwrap()).collect();
    blocks.into_iter().rev().for_each(|b| pool.free(b).unwrap());
    assert_eq!(pool.stats().reserved_bytes, 6 * MIB);
    faults.fail_nth(CallKind::Unmap, 2, ErrorCode::Injected);
    let token = synchronize(faults.as_ref()).unwrap();
    assert!(pool.purge(&token, Purge::All).is_err());
    let s = pool.stats();
    assert_eq!(s.reserved_bytes, 4 * MIB);
    assert_eq!((s.purges, s.purged_bytes), (1, 2 * MIB));
    let token = synchronize(faults.as_ref()).unwrap();
    pool.purge(&token, Purge::All).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.reserved_bytes, s.purges, s.purged_bytes),
        (0, 2, 6 * MIB)
    );
}

#[test]
fn fallback_served_bytes_are_live_not_ooms() {
    let dev = sim(1.0);
    let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(as_driver(&dev), 64 * MIB));
    let fallback: Arc<dyn Pool> =
        Arc::new(ManagedFallback::new(Arc::new(VmmPool::new(limited)), false));
    let pool = Phases::new(fallback);
    pool.begin_phase("p");
    let blocks: Vec<_> = (0..5).map(|_| pool.alloc(30 * MIB).unwrap()).collect();
    let s = pool.stats();
    assert_eq!(s.ooms, 0, "every allocation was served");
    assert_eq!(s.fallbacks, 3);
    assert_eq!(s.live_bytes, 150 * MIB);
    assert_eq!(s.live_blocks, 5);
    assert!(s.reserved_bytes >= 150 * MIB);
    assert_eq!(pool.end_phase().unwrap().live_peak_bytes, 150 * MIB);
    blocks.into_iter().for_each(|b| pool.free(b).unwrap());
    assert_eq!(pool.stats().live_bytes, 0);
}

#[test]
fn every_bad_setting_is_an_error_naming_its_field() {
    let d = as_driver(&sim(1.0));
    let legacy = |placement: SlotsConfig| {
        LegacyPool::with_config(
            d.clone(),
            LegacyConfig {
                placement,
                ..LegacyConfig::default()
            },
        )
        .unwrap_err()
    };
    let vmm = |c: VmmConfig| VmmPool::with_config(d.clone(), c).unwrap_err();
    let cases: Vec<(PoolError, &str)> = vec![
        (
            legacy(SlotsConfig {
                slots: usize::MAX,
                ..Default::default()
            }),
            "LegacyConfig::slots",
        ),
        (
            legacy(SlotsConfig {
                slots: 0,
                ..Default::default()
            }),
            "LegacyConfig::slots",
        ),
        (
            legacy(SlotsConfig {
                look_ahead: 1e30,
                ..Default::default()
            }),
            "LegacyConfig::look_ahead",
        ),
        (
            legacy(SlotsConfig {
                look_ahead: f64::NAN,
                ..Default::default()
            }),
            "LegacyConfig::look_ahead",
        ),
        (
            legacy(SlotsConfig {
                rounding: 0,
                ..Default::default()
            }),
            "LegacyConfig::rounding",
        ),
        (
            vmm(VmmConfig {
                reserve_bytes: Some(usize::MAX),
                ..Default::default()
            }),
            "VmmConfig::reserve_bytes",
        ),
        (
            vmm(VmmConfig {
                min_grow: usize::MAX,
                ..Default::default()
            }),
            "VmmConfig::min_grow",
        ),
        (
            vmm(VmmConfig {
                max_grow: usize::MAX,
                ..Default::default()
            }),
            "VmmConfig::max_grow",
        ),
        (
            vmm(VmmConfig {
                large_rounding: 3 << 20,
                ..Default::default()
            }),
            "VmmConfig::large_rounding",
        ),
        (
            SimDevice::new(SimConfig::gib(1.0).granularity(0))
                .unwrap_err()
                .into(),
            "SimConfig::granularity",
        ),
        (
            SimDevice::new(SimConfig::gib(1.0).granularity(3 << 20))
                .unwrap_err()
                .into(),
            "SimConfig::granularity",
        ),
        (
            SimDevice::new(SimConfig::gib(f64::MAX)).unwrap_err().into(),
            "SimConfig::capacity",
        ),
        (
            SimDevice::new(SimConfig::gib(f64::NAN)).unwrap_err().into(),
            "SimConfig::capacity",
        ),
    ];
    for (e, field) in cases {
        let msg = e.to_string();
        assert!(msg.contains(field) && msg.contains("accepted"), "{msg}");
        assert!(
            std::error::Error::source(&e).is_some(),
            "{msg}: the detail is the source"
        );
    }
}

#[test]
fn the_unbacked_address_space_is_reused_and_never_wraps() {
    // The default dry-run card, many more pools than the fake address space held before.
    let dev: Arc<dyn Driver> =
        Arc::new(SimDevice::new(SimConfig::gib(80.0).backed(false)).unwrap());
    let first = VmmPool::new(dev.clone());
    let keep = first.alloc(MIB).unwrap();
    for _ in 0..20_000 {
        let p = VmmPool::new(dev.clone());
        let b = p.alloc(MIB).unwrap();
        assert_ne!(b.ptr(), keep.ptr());
        p.free(b).unwrap();
    }
    first.free(keep).unwrap();
    // Reservations that are never released run out with an error, never onto live addresses.
    let big = SimDevice::new(SimConfig::gib(256.0 * 1024.0).backed(false)).unwrap();
    let mut bases = std::collections::BTreeSet::new();
    let err = loop {
        match big.reserve(1 << 48, 0) {
            Ok(b) => assert!(bases.insert(b), "address {b:#x} handed out twice"),
            Err(e) => break e,
        }
        assert!(
            bases.len() < 1 << 16,
            "the fake address space never ran out"
        );
    };
    assert_eq!(err.code, ErrorCode::OutOfMemory, "{err}");
}

#[test]
fn dropping_a_pool_with_live_blocks_keeps_their_memory_until_they_go() {
    type Make = fn(Arc<dyn Driver>) -> Arc<dyn Pool>;
    let makers: [Make; 3] = [
        |d| Arc::new(VmmPool::new(d)),
        |d| Arc::new(LegacyPool::new(d)),
        |d| Arc::new(ManagedPool::new(d, ManagedConfig::default())),
    ];
    for make in makers {
        let dev = sim(1.0);
        let pool = make(as_driver(&dev));
        let kind = pool.kind();
        // Live below idle: a VMM range can only give back what lies above its live top.
        let live = pool.alloc(4 * MIB).unwrap();
        let idle = pool.alloc(8 * MIB).unwrap();
        pool.free(idle).unwrap();
        dev.write(live.ptr(), &[7; 64]).unwrap();
        drop(pool);
        // The idle memory went; the live block's is still there and still holds its data.
        assert!(
            dev.contains(live.ptr(), live.capacity()),
            "{kind}: live memory released"
        );
        assert_eq!(dev.read(live.ptr(), 64).unwrap(), vec![7; 64], "{kind}");
        let held = dev.ledger();
        assert!(
            held.device_bytes + held.managed_bytes < 12 * MIB,
            "{kind}: idle memory kept: {held:?}"
        );
        drop(live);
        assert!(dev.ledger().is_empty(), "{kind}: leaked {:?}", dev.ledger());
    }
}

#[test]
fn a_dropped_block_returns_to_its_live_pool() {
    let dev = sim(1.0);
    let pool = LegacyPool::new(as_driver(&dev));
    let b = pool.alloc(MIB).unwrap();
    drop(b);
    let s = pool.stats();
    assert_eq!((s.live_blocks, s.live_bytes), (0, 0));
    assert_eq!(pool.cached_sizes().len(), 1, "it is cached again");
}
