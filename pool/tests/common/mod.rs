#![allow(dead_code)]
#[cfg(test)]
pub mod kernels;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use std::sync::Arc;

pub const MIB: usize = 1 << 20;
pub const GIB: usize = 1 << 30;

pub fn sim(gib: f64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::gib(gib)).expect("a valid card"))
}

pub fn sim_with(config: SimConfig) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(config).expect("a valid card"))
}

pub fn as_driver(d: &Arc<SimDevice>) -> Arc<dyn Driver> {
    d.clone()
}

/// A recycling VMM pool with pages of `page` bytes, every growth exactly what it needs, and
/// requests above 1 MiB rounded to the 2 MiB granule (libcupool's rounding). Without lanes:
/// every block in the one range, where recycling's moves are what a test checks
/// (`tests/lanes.rs` has lanes).
pub fn recycling_vmm(dev: Arc<dyn Driver>, page: usize) -> cupool_pool::pools::VmmPool {
    vmm_with(dev, page, false)
}

/// [`recycling_vmm`]'s settings, with lanes or without.
pub fn recycling_config(page: usize, lanes: bool) -> cupool_pool::upstream::vmm::VmmConfig {
    cupool_pool::upstream::vmm::VmmConfig {
        recycle_page: page,
        min_grow: 0,
        max_grow: 0,
        large_rounding: 2 * MIB,
        recycle: true,
        lanes,
        ..Default::default()
    }
}

/// [`recycling_vmm`], with lanes or without.
pub fn vmm_with(dev: Arc<dyn Driver>, page: usize, lanes: bool) -> cupool_pool::pools::VmmPool {
    cupool_pool::pools::VmmPool::with_config(dev, recycling_config(page, lanes))
        .expect("valid settings")
}

/// True, after saying why, on a machine without a CUDA GPU: the test then returns. With
/// `CUPOOL_REQUIRE_GPU=1` (the GPU machine's script sets it) a missing GPU fails instead.
pub fn no_gpu() -> bool {
    let Some(why) = cupool_pool::driver::cuda::unavailable() else {
        return false;
    };
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_GPU").is_none(),
        "CUPOOL_REQUIRE_GPU is set: {why}"
    );
    eprintln!("skipped: {why}");
    true
}

/// Fills `b` with bytes that depend on `seed` and the offset (the simulated device's addresses
/// are host addresses).
pub fn fill(b: &cupool_pool::Block, seed: u8) {
    // SAFETY: a live block of a backed simulated device: `size` writable host bytes.
    let s = unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut u8, b.size()) };
    for (i, x) in s.iter_mut().enumerate() {
        *x = seed.wrapping_add((i % 251) as u8);
    }
}

/// Whether `b` still holds what `fill(b, seed)` wrote.
pub fn holds(b: &cupool_pool::Block, seed: u8) -> bool {
    // SAFETY: as in `fill`, read only.
    let s = unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.size()) };
    s.iter()
        .enumerate()
        .all(|(i, &x)| x == seed.wrapping_add((i % 251) as u8))
}

/// A recycling pool's invariants after one step of a random sequence, on a backed simulated
/// device: its reserve is what the device holds, every block freed since the last finished
/// synchronize (address, size, the epoch of its free; those the device is past are dropped) is
/// still mapped, and every live block is mapped and keeps the bytes `fill` gave it.
pub fn recycling_invariants(
    p: &dyn cupool_pool::Pool,
    dev: &SimDevice,
    queued: &mut Vec<(u64, usize, u64)>,
    live: &[(cupool_pool::Block, u8)],
) -> Result<(), String> {
    let (reserved, held) = (p.stats().reserved_bytes, dev.ledger().device_bytes);
    if reserved != held {
        return Err(format!(
            "the pool counts {reserved} bytes, the device holds {held}"
        ));
    }
    queued.retain(|&(_, _, e)| !dev.epoch().idle_since(e));
    if let Some(&(at, _, _)) = queued.iter().find(|&&(at, len, _)| !dev.contains(at, len)) {
        return Err(format!("{at:#x} unmapped under queued work"));
    }
    for (b, s) in live {
        if !dev.contains(b.ptr(), b.size()) {
            return Err(format!("{:#x} unmapped", b.ptr()));
        }
        if !holds(b, *s) {
            return Err(format!("bytes at {:#x}", b.ptr()));
        }
    }
    Ok(())
}

/// A driver whose second mappings take `delay` to make or drop: the worker lags behind.
#[derive(Debug)]
pub struct Slow {
    pub inner: Arc<dyn Driver>,
    pub delay: std::time::Duration,
}

impl cupool_pool::driver::forward::Forward for Slow {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn alias(
        &self,
        from: u64,
        to: u64,
        bytes: usize,
        h: cupool_pool::driver::PhysHandle,
    ) -> Result<(), cupool_pool::driver::DriverError> {
        std::thread::sleep(self.delay);
        self.inner.alias(from, to, bytes, h)
    }

    fn unalias(&self, at: u64, bytes: usize) -> Result<(), cupool_pool::driver::DriverError> {
        std::thread::sleep(self.delay);
        self.inner.unalias(at, bytes)
    }
}

/// `inner`, its second mappings made or dropped `ms` milliseconds late.
pub fn slow(inner: Arc<dyn Driver>, ms: u64) -> Arc<dyn Driver> {
    Arc::new(Slow {
        inner,
        delay: std::time::Duration::from_millis(ms),
    })
}
