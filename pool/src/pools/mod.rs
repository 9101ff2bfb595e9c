//! The pools: one trait, one file per pool.

pub mod legacy;
pub mod managed;
pub mod vmm;

use crate::block::{Block, PoolId};
use crate::driver::{Driver, MemInfo};
use crate::error::{FreeError, OomReport, PoolError};
use crate::stats::{PhaseStats, PoolStats};
use crate::sync::SyncToken;
use std::fmt;
use std::sync::Arc;

/// The largest single request any pool accepts (256 TiB): far beyond any device, small enough
/// that size arithmetic cannot overflow.
pub const MAX_REQUEST: usize = 1 << 48;

/// Which pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Reserve address space once, map physical memory as it grows.
    Vmm,
    /// ggml's best-fit cache of device allocations.
    Legacy,
    /// The legacy policy on managed memory (ggml's `GGML_CUDA_POOL_USE_MANAGED`).
    Managed,
}

impl PoolKind {
    /// The names `GGML_POOL` accepts.
    pub const NAMES: &'static str = "vmm, legacy, managed";

    /// The name `GGML_POOL` uses.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Vmm => "vmm",
            PoolKind::Legacy => "legacy",
            PoolKind::Managed => "managed",
        }
    }

    /// Parses a `GGML_POOL` value (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "vmm" => Some(PoolKind::Vmm),
            "legacy" => Some(PoolKind::Legacy),
            "managed" => Some(PoolKind::Managed),
            _ => None,
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a purge returns to the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purge {
    /// Everything cached: every idle legacy buffer; every VMM chunk above the live top.
    All,
    /// Only cached legacy buffers smaller than this many bytes: those a growing request can no
    /// longer use. The VMM pool never strands memory (its space is contiguous), so for it this
    /// releases nothing.
    SmallerThan(usize),
    /// Keep the cached legacy buffers that best fit would hand to these requests (made while
    /// all are live, in this order), release every other one: what the next ubatch will reuse
    /// stays, what it has outgrown goes. The VMM pool releases nothing.
    KeepFor(Vec<usize>),
}

/// What a purge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Bytes returned to the driver.
    pub bytes: usize,
    /// Buffers or chunks returned.
    pub buffers: usize,
    /// Cached bytes kept because they were freed after the token's synchronize began.
    pub deferred_bytes: usize,
}

/// A device memory pool.
///
/// Pools are shared between threads (`&self` methods, locked inside). Allocation never aborts:
/// running out of memory is a [`PoolError::OutOfMemory`] with an [`OomReport`], and a failed
/// allocation leaves the pool as it was.
pub trait Pool: Send + Sync + fmt::Debug {
    /// This pool's identity.
    fn id(&self) -> PoolId;

    /// Which pool this is.
    fn kind(&self) -> PoolKind;

    /// The driver underneath.
    fn driver(&self) -> &Arc<dyn Driver>;

    /// Allocates `bytes` (0 is served as 1, so every block has a unique address).
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError>;

    /// Returns a block to the pool. Its memory may be handed out again at once: reuse on the
    /// same stream is ordered after the work already queued there. On error the block comes
    /// back unchanged.
    fn free(&self, block: Block) -> Result<(), FreeError>;

    /// Returns cached memory to the driver. The token proves a synchronize; memory freed after
    /// that synchronize began is kept and counted as deferred. For the VMM pool this is the
    /// trim: chunks above the live top are unmapped.
    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError>;

    /// Cached bytes [`Pool::purge`] would release for `what` under a fresh token: lets a caller
    /// skip the synchronize when there is nothing to release.
    fn releasable(&self, what: &Purge) -> usize;

    /// Current counters.
    fn stats(&self) -> PoolStats;

    /// Sets the peaks to the current values.
    fn reset_peaks(&self);

    /// Opens a named phase (ending any open one).
    fn begin_phase(&self, name: &str);

    /// Closes the open phase and returns its numbers, or `None` if none was open.
    fn end_phase(&self) -> Option<PhaseStats>;

    /// The alignment every block's address has.
    fn alignment(&self) -> usize;
}

/// Builds the OOM report shared by all pools.
pub(crate) fn oom_report(
    driver: &dyn Driver,
    pool: PoolKind,
    requested: usize,
    stats: &PoolStats,
    stranded: usize,
    cause: String,
) -> OomReport {
    let device: Option<MemInfo> = driver.mem_info().ok();
    let suggestion = match pool {
        PoolKind::Legacy | PoolKind::Managed if stranded > 0 => format!(
            "{:.1} MiB of this pool's cache is too small to serve the request: purge the pool at the ubatch boundary (purge auto or always) or enable flush-and-retry",
            stranded as f64 / (1u64 << 20) as f64
        ),
        PoolKind::Managed => "managed memory is limited to the device's free memory; allow oversubscription explicitly only if you accept paging (and the risk of hanging the GPU)".to_string(),
        _ => "the pool's need grows with the KV length: plan the budget before the run (repro-prefill plan), lower the context or ubatch, or opt in to GGML_CUDA_ALLOC_FALLBACK_MANAGED=1".to_string(),
    };
    OomReport {
        requested,
        pool,
        live: stats.live_bytes,
        reserved: stats.reserved_bytes,
        cached: stats.cached_bytes,
        stranded,
        device,
        cause,
        suggestion,
    }
}

/// Checks a request size; 0 becomes 1.
#[inline]
pub(crate) fn checked_request(bytes: usize) -> Result<usize, PoolError> {
    if bytes > MAX_REQUEST {
        Err(PoolError::InvalidSize {
            requested: bytes,
            max: MAX_REQUEST,
        })
    } else {
        Ok(bytes.max(1))
    }
}
