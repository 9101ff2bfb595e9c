//! Where the search's probes go for a pool whose run does not read its room: the memory one
//! dry run's device holds after each ubatch, on a card the pool never fills.
//!
//! A pool that decides nothing from the free memory (`reads_no_room`) makes, until an
//! allocation fails, the same requests and driver calls on any card as on an endless one, and
//! every prompt makes the same ubatches as a longer one up to its last (which may ask for
//! logits where the longer one's does not). So one dry run of the longest context that can
//! start, on a card it never fills, gives the memory any shorter prompt's run holds, except in
//! its last ubatch; the largest context whose room covers it is where the boundary is expected.
//!
//! It is only where the search probes first ([`super::narrow`]): the probes themselves are
//! dry runs of each context, so an expectation that is off (the short last ubatch, the tail
//! prompt, a pool that retries after a failed allocation) costs probes, never an answer.
//! A legacy pool purged `auto` reads the free memory at every boundary (its run on an endless
//! card keeps what it would release on a full one), and one that frees its cache and retries
//! completes in far less room than it holds on an endless card: those have no trajectory.

use super::dry::watched;
use super::PlanTarget;
use super::STEP;
use crate::config::RunConfig;
use crate::engine::Watch;
use crate::engine_kind::EngineKind;
use crate::policy::PurgePolicy;
use cupool_pool::driver::sim::MAX_CAPACITY;
use cupool_pool::PoolKind;
use std::sync::{Arc, Mutex};

/// Whether a run of `cfg`'s pool (of `kind`) makes the same driver calls in any room until one
/// fails, and fails about where its held memory passes the room. A VMM pool does: `auto` over
/// it releases nothing however little is free (it keeps what the next ubatch asks for, and its
/// placement keeps no block it could release for that: `Bump::idle`), and a retry after a
/// failed allocation can release only the few idle pages of its range, so its run completes a
/// few steps above where the trajectory expects (up to four in `tests`, seven with page
/// recycling on and purged `always`). A legacy pool does
/// only never purged and never retrying: one that frees its whole cache and retries (libcupool
/// under a purge policy, mainline since PR #22155) completes in much less room than it holds
/// where nothing limits it (ik_llama.cpp's, purged `always`, held 90 MiB through its first
/// ubatch of a 2-layer Llama-3-8B shape and completed in 84).
pub(super) fn reads_no_room(cfg: &RunConfig, kind: PoolKind) -> bool {
    match kind {
        PoolKind::Vmm => true,
        PoolKind::Legacy => {
            let retries = match cfg.engine {
                EngineKind::Profile { profile, .. } => profile.legacy_flush_and_retry(),
                EngineKind::Cupool => false,
            };
            cfg.purge == PurgePolicy::Never && !retries && !cfg.pool.legacy.flush_and_retry
        }
        _ => false,
    }
}

/// What [`Trajectory::watch`] records: (tokens done after a ubatch, the most the device held
/// through it).
pub(crate) type Held = Arc<Mutex<Vec<(usize, usize)>>>;

/// The memory the device holds through each prompt length, from one dry run.
#[derive(Debug)]
pub(crate) struct Trajectory {
    /// (tokens done after a ubatch, the most the device held through that ubatch), ascending
    /// in both.
    points: Vec<(usize, usize)>,
    /// Tokens the run got through: beyond them every context is expected to fail.
    reached: usize,
}

impl Trajectory {
    /// The dry run of `cfg`'s pool over a prompt of up to `bound` tokens, on a card it never
    /// fills, ended at the first ubatch whose held memory is more than `room(c)` for the
    /// smallest context `c` (in steps) that holds it: no context from there is expected to
    /// fit. `None` for a pool that reads its room or retries, or where the run cannot be made
    /// (an error here is the probes' to report).
    pub fn of(
        cfg: &RunConfig,
        target: &PlanTarget,
        bound: usize,
        room: impl Fn(usize) -> Option<usize> + Send + 'static,
    ) -> Option<Self> {
        let kind = cfg.pool.resolve(target.vmm).ok()?;
        if !reads_no_room(cfg, kind) || bound == 0 {
            return None;
        }
        let mut c = cfg.clone();
        c.n_ctx = bound;
        c.pool.kind = Some(kind);
        let (watch, points) = Self::watch(room);
        let (report, stopped) = watched(&c, target, bound, MAX_CAPACITY, true, Some(watch)).ok()?;
        // A run ended by the watch stops at its last point (its report says completed: the
        // watch, not the pool, ended it); one that completed covers the whole prompt.
        Self::recorded(&points, report.completed && !stopped, bound)
    }

