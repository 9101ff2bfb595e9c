//! One pool per (device, stream), created on first use, like ggml's backend context.

use crate::config::PoolConfig;
use crate::driver::Driver;
use crate::error::PoolError;
use crate::pool::Pool;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A stream's identity within its device (0 is the default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// A pool's key: its device, its stream, and the tag of what it holds (0: none).
type Key = (usize, StreamId, u32);

/// Pools per (device, stream).
#[derive(Debug)]
pub struct Registry {
    config: PoolConfig,
    drivers: Vec<Arc<dyn Driver>>,
    /// By (device, stream, tag): a tag (0: none) is a caller's name for part of what it
    /// allocates, with pools of its own (libcupool's sleep and wake act on one tag).
    pools: Mutex<HashMap<Key, Arc<dyn Pool>>>,
}

impl Registry {
    /// A registry over `drivers` (index = device), building pools with `config`.
    pub fn new(config: PoolConfig, drivers: Vec<Arc<dyn Driver>>) -> Self {
        Self {
            config,
            drivers,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// The pool of `(device, stream)`, created on first use.
    pub fn pool(&self, device: usize, stream: StreamId) -> Result<Arc<dyn Pool>, PoolError> {
        self.pool_tagged(device, stream, 0)
    }

    /// The pool of `(device, stream)` for what is tagged `tag` (0: untagged, the same pool as
    /// [`Registry::pool`]), created on first use.
    pub fn pool_tagged(
        &self,
        device: usize,
        stream: StreamId,
        tag: u32,
    ) -> Result<Arc<dyn Pool>, PoolError> {
        let mut pools = self.pools.lock();
        if let Some(p) = pools.get(&(device, stream, tag)) {
            return Ok(p.clone());
        }
        let driver = self.drivers.get(device).ok_or(PoolError::NoSuchDevice {
            device,
            devices: self.drivers.len(),
        })?;
        let pool = self.config.build(driver.clone())?;
        tracing::debug!(device, stream = stream.0, tag, pool = %pool.kind(), "pool created");
        pools.insert((device, stream, tag), pool.clone());
        Ok(pool)
    }

    /// Every pool created so far, with its device and stream (a stream's tagged pools share
    /// its key), ordered by device, stream and tag.
    pub fn pools(&self) -> Vec<((usize, StreamId), Arc<dyn Pool>)> {
        let mut v: Vec<_> = self
            .pools
            .lock()
            .iter()
            .map(|(k, p)| (*k, p.clone()))
            .collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter().map(|((d, s, _), p)| ((d, s), p)).collect()
    }

    /// The driver of `device`.
    pub fn driver(&self, device: usize) -> Option<&Arc<dyn Driver>> {
        self.drivers.get(device)
    }
}
