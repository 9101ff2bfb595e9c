//! The one decision taken at the boundary of a prefill ubatch: what a pool gives back.
//!
//! Three clients end ubatches: the runtime's engine loop, libcupool's `cupool_ubatch_end` (a
//! real engine through its ggml shim) and the trace replay. Each asks [`Boundary::decide`] and
//! does what it answers, so a replay of a recorded run purges exactly as the run did: the
//! policy and the headroom say *whether* memory goes back, the caller says *what the next
//! ubatch will reuse* (the runtime knows its next ubatch; libcupool expects the next to ask
//! for what the one just ended held at once; a replay follows the run's recorded keep lists).

use crate::pool::{Pool, Purge};
use crate::purge_policy::{AutoHeadroom, PurgePolicy};

/// The boundary settings of a run: the purge policy and, for `auto`, when the device counts
/// as short of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Boundary {
    /// What happens to the cache at prefill boundaries.
    pub policy: PurgePolicy,
    /// `auto` only: below how much free device memory outgrown buffers go back.
    pub headroom: AutoHeadroom,
}

/// What one pool does at a prefill boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// `never`: every cached buffer stays; nothing is recorded.
    Nothing,
    /// `auto` while the device has room: every cached buffer stays, and a recording notes
    /// that everything was kept.
    KeepAll,
    /// `auto` while the device is short: cached buffers that best fit would hand to `keep`
    /// stay, the rest go back (`release` is false when there is nothing else, and then no
    /// synchronize is needed).
    KeepFor {
        /// The next ubatch's expected requests, largest first.
        keep: Vec<usize>,
        /// Whether the pool holds anything beyond what `keep` reuses.
        release: bool,
    },
    /// `always`: every idle buffer goes back.
    ReleaseAll,
}

impl Decision {
    /// What to purge, after a synchronize; `None`: nothing, and no synchronize.
    pub fn purge(self) -> Option<Purge> {
        match self {
            Decision::Nothing | Decision::KeepAll => None,
            Decision::KeepFor { release: false, .. } => None,
            Decision::KeepFor {
                keep,
                release: true,
            } => Some(Purge::KeepFor(keep)),
            Decision::ReleaseAll => Some(Purge::All),
        }
    }

    /// What a recording writes as the phase's keep event: `None`, no event (not `auto`);
    /// `Some(None)`, everything stayed; `Some(Some(sizes))`, buffers for `sizes` stayed.
    pub fn recorded_keep(&self) -> Option<Option<&[usize]>> {
        match self {
            Decision::KeepAll => Some(None),
            Decision::KeepFor { keep, .. } => Some(Some(keep)),
            Decision::Nothing | Decision::ReleaseAll => None,
        }
    }
}

impl Boundary {
    /// A boundary with `policy` and `headroom`.
    pub fn new(policy: PurgePolicy, headroom: AutoHeadroom) -> Self {
        Self { policy, headroom }
    }

    /// Decides what `pool` gives back at a prefill boundary.
    ///
    /// `free` reads the device's free memory (called at most once, and only by `auto` with a
    /// finite headroom: reading it costs no synchronize, but it is still a driver call);
    /// `peak_live` is what the device's pools held at once in the ubatch just ended; `reuse`
    /// lists the requests the next ubatch is expected to make (called only when the device is
    /// short). Errors from `free` or `reuse` are returned as they are.
    pub fn decide<E>(
        &self,
        pool: &dyn Pool,
        peak_live: usize,
        free: impl FnOnce() -> Result<usize, E>,
        reuse: impl FnOnce() -> Result<Vec<usize>, E>,
    ) -> Result<Decision, E> {
        match self.policy {
            PurgePolicy::Never => Ok(Decision::Nothing),
            PurgePolicy::Always => Ok(Decision::ReleaseAll),
            PurgePolicy::Auto => {
                // Each buffer returned is a driver free: only worth it when memory is short.
                let short = match self.headroom {
                    AutoHeadroom::Infinite => true,
                    h => h.short(free()?, peak_live),
                };
                if !short {
                    return Ok(Decision::KeepAll);
                }
                let keep = reuse()?;
                let release = pool.releasable(&Purge::KeepFor(keep.clone())) > 0;
                Ok(Decision::KeepFor { keep, release })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::{SimConfig, SimDevice};
    use crate::{PoolConfig, PoolKind};
    use std::sync::Arc;

    const MIB: usize = 1 << 20;

    /// A legacy pool with an idle 4 MiB and an idle 1 MiB buffer.
    fn pool() -> Arc<dyn Pool> {
        let dev = Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap());
        let p = PoolConfig::default()
            .kind(PoolKind::Legacy)
            .build(dev)
            .unwrap();
        let a = p.alloc(4 * MIB).unwrap();
        let b = p.alloc(MIB).unwrap();
        p.free(a).unwrap();
        p.free(b).unwrap();
        p
    }

    type R = Result<Decision, &'static str>;

    fn never_read() -> Result<usize, &'static str> {
        Err("free memory was read")
    }

    #[test]
    fn each_policy_decides_as_documented() {
        let p = pool();
        let b = |policy, headroom| Boundary::new(policy, headroom);
        let keep_1mib = || Ok(vec![MIB]);
        let d: R =
            b(PurgePolicy::Never, AutoHeadroom::Infinite)
                .decide(p.as_ref(), 0, never_read, || Err("reuse asked"));
        assert_eq!(d, Ok(Decision::Nothing));
        let d: R = b(PurgePolicy::Always, AutoHeadroom::Bytes(0)).decide(
            p.as_ref(),
            0,
            never_read,
            || Err("reuse asked"),
        );
        assert_eq!(d.unwrap().purge(), Some(Purge::All));
        // Infinite headroom never reads free memory; the 4 MiB buffer is releasable.
        let d: R = b(PurgePolicy::Auto, AutoHeadroom::Infinite).decide(
            p.as_ref(),
            0,
            never_read,
            keep_1mib,
        );
        let d = d.unwrap();
        assert_eq!(d.recorded_keep(), Some(Some(&[MIB][..])));
        assert_eq!(d.purge(), Some(Purge::KeepFor(vec![MIB])));
        // Room to spare: everything stays, and the next ubatch is not even asked about.
        let d: R = b(PurgePolicy::Auto, AutoHeadroom::Ubatch).decide(
            p.as_ref(),
            10 * MIB,
            || Ok(20 * MIB),
            || Err("reuse asked"),
        );
        assert_eq!(d, Ok(Decision::KeepAll));
        assert_eq!(Decision::KeepAll.recorded_keep(), Some(None));
        // Short, but everything cached is reused: kept, recorded, no purge (no synchronize).
        let d: R = b(PurgePolicy::Auto, AutoHeadroom::Ubatch).decide(
            p.as_ref(),
            10 * MIB,
            || Ok(20 * MIB - 1),
            || Ok(vec![4 * MIB, MIB]),
        );
        let d = d.unwrap();
        assert_eq!(
            d,
            Decision::KeepFor {
                keep: vec![4 * MIB, MIB],
                release: false
            }
        );
        assert!(d.recorded_keep().is_some());
        assert_eq!(d.purge(), None);
    }

    #[test]
    fn errors_of_the_callers_pass_through() {
        let p = pool();
        let b = Boundary::new(PurgePolicy::Auto, AutoHeadroom::Bytes(MIB));
        let d: R = b.decide(p.as_ref(), 0, never_read, || Ok(vec![]));
        assert_eq!(d, Err("free memory was read"));
        let d: R = b.decide(p.as_ref(), 0, || Ok(0), || Err("no profile"));
        assert_eq!(d, Err("no profile"));
    }
}
