//! Probes on the spare core: while a bisection probes one context, a helper thread probes
//! one of the two the bisection may probe next, and the bisection takes its result where it
//! goes there.
//!
//! A legacy pool purged `auto` fills its room before it purges, so its search is a bisection
//! (`search.rs`), each probe a dry run of most of two million positions at `-ub 64`, and each
//! the last one's child: nothing else runs meanwhile once the advice's other searches end
//! (with the configured search, or beside it: `ahead.rs`). The helper guesses the child
//! where the probe fits (either is as likely); where it guessed right two levels of the
//! bisection take one probe's time. It runs only where a core is free of the planner's other
//! threads ([`Claim`]), and its probes keep checkpoints of their own runs (`scout.rs`).
//!
//! A probe's result is its context's and buffer's alone (from any checkpoint, a dry run from
//! the start's: `scout_tests.rs`), so the bisection's probes, and its answer, are what it
//! makes alone; the helper only makes some of them sooner. An error there is not kept: the
//! bisection runs that probe itself, and meets the error as it would.

use super::probe::fits_beside;
use super::scout::Scout;
use super::PlanTarget;
use crate::config::RunConfig;
use crate::profiled::LayerBytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The planner's threads at work (searches, their helpers), process-wide.
static AT_WORK: AtomicUsize = AtomicUsize::new(0);

/// A thread of the planner at work, counted while it lives.
pub(super) struct Claim(());

impl Claim {
    /// A thread that works whatever else does (a search).
    pub fn take() -> Self {
        AT_WORK.fetch_add(1, Ordering::Relaxed);
        Self(())
    }

    /// A helper's, where a core is free of the planner's other threads.
    pub fn spare() -> Option<Self> {
        #[cfg(test)]
        if let Some(given) = HELPER.get() {
            return given.then(Self::take);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        AT_WORK
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < cores).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        AT_WORK.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: whether searches on this thread have a helper whatever else runs (`None`: where
    /// a core is free), and how many probes they took from one.
    pub(super) static HELPER: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    pub(super) static TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A probe: (context, compute buffer).
type Key = (usize, usize);

/// The helper's side (see the module docs).
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled as a probe is asked for and as one ends.
    changed: Condvar,
    /// The search ended: the helper's run stops at its next ubatch.
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    /// The next probe to make (a newer guess replaces it).
    asked: Option<Key>,
    /// The probe being made.
    running: Option<Key>,
    /// Results made, each until taken.
    done: HashMap<Key, Option<usize>>,
    /// The helper ended.
    ended: bool,
    /// Whether the latest probe the search took was the helper's: its runs' checkpoints are
    /// then the nearest the next probe's room.
    latest_there: bool,
}

/// A helper thread making one search's probes ahead (see the module docs).
pub(super) struct Spare {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spare {
    /// A helper for probes of `cfg` on `target` up to `top` (the search's bound), where a core
    /// is free and the pool's probe runs keep checkpoints; `None` else.
    pub fn new(cfg: &RunConfig, target: &PlanTarget, top: usize) -> Option<Self> {
        if !Scout::keeps_probes(cfg, target) {
            return None;
        }
        let claim = Claim::spare()?;
        let shared = Arc::new(Shared::default());
        let (cfg, target, theirs) = (cfg.clone(), *target, shared.clone());
        let thread = std::thread::Builder::new()
            .name("cupool-spare-probe".into())
            .spawn(move || {
                let _claim = claim;
                // Whatever ends the helper (a panic included), a wait on it ends.
                let _end = Ended(&theirs);
                help(&theirs, &cfg, &target, top);
            })
            .ok()?;
        Some(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for a probe (`(context, compute buffer)`), unless made or being made.
    pub fn ask(&self, key: Key) {
        if let Ok(mut st) = self.shared.state.lock() {
            if st.running != Some(key) && !st.done.contains_key(&key) {
                st.asked = Some(key);
            }
        }
        self.shared.changed.notify_all();
    }

    /// Whether the helper makes or made a probe.
    pub fn has(&self, key: Key) -> bool {
        self.shared
            .state
            .lock()
            .is_ok_and(|st| st.running == Some(key) || st.done.contains_key(&key))
    }

    /// A probe's result where the helper made it (once it ends, where it is making it), or
    /// makes it now, idle, where it made the search's latest (its checkpoints are the
    /// nearest); `None` where neither: the caller makes it.
    pub fn take(&self, key: Key) -> Option<Option<usize>> {
        let mut st = self.shared.state.lock().ok()?;
        let give = st.latest_there
            && st.running.is_none()
            && !st.done.contains_key(&key)
            && st.asked.is_none_or(|k| k == key);
        if give {
            st.asked = Some(key);
            self.shared.changed.notify_all();
        }
        while (st.running == Some(key) || give && st.asked == Some(key)) && !st.ended {
            st = self.shared.changed.wait(st).ok()?;
        }
        if st.asked == Some(key) {
            st.asked = None;
        }
        let made = st.done.remove(&key);
        st.latest_there = made.is_some();
        #[cfg(test)]
        TAKEN.set(TAKEN.get() + usize::from(made.is_some()));
        made
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Ok(mut st) = self.shared.state.lock() {
            st.asked = None;
        }
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            // A panic there lost only probes made ahead.
            let _ = t.join();
        }
    }
}

/// Marks the helper's end when dropped, a panic's unwinding included.
struct Ended<'a>(&'a Shared);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.state.lock() {
            st.ended = true;
            st.running = None;
        }
        self.0.changed.notify_all();
    }
}

/// The helper's loop: each probe asked for, from its own checkpoints, until stopped.
fn help(shared: &Shared, cfg: &RunConfig, target: &PlanTarget, top: usize) {
    let mut scout = None;
    let mut bytes = LayerBytes::new(cfg);
    loop {
        let key = {
            let Ok(mut st) = shared.state.lock() else {
                return;
            };
            while st.asked.is_none() && !shared.stop.load(Ordering::Relaxed) {
                st = match shared.changed.wait(st) {
                    Ok(st) => st,
                    Err(_) => return,
                };
            }
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
            let Some(key) = st.asked.take() else {
                continue;
            };
            st.running = Some(key);
            key
        };
        if scout.is_none() {
            scout = Scout::spare(cfg, target, top, shared.stop.clone())
                .ok()
                .flatten();
        }
        let made = fits_beside(cfg, target, key.0, key.1, &mut bytes, scout.as_mut());
        let Ok(mut st) = shared.state.lock() else {
            return;
        };
        st.running = None;
        // A stopped run's result is not its probe's.
        if let (Ok(slack), false) = (made, shared.stop.load(Ordering::Relaxed)) {
            st.done.insert(key, slack);
        }
        drop(st);
        shared.changed.notify_all();
    }
}

#[cfg(test)]
#[path = "spare_tests.rs"]
mod tests;
