//! The pool interface every pool and adaptor implements.

use crate::block::{Block, PoolId};
use crate::driver::Driver;
use crate::error::{FreeError, PoolError};
use crate::kind::PoolKind;
use crate::snapshot::{unsupported, PoolSnapshot};
use crate::stats::PoolStats;
use crate::sync::SyncToken;
use std::fmt;
use std::sync::Arc;

/// The largest single request any pool accepts (256 TiB): far beyond any device, small enough
/// that size arithmetic cannot overflow.
pub const MAX_REQUEST: usize = 1 << 48;

/// What a purge returns to the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purge {
    /// Everything cached: every idle legacy buffer; every VMM segment above the live top.
    All,
    /// Only cached buffers smaller than this many bytes: those a growing request can no
    /// longer use. Contiguous VMM space never strands, so for it this releases nothing.
    SmallerThan(usize),
    /// Keep the cached buffers that best fit would hand to these requests (made while all are
    /// live, in this order), release every other one: what the next round of work will reuse
    /// stays, what it has outgrown goes. The VMM pool releases nothing.
    KeepFor(Vec<usize>),
}

/// What a purge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// Bytes returned to the driver.
    pub bytes: usize,
    /// Buffers or segments returned.
    pub buffers: usize,
    /// Cached bytes kept because they were freed after the token's synchronize began.
    pub deferred_bytes: usize,
}

/// What a sleep or a wake moved ([`Pool::sleep`], [`Pool::wake`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Bytes unmapped (sleep) or mapped again (wake).
    pub bytes: usize,
    /// Bytes copied to the host (sleep) or back to the device (wake).
    pub copied: usize,
}

/// A device memory pool.
///
/// Pools are shared between threads (`&self` methods, locked inside). Allocation never aborts:
/// running out of memory is a [`PoolError::OutOfMemory`] with an [`crate::OomReport`], and a
/// failed allocation leaves the pool as it was. Behaviour beyond allocation (phases, tracing,
/// managed fallback) is added by wrapping a pool: see [`crate::adaptors`].
pub trait Pool: Send + Sync + fmt::Debug {
    /// The identity of the pool that hands out (and takes back) this pool's blocks.
    fn id(&self) -> PoolId;

    /// Which pool this is.
    fn kind(&self) -> PoolKind;

    /// The driver underneath.
    fn driver(&self) -> &Arc<dyn Driver>;

    /// Allocates `bytes` (0 is served as 1, so every block has a unique address).
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError>;

    /// [`Pool::alloc`], the block pushed onto `out` (nothing on an error). A pool and the
    /// adaptors on a hot path write the block once where the caller keeps it: a block
    /// returned through each level of a stack of adaptors is copied out and back at every one
    /// (the planner's dry runs make millions of requests).
    #[inline]
    fn alloc_onto(&self, bytes: usize, out: &mut Vec<Block>) -> Result<(), PoolError> {
        out.push(self.alloc(bytes)?);
        Ok(())
    }

    /// Allocates `bytes` only from memory the pool already holds: `Ok(None)` where it would
    /// need new memory from the driver (nothing is handed out or changed then), or where this
    /// pool cannot tell without growing (the default). A cache in front of a pool (per-thread
    /// bins) asks this before a miss goes to [`Pool::alloc`]: on `None` it gives back what it
    /// keeps first, so the pool does not grow for a request the kept blocks' memory could
    /// serve.
    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        let _ = bytes;
        Ok(None)
    }

    /// Returns a block to the pool. Its memory may be handed out again at once: reuse on the
    /// same stream is ordered after the work already queued there. On error the block comes
    /// back unchanged.
    fn free(&self, block: Block) -> Result<(), FreeError>;

    /// Returns cached memory to the driver. The token proves a synchronize; memory freed after
    /// that synchronize began is kept and counted as deferred. For the VMM pool this is the
    /// trim: segments above the live top are unmapped.
    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError>;

    /// Cached bytes [`Pool::purge`] would release for `what` under a fresh token: lets a caller
    /// skip the synchronize when there is nothing to release.
    fn releasable(&self, what: &Purge) -> usize;

    /// Current counters.
    fn stats(&self) -> PoolStats;

    /// Device bytes the pool holds now: [`PoolStats::reserved_bytes`], read without a lock.
    fn reserved_bytes(&self) -> usize;

    /// Sets the peaks to the current values.
    fn reset_peaks(&self);

    /// The alignment every block's address has.
    fn alignment(&self) -> usize;

    /// Puts the pool to sleep: cached memory goes back to the driver, and the physical memory
    /// under every live block too, while each block keeps its address; with `offload` the
    /// contents are copied to page-locked host memory first, for [`Pool::wake`] to restore.
    /// The token proves a synchronize: the caller must also have finished (synchronized) all
    /// work that uses the pool's memory. Asleep, the pool refuses allocations
    /// ([`PoolError::Asleep`]) until a wake succeeds, and takes frees. A failure leaves the
    /// pool asleep, part of its memory perhaps still mapped: a later sleep or wake goes on
    /// from there, and nothing is lost. Only the vmm pool sleeps; the others answer
    /// [`PoolError::CannotSleep`].
    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        let _ = (token, offload);
        Err(PoolError::CannotSleep { kind: self.kind() })
    }

    /// Wakes a pool put to sleep: new physical memory at every address sleep released, the
    /// offloaded contents copied back. Waking an awake pool does nothing.
    fn wake(&self) -> Result<Moved, PoolError> {
        Err(PoolError::CannotSleep { kind: self.kind() })
    }

    /// The pool's state, for [`Pool::restore`], while it holds no live block
    /// ([`crate::PoolSnapshot`] says which pools keep one). Taking it changes nothing.
    fn snapshot(&self) -> Result<PoolSnapshot, PoolError> {
        Err(unsupported(self.kind(), "a snapshot of its state"))
    }

    /// Puts the pool back in the state `snapshot` took of it, while it holds no live block:
    /// what it cached since is forgotten, not released: the caller puts the device back too
    /// (a simulated device's ledger: `SimDevice::restore`). A snapshot of another pool is
    /// refused.
    fn restore(&self, snapshot: &PoolSnapshot) -> Result<(), PoolError> {
        let _ = snapshot;
        Err(unsupported(self.kind(), "a snapshot of its state"))
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
