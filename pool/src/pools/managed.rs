//! The managed pool: ggml's `GGML_CUDA_POOL_USE_MANAGED` (PR #22158).
//!
//! The legacy policy whose grow path takes managed memory, and which frees its idle smaller
//! cached buffers before it grows: under managed memory those would otherwise sit in host
//! memory, inflate the pool and page over PCIe later. Unlike the PR, cupool never asks for more
//! managed memory than the device has free unless oversubscription is allowed explicitly:
//! asking for more can hang the GPU, not just the process.

use super::legacy::{Backing, LegacyConfig, LegacyPool};
use crate::driver::Driver;
use std::sync::Arc;

/// The managed pool's settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagedConfig {
    /// Allow managed requests beyond the device's free memory.
    pub allow_oversubscription: bool,
}

/// A legacy pool on managed memory, with idle smaller buffers dropped on grow.
pub fn managed_pool(driver: Arc<dyn Driver>, config: ManagedConfig) -> LegacyPool {
    LegacyPool::with_config(
        driver,
        LegacyConfig {
            backing: Backing::Managed {
                allow_oversubscription: config.allow_oversubscription,
            },
            drop_smaller_on_grow: true,
            ..LegacyConfig::default()
        },
    )
}
