//! The pool configurations the checker runs, on a small simulated card behind a fault
//! injector.

use crate::adaptors::{ManagedFallback, Phases};
use crate::driver::fault::FaultInjector;
use crate::driver::limit::LimitedDriver;
use crate::driver::sim::{SimConfig, SimDevice};
use crate::driver::Driver;
use crate::placement::slots::SlotsConfig;
use crate::pools::{LegacyConfig, LegacyPool};
use crate::upstream::vmm::VmmConfig;
use crate::{Pool, PoolConfig, PoolKind};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// A pool configuration to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// A kind as [`PoolConfig`] builds it by default: every kind in [`PoolKind::ALL`].
    Plain(PoolKind),
    /// VMM growing by exactly the granularity (no amortised growth), large requests rounded to
    /// 2 MiB (libcupool's setting).
    VmmExactGrowth,
    /// Legacy with 3 slots (frequent driver frees) and flush-and-retry.
    LegacyFewSlotsRetry,
    /// VMM under a 24 MiB limit with the managed fallback.
    FallbackOverVmm,
    /// libcupool's VMM setting: size classes (up to 1 MiB, above), large requests rounded to
    /// 2 MiB.
    VmmSizeClasses,
    /// VMM over address reservations of 6 MiB (three granules): the pool grows from one
    /// reservation into the next, contiguously where the address after the last is free.
    VmmSmallReservations,
}

/// Every flavour: each kind, then the variants.
pub fn flavors() -> Vec<Flavor> {
    let mut v: Vec<Flavor> = PoolKind::ALL.iter().map(|&k| Flavor::Plain(k)).collect();
    v.extend([
        Flavor::VmmExactGrowth,
        Flavor::LegacyFewSlotsRetry,
        Flavor::FallbackOverVmm,
        Flavor::VmmSizeClasses,
        Flavor::VmmSmallReservations,
    ]);
    v
}

/// A small simulated card (64 MiB) behind a fault injector.
#[derive(Debug)]
pub struct Device {
    /// The card: its ledger and its memory.
    pub sim: Arc<SimDevice>,
    /// The driver pools are built on: the card behind the injector.
    pub faults: Arc<FaultInjector>,
}

impl Device {
    /// A fresh card with no fault armed.
    pub fn new() -> Self {
        let sim = Arc::new(
            SimDevice::new(SimConfig::gib(64.0 / 1024.0).record_calls(false))
                .expect("a valid simulated card"),
        );
        let faults = Arc::new(FaultInjector::new(sim.clone()));
        Self { sim, faults }
    }

    /// The driver to build pools on.
    pub fn driver(&self) -> Arc<dyn Driver> {
        self.faults.clone()
    }
}

impl Default for Device {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a pool of `flavor` on `driver`, wrapped in [`Phases`].
pub fn build(flavor: Flavor, driver: Arc<dyn Driver>) -> Arc<Phases> {
    let pool: Arc<dyn Pool> = match flavor {
        Flavor::Plain(kind) => PoolConfig::default()
            .kind(kind)
            .build(driver)
            .expect("every kind builds on the simulated card"),
        Flavor::VmmExactGrowth => Arc::new(
            crate::pools::VmmPool::with_config(
                driver,
                VmmConfig {
                    reserve_bytes: None,
                    min_grow: 0,
                    max_grow: 0,
                    large_rounding: 2 << 20,
                    recycle: true,
                    // Three granules: pages of several sizes move, tails take smaller ones.
                    recycle_page: 6 << 20,
                    // Any free memory is worth moving: the moves are what is checked.
                    recycle_free: 0,
                    // Large blocks replaced by grown copies open lanes.
                    lanes: true,
                    // Their growth made ahead, on this thread: the faults injected hit the
                    // same calls in every run (tests/ahead.rs checks the worker gives the same
                    // pool).
                    ahead: crate::upstream::vmm::Ahead::Inline,
                },
            )
            .expect("valid settings"),
        ),
        Flavor::LegacyFewSlotsRetry => Arc::new(
            LegacyPool::with_config(
                driver,
                LegacyConfig {
                    placement: SlotsConfig {
                        slots: 3,
                        ..SlotsConfig::default()
                    },
                    flush_and_retry: true,
                    ..LegacyConfig::default()
                },
            )
            .expect("valid settings"),
        ),
        Flavor::FallbackOverVmm => {
            let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(driver, 24 * MIB));
            Arc::new(ManagedFallback::new(
                Arc::new(crate::pools::VmmPool::new(limited)),
                false,
            ))
        }
        Flavor::VmmSmallReservations => Arc::new(
            crate::pools::VmmPool::with_config(
                driver,
                VmmConfig {
                    reserve_bytes: Some(6 * MIB),
                    min_grow: 2 * MIB,
                    max_grow: 8 * MIB,
                    ..VmmConfig::default()
                },
            )
            .expect("valid settings"),
        ),
        Flavor::VmmSizeClasses => {
            let mut c = PoolConfig::default().kind(PoolKind::Vmm);
            c.size_classes = vec![MIB];
            c.vmm.large_rounding = 2 * MIB;
            c.build(driver).expect("valid settings")
        }
    };
    Arc::new(Phases::new(pool))
}