    /// The watch of a run that makes a trajectory (the dry run of a prompt of up to the longest
    /// context, on a card it never fills), and where it records it: it ends the run at the
    /// first ubatch whose held memory is more than `room(c)` for the smallest context `c` (in
    /// steps) that holds it.
    pub fn watch(room: impl Fn(usize) -> Option<usize> + Send + 'static) -> (Watch, Held) {
        let points = Arc::new(Mutex::new(Vec::new()));
        let seen = points.clone();
        let mut most = 0;
        let watch = move |done: usize, held: usize| {
            most = most.max(held);
            // A poisoned list only loses the prediction.
            if let Ok(mut p) = seen.lock() {
                p.push((done, most));
            }
            room(done.next_multiple_of(STEP)).is_some_and(|r| most <= r)
        };
        (Box::new(watch), points)
    }

    /// The trajectory [`Trajectory::watch`] recorded in `points`: over a prompt of `bound`
    /// tokens where the run `completed` it, else to its last point. `None` where the record
    /// was lost.
    pub fn recorded(
        points: &Mutex<Vec<(usize, usize)>>,
        completed: bool,
        bound: usize,
    ) -> Option<Self> {
        let points = std::mem::take(&mut *points.lock().ok()?);
        let reached = match completed {
            true => bound,
            false => points.last().map_or(0, |&(done, _)| done),
        };
        Some(Self { points, reached })
    }

    /// The most the device is expected to hold through a prompt of `n` tokens (the ubatches
    /// ending at or before it; one straddling it counts too, a prompt's last ubatch being
    /// its own); `None` beyond what the run reached.
    fn held_through(&self, n: usize) -> Option<usize> {
        if n > self.reached {
            return None;
        }
        let i = self.points.partition_point(|&(done, _)| done < n);
        match self.points.get(i) {
            Some(&(_, held)) => Some(held),
            None => self.points.last().map(|&(_, held)| held),
        }
    }

    /// The largest context in `[lo, fail)`, in steps, whose room (`room(c)`; `None`: it does
    /// not start) is expected to hold its run; `lo` where none above it is. Bisected: the held memory
    /// grows with the context and the room is taken to shrink.
    pub fn expected(
        &self,
        lo: usize,
        fail: usize,
        mut room: impl FnMut(usize) -> Option<usize>,
    ) -> usize {
        let mut fits = |c: usize| match (self.held_through(c), room(c)) {
            (Some(h), Some(r)) => h <= r,
            _ => false,
        };
        let (mut lo, mut hi) = (lo / STEP, fail / STEP);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid * STEP) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo * STEP
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::room_beside;
    use crate::planner::test_setup::{h100, two_layers};
    use crate::planner::{max_ctx_that_fits, simulate_beside};
    use cupool_profiles::Profile;

    fn trajectory(points: &[(usize, usize)], reached: usize) -> Trajectory {
        Trajectory {
            points: points.to_vec(),
            reached,
        }
    }

    #[test]
    fn a_prompt_holds_what_its_ubatches_held_and_the_one_straddling_its_end() {
        let t = trajectory(&[(192, 10), (384, 20), (576, 30)], 576);
        assert_eq!(t.held_through(192), Some(10));
        // 256 ends inside the ubatch ending at 384.
        assert_eq!(t.held_through(256), Some(20));
        assert_eq!(t.held_through(576), Some(30));
        assert_eq!(t.held_through(768), None);
    }

