//! The startup allocations, owned: weights, KV cache and compute buffer are allocated once,
//! outside the pool, and freed (after a synchronize) when the owner is dropped, whether the
//! runtime was built or a later startup step failed.

use crate::error::RuntimeError;
use crate::executor::DeviceBuffers;
use crate::memory::{ComputeLayout, KvLayout, WeightLayout};
use cupool_pool::driver::{DevicePtr, Driver};
use cupool_pool::synchronize;
use std::sync::Arc;

/// See the module docs.
#[derive(Debug)]
pub struct Startup {
    driver: Arc<dyn Driver>,
    held: Vec<DevicePtr>,
    bufs: DeviceBuffers,
}

impl Startup {
    /// Allocates the weights (`weights_bytes`, at least the layout's), the KV cache, the
    /// compute buffer and `engine_compute_bytes` beside it (what an engine profile's compute
    /// buffer holds that cupool's runtime does not use) on `driver`. A failure frees what was
    /// allocated before it.
    pub fn allocate(
        driver: Arc<dyn Driver>,
        weights_bytes: usize,
        (wl, kvl, cl): (WeightLayout, KvLayout, ComputeLayout),
        engine_compute_bytes: usize,
    ) -> Result<Self, RuntimeError> {
        let mut s = Self {
            driver,
            held: Vec::with_capacity(4),
            bufs: DeviceBuffers {
                weights: 0,
                kv: 0,
                compute: 0,
                wl,
                kvl,
                cl,
            },
        };
        s.bufs.weights = s.take("weights", weights_bytes.max(wl.bytes))?;
        s.bufs.kv = s.take("KV cache", kvl.bytes)?;
        s.bufs.compute = s.take("compute buffer", cl.bytes)?;
        if engine_compute_bytes > 0 {
            s.take(
                "the engine's own buffers (flash-attention K/V copies, cuBLAS workspace)",
                engine_compute_bytes,
            )?;
        }
        Ok(s)
    }

    fn take(&mut self, what: &'static str, bytes: usize) -> Result<DevicePtr, RuntimeError> {
        match self.driver.malloc(bytes) {
            Ok(p) => {
                self.held.push(p);
                Ok(p)
            }
            Err(source) => Err(RuntimeError::DoesNotFit {
                what,
                bytes,
                free: self.driver.mem_info().ok().map(|i| i.free),
                source,
            }),
        }
    }

    /// The buffers, by address, with their layouts.
    pub fn buffers(&self) -> &DeviceBuffers {
        &self.bufs
    }
}

impl Drop for Startup {
    fn drop(&mut self) {
        // Kernels may still use the buffers: wait for them first.
        if let Err(e) = synchronize(self.driver.as_ref()) {
            tracing::error!(error = %e, "synchronize failed while freeing the startup buffers");
        }
        for &p in self.held.iter().rev() {
            if let Err(e) = self.driver.free(p) {
                tracing::error!(error = %e, "freeing a startup buffer failed");
            }
        }
    }
}
