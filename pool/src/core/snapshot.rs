//! A pool core's snapshot ([`crate::PoolSnapshot`]): its placement's and upstream's state and
//! its counters, copied while no block is live.

use super::{Ctx, State};
use crate::error::PoolError;
use crate::placement::Placement;
use crate::snapshot::{unsupported, PoolSnapshot};
use crate::stats::Tracker;
use crate::upstream::Upstream;
use std::sync::atomic::Ordering;

/// What a core's snapshot holds.
struct CoreState<P, U> {
    /// The pool it was taken of: only that one takes it back.
    id: crate::owners::PoolId,
    placement: P,
    upstream: U,
    tracker: Tracker,
    ahead_paused: bool,
}

/// Why a core in `g` has no snapshot to take or restore, if it has none.
fn refusal<P: Placement, U: Upstream>(g: &State<P, U>) -> Option<&'static str> {
    if !g.upstream.driver().simulated() {
        return Some("a snapshot on a real device (a restore would forget memory it holds)");
    }
    if !g.upstream.keeps_state() {
        return Some("a snapshot of its upstream now (pages in flight on a worker, or offloaded)");
    }
    if g.tracker.s.live_blocks != 0 {
        return Some("a snapshot while blocks are live (free them first)");
    }
    if g.asleep || !g.pending.is_empty() {
        return Some("a snapshot while asleep or with segments the driver refused to release");
    }
    None
}

impl Ctx {
    pub(super) fn snapshot<P: Placement, U: Upstream>(
        &self,
        g: &State<P, U>,
    ) -> Result<PoolSnapshot, PoolError> {
        if let Some(why) = refusal(g) {
            return Err(unsupported(self.kind, why));
        }
        let (Some(placement), Some(upstream)) = (g.placement.copy_state(), g.upstream.copy_state())
        else {
            return Err(unsupported(
                self.kind,
                "a snapshot of its placement and upstream",
            ));
        };
        Ok(PoolSnapshot::new(CoreState {
            id: self.id,
            placement,
            upstream,
            tracker: g.tracker.clone(),
            ahead_paused: g.ahead_paused,
        }))
    }

    pub(super) fn restore<P: Placement, U: Upstream>(
        &self,
        g: &mut State<P, U>,
        snapshot: &PoolSnapshot,
    ) -> Result<(), PoolError> {
        if let Some(why) = refusal(g) {
            return Err(unsupported(self.kind, why));
        }
        let Some(s) = snapshot
            .get::<CoreState<P, U>>()
            .filter(|s| s.id == self.id)
        else {
            return Err(unsupported(
                self.kind,
                "a restore from another pool's snapshot",
            ));
        };
        let (Some(placement), Some(upstream)) = (s.placement.copy_state(), s.upstream.copy_state())
        else {
            return Err(unsupported(
                self.kind,
                "a snapshot of its placement and upstream",
            ));
        };
        g.placement = placement;
        g.upstream = upstream;
        g.tracker = s.tracker.clone();
        g.ahead_paused = s.ahead_paused;
        self.reserved
            .store(g.tracker.s.reserved_bytes, Ordering::Relaxed);
        Ok(())
    }
}