    #[test]
    fn the_expected_boundary_is_the_last_context_whose_room_holds_the_run() {
        // 1 byte a position held, 10,000 - c of room.
        let points: Vec<_> = (1..=64).map(|i| (i * 256, i * 256)).collect();
        let t = trajectory(&points, 64 * 256);
        let room = |c: usize| 10_000usize.checked_sub(c);
        // 4,864 holds 4,864 <= 5,136; 5,120 holds 5,120 > 4,880.
        assert_eq!(t.expected(256, 64 * 256, room), 4_864);
        // Nothing in the bracket fits: its low end.
        assert_eq!(t.expected(5_120, 64 * 256, room), 5_120);
    }

    /// Pools that read their room or free their cache and retry get no trajectory: mainline's
    /// legacy pool (it retries since PR #22155), any legacy pool under a purge policy (libcupool
    /// retries there), a legacy pool purged `auto`.
    #[test]
    fn a_pool_that_reads_its_room_or_retries_has_no_trajectory() {
        let none = |profile, purge| {
            let cfg = two_layers(profile, PoolKind::Legacy, purge, STEP);
            let t = h100(&cfg, 80 << 30);
            Trajectory::of(&cfg, &t, 4096, |_| Some(usize::MAX)).is_none()
        };
        assert!(none(Some(Profile::Llama), PurgePolicy::Never));
        assert!(none(Some(Profile::IkLlama), PurgePolicy::Always));
        assert!(none(None, PurgePolicy::Auto));
        assert!(!none(Some(Profile::LlamaB8833), PurgePolicy::Never));
        assert!(!none(None, PurgePolicy::Never));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Where the prompt filling the context decides the search's answer (it fits there and
        /// fails a step above: no shorter prompt's last ubatch decides it), one dry run's
        /// trajectory expects the answer for every pool that has one (within four steps where
        /// the pool retries),
        /// on a 2-layer Llama-3-8B shape and each context's own compute buffer: the search's
        /// probes start there, so the trajectory must be that close to save any. (A prompt
        /// ending in a short ubatch may hold more than the longer one the trajectory ran, where
        /// its flash attention splits the KV range: its probes correct that.)
        #[test]
        fn the_trajectory_expects_the_search_s_answer(
            profile in proptest::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833)]),
            (kind, purge) in proptest::sample::select(vec![
                (PoolKind::Legacy, PurgePolicy::Never),
                (PoolKind::Vmm, PurgePolicy::Never),
                (PoolKind::Vmm, PurgePolicy::Always),
                (PoolKind::Vmm, PurgePolicy::Auto),
            ]),
            room_mib in 200usize..1200,
        ) {
            let cfg = two_layers(profile, kind, purge, STEP);
            let (w, _) = cfg.resident_bytes(STEP);
            let outside = h100(&cfg, 0).outside.at_compute();
            let t = h100(&cfg, w + outside + (room_mib << 20));
            let Some(answer) = max_ctx_that_fits(&cfg, &t).unwrap() else {
                return Ok(());
            };
            let room = |c: usize| {
                let (w, kv) = cfg.resident_bytes(c);
                room_beside(&t, (w, kv, cfg.compute_buffer_bytes(c))).ok()
            };
            let full_fits = |c: usize| {
                let mut c2 = cfg.clone();
                c2.n_ctx = c;
                simulate_beside(&c2, &t, c, c2.startup_bytes(c)).unwrap().stop.is_none()
            };
            proptest::prop_assume!(full_fits(answer) && !full_fits(answer + STEP));
            let bound = 16 * answer;
            let (c2, t2) = (cfg.clone(), t);
            let floor_room = move |c: usize| {
                let (w, kv) = c2.resident_bytes(c);
                room_beside(&t2, (w, kv, c2.compute_floor_bytes(c))).ok()
            };
            let traj = Trajectory::of(&cfg, &t, bound, floor_room).expect("a trajectory");
            let expected = traj.expected(STEP, bound, room);
            // Exact where nothing retries; a pool purged under libcupool's policies retries a
            // failed allocation after releasing what it holds idle, and completes a step or four
            // above where its held memory passes the room (the gallop from the expectation
            // takes 1, 2 and 4 steps).
            let reach = if purge == PurgePolicy::Never { 0 } else { 4 * STEP };
            proptest::prop_assert!(
                expected.abs_diff(answer) <= reach,
                "expected {expected}, the search answered {answer}"
            );
        }
    }
}
