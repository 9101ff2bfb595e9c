//! The plan and its advice at once: what the advice does that the configured search's answer
//! does not decide runs beside that search, on the other core.
//!
//! The advice tries the other settings on the asked prompt (`advice::changes`), then searches
//! the largest context of each pool and purge setting from the configured answer
//! (`advice::lower`). The tries read nothing of the configured search, and each setting's
//! search makes its scouted run and its first probes (the longest context that starts) before
//! its start counts (`search::made_ahead`): a legacy pool purged `auto` as configured searched
//! alone for a second (13 probes, a bisection), and the advice's three searches then took
//! 0.4 s more, mostly those runs. Here a helper thread makes them meanwhile, in the order the
//! advice searches them, until the advice's searches that need both cores begin; a search
//! whose setting it has not begun makes its own, one it is making waits for it. Every result
//! made ahead is the one the search would make (a probe's result is its context's and its
//! buffer's alone), so the answers are those of [`super::plan`] and [`super::advise`] one
//! after the other, however the threads run; so are the errors, met in the same order.

use super::advice::{changes, lower, search_order, Advice, Ahead, Tried};
use super::search::{made_ahead, max_ctx_that_fits};
use super::walk::Made;
use super::{plan_only, Plan, PlanTarget};
use crate::config::RunConfig;
use crate::error::RuntimeError;
use std::sync::{Condvar, Mutex};

/// [`super::plan`] of `cfg` on `target` for a prompt of `n_prompt` tokens, and
/// [`super::advise`] for it: the same plan and advice, in less time.
pub fn plan_and_advise(
    cfg: &RunConfig,
    target: &PlanTarget,
    n_prompt: usize,
) -> Result<(Plan, Advice), RuntimeError> {
    let mut p = plan_only(cfg, target, n_prompt)?;
    if p.fits {
        p.max_ctx_that_fits = max_ctx_that_fits(cfg, target)?;
        let a = super::advise(cfg, target, &p)?;
        return Ok((p, a));
    }
    let made = Making::default();
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .spawn_scoped(s, || {
                // Whatever ends this thread, the waits on it end.
                let _end = Ending(&made);
                let tried = changes(cfg, target, n_prompt);
                let tries = match &tried {
                    Ok(Tried::Search(tries)) => Some(tries.clone()),
                    _ => None,
                };
                made.tried(tried, tries.as_ref().map_or(0, Vec::len));
                if let Some(tries) = tries {
                    made.make(&tries, target);
                }
            })
            .ok();
        let searched = max_ctx_that_fits(cfg, target);
        let advice = || -> Result<Advice, RuntimeError> {
            p.max_ctx_that_fits = searched?;
            // No thread: the tries after the search, as one after the other.
            let tried = match helper.is_some() {
                true => made.wait_tried(),
                false => Some(changes(cfg, target, n_prompt)),
            };
            match tried {
                Some(tried) => match tried? {
                    Tried::Change(a) => Ok(a),
                    Tried::Search(tries) => lower(target, &p, &tries, &made),
                },
                // The helper panicked: its panic is resumed at its join.
                None => Err(RuntimeError::Invalid(
                    "the advice's helper thread ended".into(),
                )),
            }
        };
        let a = advice();
        made.close();
        if let Some(h) = helper {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
        Ok((p, a?))
    })
}

/// The tries' result and the searches' heads being made ahead, by try.
#[derive(Default)]
struct Making {
    state: Mutex<State>,
    /// Signalled as the tries end, as each head is made and as the helper ends.
    made: Condvar,
}

#[derive(Default)]
struct State {
    /// What trying the other settings gave, until the advice takes it.
    tried: Option<Result<Tried, RuntimeError>>,
    /// Each try's head: `None` until made (or taken).
    heads: Vec<Option<Made>>,
    /// The try whose head is being made.
    making: Option<usize>,
    /// Tries whose head the advice took (made or not): none is begun after.
    taken: Vec<bool>,
    /// No more heads begin.
    closed: bool,
    /// The helper ended (a panic included): nothing more comes.
    ended: bool,
}

/// Marks the helper's end when dropped, a panic's unwinding included.
struct Ending<'a>(&'a Making);

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.state.lock() {
            st.ended = true;
            st.making = None;
        }
        self.0.made.notify_all();
    }
}

impl Making {
    /// Hands over what trying the other settings gave, `n` settings to search.
    fn tried(&self, tried: Result<Tried, RuntimeError>, n: usize) {
        if let Ok(mut st) = self.state.lock() {
            st.tried = Some(tried);
            st.heads.resize_with(n, || None);
            st.taken.resize(n, false);
        }
        self.made.notify_all();
    }

    /// What trying the other settings gave, once the helper has it; `None` where it ended
    /// without (it panicked).
    fn wait_tried(&self) -> Option<Result<Tried, RuntimeError>> {
        let mut st = self.state.lock().ok()?;
        while st.tried.is_none() && !st.ended {
            st = self.made.wait(st).ok()?;
        }
        st.tried.take()
    }

    /// Makes the heads of `tries`' searches in the order they are searched, until closed.
    fn make(&self, tries: &[(RunConfig, String)], target: &PlanTarget) {
        for i in search_order(tries) {
            {
                let Ok(mut st) = self.state.lock() else {
                    return;
                };
                if st.closed {
                    return;
                }
                if st.taken.get(i).is_none_or(|&t| t) {
                    continue;
                }
                st.making = Some(i);
            }
            let head = made_ahead(&tries[i].0, target);
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            if let Some(h) = st.heads.get_mut(i) {
                *h = Some(head);
            }
            st.making = None;
            self.made.notify_all();
        }
    }
}

impl Ahead for Making {
    fn take(&self, i: usize) -> Made {
        // A poisoned lock: the helper panicked (its panic is resumed at its join, before
        // this); nothing made ahead.
        let Ok(mut st) = self.state.lock() else {
            return Made::default();
        };
        while st.making == Some(i) {
            st = match self.made.wait(st) {
                Ok(st) => st,
                Err(_) => return Made::default(),
            };
        }
        if let Some(t) = st.taken.get_mut(i) {
            *t = true;
        }
        st.heads
            .get_mut(i)
            .and_then(Option::take)
            .unwrap_or_default()
    }

    fn close(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.closed = true;
        }
    }
}
