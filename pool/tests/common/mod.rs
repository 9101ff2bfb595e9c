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
