//! Dry runs of several prompts at once: prompts of one context share every ubatch but their
//! last one or two, and the planner checks several of them (the full prompt and its tail;
//! every short last ubatch a legacy pool may peak in: `planner/tail.rs`). The ubatches they share run once; at the last one, after
//! its layers and before its boundary (whose purge reads the next ubatch, which is each
//! prompt's own), the pool and the simulated device are snapshotted, and each prompt goes on
//! from there in turn, the state put back before the next ([`cupool_pool::PoolSnapshot`]).

use super::Engine;
use crate::error::RuntimeError;
use crate::fast_forward::FastForward;
use crate::report::RunReport;
use cupool_pool::driver::sim::{SimDevice, SimSnapshot};
use cupool_pool::{OomReport, PoolSnapshot};
use std::time::Instant;

/// The engine's side of a snapshot: where the decode stands.
pub(super) struct At {
    pool: PoolSnapshot,
    device: SimSnapshot,
    pos: usize,
    ubatch_index: usize,
    ff: FastForward,
    room_read: usize,
}

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
        self.prompts_from(tokens, lens, sim, 0)
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
    /// [`Engine::alike`]), run already: its prefill of the longest prompt started.
    pub(super) fn prompts_from(
        &mut self,
        tokens: &[i32],
        lens: &[usize],
        sim: &SimDevice,
        from: usize,
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
        if let Some(oom) = self.run_ubatches(&list, from, before, &mut rows)? {
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

    /// Where the decode stands, with the pool's and the device's state.
    pub(super) fn at(&self, sim: &SimDevice) -> Result<At, RuntimeError> {
        let device = sim.snapshot().ok_or_else(|| {
            RuntimeError::Invalid("a device backed by host memory keeps no snapshot".into())
        })?;
        Ok(At {
            pool: self.pool.snapshot()?,
            device,
            pos: self.pos,
            ubatch_index: self.ubatch_index,
            ff: self.ff.clone(),
            room_read: self.room_read,
        })
    }

    /// Back to where [`Engine::at`] stood.
    pub(super) fn back_to(&mut self, at: &At, sim: &SimDevice) -> Result<(), RuntimeError> {
        // The pool first: every refusal is its own, and the device is left as it was then.
        self.pool.restore(&at.pool)?;
        if !sim.restore(&at.device) {
            return Err(RuntimeError::Invalid(
                "the device's snapshot could not be restored: it was taken of a device backed by host memory, and only a simulated device with fake addresses keeps one".into(),
            ));
        }
        self.pos = at.pos;
        self.ubatch_index = at.ubatch_index;
        self.ff = at.ff.clone();
        self.room_read = at.room_read;
        self.failed = false;
        Ok(())
    }
}
