//! Sleep and wake in the core: the pool's side of [`crate::Pool::sleep`].
//!
//! The core releases what is cached first (a plain purge under the caller's token), so sleep
//! unmaps only what live blocks lie in, then hands the rest to the upstream. The placement is
//! not touched: every block keeps its address and its place, so frees while asleep are plain
//! bookkeeping, and a wake needs no re-placement. Allocations are refused from the sleep
//! until a wake succeeds (the fast path would otherwise hand out an address with nothing
//! behind it).

use super::{Ctx, State};
use crate::error::PoolError;
use crate::placement::Placement;
use crate::pool::{Moved, Purge};
use crate::sync::SyncToken;
use crate::upstream::Upstream;

impl Ctx {
    pub(super) fn sleep<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        token: &SyncToken,
        offload: bool,
    ) -> Result<Moved, PoolError> {
        if !U::CAN_SLEEP {
            return Err(PoolError::CannotSleep { kind: self.kind });
        }
        if !token.is_for(self.driver.epoch()) {
            return Err(PoolError::WrongDevice {
                device: self.driver.ordinal(),
            });
        }
        // Refuse allocations from here until a wake, also if a step below fails or the pool
        // is empty: a caller that put a pool to sleep gets no memory from it (a pool behind
        // size classes is several pools, some of them empty).
        let was_asleep = std::mem::replace(&mut g.asleep, true);
        if !was_asleep {
            self.release(g, token, &Purge::All)?;
        }
        let moved = g.upstream.sleep(offload, &mut g.tracker.s.calls)?;
        tracing::info!(pool = %self.kind, device = self.driver.ordinal(), released = moved.bytes, offloaded = moved.copied, "pool asleep");
        Ok(moved)
    }

    pub(super) fn wake<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
    ) -> Result<Moved, PoolError> {
        if !U::CAN_SLEEP {
            return Err(PoolError::CannotSleep { kind: self.kind });
        }
        let moved = g.upstream.wake(&mut g.tracker.s.calls)?;
        g.asleep = false;
        tracing::info!(pool = %self.kind, device = self.driver.ordinal(), mapped = moved.bytes, restored = moved.copied, "pool awake");
        Ok(moved)
    }

    /// The refusal of an allocation while asleep.
    #[cold]
    pub(super) fn asleep<P: Placement, U: Upstream>(&self, g: &State<P, U>) -> PoolError {
        PoolError::Asleep {
            device: self.driver.ordinal(),
            bytes: g.upstream.asleep_bytes(),
        }
    }
}
