//! Dry runs of several prompts at once: prompts of one context share every ubatch but their
//! last one or two, and the planner checks several of them (the full prompt and its tail;
//! every short last ubatch a legacy pool may peak in: `planner/tail.rs`). The ubatches they share run once; at the last one, after
//! its layers and before its boundary (whose purge reads the next ubatch, which is each
//! prompt's own), the pool and the simulated device are snapshotted, and each prompt goes on
//! from there in turn, the state put back before the next ([`cupool_pool::PoolSnapshot`]).

use super::checkpoint::Keep;
use super::Engine;
use crate::error::RuntimeError;
use crate::report::RunReport;
use cupool_pool::driver::sim::SimDevice;
use cupool_pool::OomReport;
use std::time::Instant;

impl Engine {
    /// Dry runs only, on a fresh engine over `sim` (the device under its pool): a prefill of
    /// each of `lens` tokens (each at most `tokens.len()`, the dry run's prompt), their reports
    /// in order, each what [`Engine::decode`] of that prompt alone reports. The pool must keep
    /// snapshots (the legacy and vmm pools: [`cupool_pool::Pool::snapshot`]).
    pub(crate) fn decode_prompts(
        &mut self,
        tokens: &[i32],
        lens: &[usize],
        sim: &SimDevice,
    ) -> Result<Vec<RunReport>, RuntimeError> {
        let Some(&longest) = lens.iter().max() else {
            return Ok(Vec::new());
        };
        self.fresh_dry_run("prompts are decoded together")?;
        if longest > tokens.len() || lens.contains(&0) {
            return Err(RuntimeError::Invalid(format!(
                "prompts of 1 to {} tokens (the prompt given) are accepted, not {lens:?}",
                tokens.len()
            )));
        }
        // The prompts' boundaries read the prompt's length only past the shared ubatches.
        self.start_decode(longest)?;
        self.ff.start(self.pool.as_ref());
        self.prompts_from(tokens, lens, sim, 0, None)
    }

    /// Refuses all but a fresh dry run's engine (nothing decoded yet, fast-forwarding), for
    /// `what`.
    pub(super) fn fresh_dry_run(&self, what: &str) -> Result<(), RuntimeError> {
        if self.pos != 0 || self.failed || !self.ff.on() {
            return Err(RuntimeError::Invalid(format!(
                "{what} only by a fresh dry run's engine (nothing decoded yet, fast-forwarding)"
            )));
        }
        Ok(())
    }

    /// How many of the ubatches of prompts of each of `lens` tokens (at least one) from
    /// position 0 they all run alike, boundaries included: all but the shortest one's last
    /// two (the last shared one's boundary reads each prompt's next ubatch).
    pub(crate) fn alike(&self, lens: &[usize]) -> usize {
        let shortest = lens.iter().copied().min().unwrap_or(0);
        self.ubatch_count(shortest).saturating_sub(2)
    }

    /// [`Engine::decode_prompts`] from its decode's first `from` ubatches (at most
    /// [`Engine::alike`]), run already: its prefill of the longest prompt started. Checkpoints
    /// of the ubatches all prompts run alike go into `keep`.
    pub(super) fn prompts_from(
        &mut self,
        tokens: &[i32],
        lens: &[usize],
        sim: &SimDevice,
        from: usize,
        keep: Keep,
    ) -> Result<Vec<RunReport>, RuntimeError> {
        let longest = lens.iter().copied().max().unwrap_or(0);
        // Every prompt's ubatches start as the longest one's, up to the shortest one's last:
        // the shared ones are those before it (each prompt then has one of its own at least).
        let list = self.split(0, &tokens[..longest]);
        let shortest = lens.iter().copied().min().unwrap_or(longest);
        let shared = self.ubatch_count(shortest) - 1;
        let started = Instant::now();
        let mut rows = Vec::new();
        // The shared ubatches but the last, boundaries and all.
        let before = shared.saturating_sub(1);
        if from > before {
            return Err(RuntimeError::Invalid(format!(
                "a decode of prompts shared {before} ubatches, not the {from} already run"
            )));
        }
        if let Some(oom) = self.run_kept(&list, (from, before), sim, &mut rows, keep)? {
            return Ok(vec![self.report(Some(oom), rows, started); lens.len()]);
        }
        // The last shared one's layers: its boundary is each prompt's.
        let mut last = None;
        if shared > 0 {
            let mark = self.ff.mark_ubatch(self.pool.as_ref());
            let (pos0, toks) = list[before];
            let ran = self.run_layers(pos0, toks)?;
            match ran.again() {
                Some(_) => last = Some((mark, ran)),
                // Out of memory there: every prompt ends alike.
                None => {
                    let oom = match self.end_ubatch(ran, (pos0 + toks.len(), 1))? {
                        Err(report) => Some((pos0, report)),
                        Ok(_) => None,
                    };
                    return Ok(vec![self.report(oom, rows, started); lens.len()]);
                }
            }
        }
        // Where each prompt's own ubatches start, after the last shared one.
        let own = list.get(shared).map_or(0, |&(p, _)| p);
        let at = self.at(sim)?;
        let mut reports = Vec::with_capacity(lens.len());
        for (k, &len) in lens.iter().enumerate() {
            if k > 0 {
                self.back_to(&at, sim)?;
            }
            self.prefill_tokens = len;
            // The last shared ubatch, then the prompt's own.
            let mut local: Vec<(usize, &[i32])> = list[before..shared].to_vec();
            local.extend(self.cuts(0, own, len).map(|(p, n)| (p, &tokens[p..p + n])));
            let mut rows = rows.clone();
            let oom = self.finish(&local, last.as_ref(), &mut rows)?;
            reports.push(self.report(oom, rows, started));
        }
        Ok(reports)
    }

    /// How many ubatches a prompt of `n` tokens from position 0 takes.
    pub(crate) fn ubatch_count(&self, n: usize) -> usize {
        self.cuts(0, 0, n).count()
    }

    /// One prompt's ubatches in `list`: where `last` holds the last shared ubatch's mark and
    /// layers, `list` starts with it and it ends here, with this prompt's next ubatch.
    fn finish(
        &mut self,
        list: &[(usize, &[i32])],
        last: Option<&(crate::fast_forward::Mark, super::ubatch::Ran)>,
        rows: &mut Vec<crate::report::UbatchRow>,
    ) -> Result<Option<(usize, Box<OomReport>)>, RuntimeError> {
        let mut from = 0;
        if let Some((mark, ran)) = last {
            if let (Some(ran), Some(&(pos, toks))) = (ran.again(), list.get(1)) {
                if let Err(report) = self.end_ubatch(ran, (pos, toks.len()))? {
                    return Ok(Some((list[0].0, report)));
                }
                from = 1 + self.skip_after(list, 0, list.len(), *mark);
            }
        }
        self.run_ubatches(list, from, list.len(), rows)
    }
}
