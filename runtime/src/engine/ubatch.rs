//! One ubatch of the engine: a pool phase around the layers, then the boundary (the purge
//! that [`Boundary::decide`] asks for) and the budget check.

use super::{Engine, Phased};
use crate::error::RuntimeError;
use crate::layer::{Model, Ubatch};
use crate::profiled;
use crate::report::UbatchRow;
use crate::scratch::Scratch;
use cupool_kernels::fa;
use cupool_pool::adaptors::label;
use cupool_pool::{synchronize, Boundary, OomReport, Pool, PoolBuffer, Purge};
use cupool_profiles::{Profile, Setup, UbatchShape};
use std::sync::Arc;
use std::time::Instant;

/// A ubatch's live peak, and its reserve peak and driver allocations where its phase counted
/// them (not in a dry run, which keeps no row).
#[derive(Clone, Copy)]
struct UbatchPeaks {
    live: usize,
    row: Option<(usize, u64)>,
}

/// A ubatch whose layers have run, before its boundary ([`Engine::end_ubatch`]).
pub(super) struct Ran {
    index: usize,
    pos0: usize,
    n_tokens: usize,
    n_kv: usize,
    t0: Instant,
    phase: UbatchPeaks,
    /// The layers' result: an error ends the run there.
    pub result: Result<(), RuntimeError>,
}

impl Ran {
    /// The same ubatch, for another boundary after it: `None` where its layers failed (the
    /// run ends there whatever follows).
    pub fn again(&self) -> Option<Ran> {
        self.result.is_ok().then_some(Ran {
            result: Ok(()),
            ..*self
        })
    }
}

impl Engine {
    /// One ubatch: its row, or none in a dry run. The outer error is fatal; the inner one is an
    /// OOM that ends the run.
    pub(super) fn ubatch(
        &mut self,
        pos0: usize,
        tokens: &[i32],
        next: (usize, usize),
    ) -> Result<Result<Option<UbatchRow>, Box<OomReport>>, RuntimeError> {
        let ran = self.run_layers(pos0, tokens)?;
        self.end_ubatch(ran, next)
    }

    /// A ubatch's layers, in its pool phase (and the dry run's watch after them).
    pub(super) fn run_layers(&mut self, pos0: usize, tokens: &[i32]) -> Result<Ran, RuntimeError> {
        let n_tokens = tokens.len();
        let n_kv = fa::n_kv(pos0 + n_tokens, self.cfg.n_ctx);
        let index = self.ubatch_index;
        self.ubatch_index += 1;
        let ub = Ubatch {
            index,
            pos0,
            n_tokens,
            n_kv,
            tokens,
        };
        let t0 = Instant::now();
        self.begin_phase(index);
        let result = self.layers(&ub);
        let phase = self.end_phase();
        if let (Ok(()), Some(w)) = (&result, self.watch.as_mut()) {
            self.watched = !w(pos0 + n_tokens, self.driver.mem_info()?.used());
        }
        Ok(Ran {
            index,
            pos0,
            n_tokens,
            n_kv,
            t0,
            phase,
            result,
        })
    }

    /// A ubatch's boundary, `next` the ubatch after it (its position and tokens): the purge
    /// the policy asks for, then its row (none in a dry run). The outer error is fatal; the
    /// inner one is an OOM that ends the run.
    pub(super) fn end_ubatch(
        &mut self,
        ran: Ran,
        next: (usize, usize),
    ) -> Result<Result<Option<UbatchRow>, Box<OomReport>>, RuntimeError> {
        let Ran {
            index,
            pos0,
            n_tokens,
            n_kv,
            t0,
            phase,
            result,
        } = ran;
        let prefill = n_tokens > 1;
        // Decided before the phase closes in a recording: its keep list belongs to the phase.
        let purge = match (&result, prefill) {
            (Ok(()), true) => self.boundary_purge(next, phase.live)?,
            _ => None,
        };
        if let Some(r) = &self.recorder {
            r.record_phase_end(prefill);
        }
        match result {
            Ok(()) => {}
            Err(RuntimeError::OutOfMemory(report)) => {
                self.failed = true;
                // A result the report carries (the caller decides whether it is an error).
                tracing::warn!(
                    ubatch = index,
                    tokens_done = pos0,
                    requested = report.requested,
                    "run ended: out of memory in ubatch {index} after {pos0} tokens"
                );
                return Ok(Err(report));
            }
            Err(e) => {
                self.failed = true;
                return Err(e);
            }
        }
        self.pos = pos0 + n_tokens;
        let purged_bytes = match purge {
            Some(what) => self.purge(what)?,
            None => 0,
        };
        // A dry run has no budget to check (it is unbounded) and keeps no row: the pool's
        // statistics a row reads are what it saves.
        let Some((reserved_peak, driver_mallocs)) = phase.row else {
            return Ok(Ok(None));
        };
        let seconds = t0.elapsed().as_secs_f64();
        let stats = self.pool.stats();
        let device = self.driver.mem_info()?;
        let over = self.budget.check(
            index,
            (self.pos, self.prefill_tokens),
            reserved_peak,
            device.free,
        );
        Ok(Ok(Some(UbatchRow {
            index,
            pos0,
            n_tokens,
            n_kv,
            live_peak_bytes: phase.live,
            reserved_bytes: reserved_peak,
            cached_bytes: stats.cached_bytes,
            device_used_bytes: device.used(),
            budget_bytes: self.budget.bytes,
            over_budget: over,
            driver_mallocs,
            purged_bytes,
            seconds,
        })))
    }

    /// Opens ubatch `index`'s phase.
    fn begin_phase(&self, index: usize) {
        let name = || format!("ubatch {index}");
        match &self.phases {
            Phased::Phases(p) => p.begin_phase(&name()),
            Phased::Peaks(p) => p.begin(),
        }
        if let Some(r) = &self.recorder {
            r.record_phase_begin(&name());
        }
    }

    /// Closes the ubatch's phase.
    fn end_phase(&self) -> UbatchPeaks {
        match &self.phases {
            Phased::Phases(p) => {
                let s = p.end_phase().unwrap_or_default();
                UbatchPeaks {
                    live: s.live_peak_bytes,
                    row: Some((s.reserved_peak_bytes, s.calls.acquisitions())),
                }
            }
            Phased::Peaks(p) => UbatchPeaks {
                live: p.end(),
                row: None,
            },
        }
    }

    fn scratch(&self, n_tokens: usize, n_kv: usize) -> fa::FaScratch {
        let c = &self.cfg;
        fa::scratch(&c.model.attn(), c.kv_type, n_tokens, n_kv, c.sms)
    }

    /// The engine profile of the run, if any, with what it is asked about.
    fn profile(&self) -> Result<Option<(Profile, Setup)>, RuntimeError> {
        profiled::setup(&self.cfg)
    }

    /// Rows with logits in a ubatch: the last token of each batch (llama-cli and llama-bench
    /// decode a prompt in batches of `-b` tokens, each asking for its last token's logits).
    fn outputs(&self, pos0: usize, n_tokens: usize) -> usize {
        let end = pos0 + n_tokens;
        usize::from(end == self.prefill_tokens || (end - self.decode_start) % self.cfg.n_batch == 0)
    }

    fn layers(&mut self, ub: &Ubatch) -> Result<(), RuntimeError> {
        if let Some(p) = self.profile()? {
            let u = UbatchShape {
                n_tokens: ub.n_tokens,
                n_kv: ub.n_kv,
                n_outputs: self.outputs(ub.pos0, ub.n_tokens),
            };
            return self.profiled_layers((ub.index, ub.pos0), u, p);
        }
        let scratch = self.scratch(ub.n_tokens, ub.n_kv);
        let workspace = take_workspace(&self.pool, self.cfg.gemm_workspace_bytes)?;
        let model = Model {
            m: &self.cfg.model,
            kv: self.cfg.kv_type,
            b: &self.bufs,
            pool: &self.pool,
        };
        let x = self.exec.as_mut();
        if let Some(w) = &workspace {
            x.set_gemm_workspace(w.ptr(), w.len())?;
        }
        model.embed(x, ub)?;
        for layer in 0..model.m.n_layer {
            let mark = self.ff.mark();
            model.pre_attention(x, layer, ub)?;
            let s = Scratch::take(&self.pool, scratch)?;
            model.attention(x, layer, ub, &s)?;
            drop(s);
            model.feed_forward(x, ub)?;
            // Every layer takes the same scratch: one served from the cache without a driver
            // call left it as it was, and so will the rest (the dry run computes nothing).
            if self.ff.repeats(mark) {
                break;
            }
        }
        x.sync()?;
        // The GEMMs that used it have run: it goes back to the pool with the ubatch.
        x.set_gemm_workspace(0, 0)?;
        drop(workspace);
        Ok(())
    }

    /// What the boundary decision ([`Boundary::decide`]) returns after a prefill ubatch whose
    /// pool held `live_peak` bytes at once (`None`: nothing), recording an `auto` decision.
    fn boundary_purge(
        &mut self,
        (next_pos, next_tokens): (usize, usize),
        live_peak: usize,
    ) -> Result<Option<Purge>, RuntimeError> {
        let boundary = Boundary::new(self.cfg.purge, self.cfg.auto_headroom);
        // A dry run's requests around the attention, kept across its ubatches.
        let mut around = std::mem::take(&mut self.around);
        let mut read = None;
        let decision = boundary.decide(
            self.pool.as_ref(),
            live_peak,
            || {
                let m = self.driver.mem_info()?;
                read = Some(m.used());
                Ok(m.free)
            },
            || match self.nothing_to_release(next_pos + next_tokens) {
                true => Ok(Vec::new()),
                false => {
                    let around = self.ff.on().then_some(&mut around);
                    self.next_requests(next_pos, next_tokens, around)
                }
            },
        );
        self.around = around;
        let decision = decision?;
        if let (Some(used), true) = (read, self.ff.on()) {
            self.note_room_read(&boundary, &decision, used, live_peak);
        }
        if let (Some(r), Some(keep)) = (&self.recorder, decision.recorded_keep()) {
            r.record_keep(keep.map(<[usize]>::to_vec));
        }
        Ok(decision.purge())
    }

    /// Narrows [`Engine::room_read`]/`room_below` by an `auto` decision that read `used` bytes
    /// in use: from used plus the headroom's least free memory the device is not short, below
    /// it short. A decision that released nothing (nothing would be released short: a VMM
    /// pool's keep never does) is every room's.
    fn note_room_read(
        &mut self,
        boundary: &Boundary,
        decision: &cupool_pool::boundary::Decision,
        used: usize,
        live_peak: usize,
    ) {
        use cupool_pool::boundary::Decision;
        let least = boundary.headroom.least_free(live_peak);
        let at = least.map_or(usize::MAX, |l| used.saturating_add(l));
        match decision {
            Decision::KeepAll if self.pool.releasable(&Purge::KeepFor(Vec::new())) > 0 => {
                self.room_read = self.room_read.max(at)
            }
            Decision::KeepFor { release: true, .. } => self.room_below = self.room_below.min(at),
            _ => {}
        }
    }

    /// Whether a dry run's boundary may skip working out the next ubatch's requests, that
    /// one ending at `next_end`: the pool would release nothing even keeping nothing (a VMM
    /// pool's `KeepFor` never does; a legacy pool with nothing idle), so keeping anything
    /// releases nothing either, and no purge follows. That ubatch belongs to the prompt: it
    /// runs and asks its own requests, so a profile that refuses its shape still says so,
    /// as it does here otherwise (the token after the prompt is only asked here). Not in a
    /// recording, whose keep event lists the requests.
    fn nothing_to_release(&self, next_end: usize) -> bool {
        self.ff.on()
            && self.recorder.is_none()
            && next_end <= self.prefill_tokens
            && self.pool.releasable(&Purge::KeepFor(Vec::new())) == 0
    }

    /// The requests the ubatch of `next_tokens` at `next_pos` is expected to make: what an
    /// `auto` purge keeps cached buffers for.
    fn next_requests(
        &self,
        next_pos: usize,
        next_tokens: usize,
        around: Option<&mut profiled::Around>,
    ) -> Result<Vec<usize>, RuntimeError> {
        let n_kv = fa::n_kv(next_pos + next_tokens, self.cfg.n_ctx);
        Ok(match self.profile()? {
            Some(p) => {
                let u = UbatchShape {
                    n_tokens: next_tokens,
                    n_kv,
                    n_outputs: self.outputs(next_pos, next_tokens),
                };
                profiled::keep(u, p, around)?
            }
            None => {
                // The workspace, one buffer of each size the GEMMs convert q8_0
                // weights into (one at a time), the flash-attention scratch.
                let mut keep = vec![self.cfg.gemm_workspace_bytes];
                keep.retain(|&b| b > 0);
                let mut src0 = crate::layer::src0_requests(&self.cfg.model, self.cfg.weight_type);
                src0.sort_unstable_by(|a, b| b.cmp(a));
                src0.dedup();
                keep.extend(src0);
                keep.extend(self.scratch(next_tokens, n_kv).request_bytes());
                keep
            }
        })
    }

    /// Synchronizes and returns `what`; the bytes released.
    fn purge(&mut self, what: Purge) -> Result<usize, RuntimeError> {
        let token = synchronize(self.driver.as_ref())?;
        if let Some(r) = &self.recorder {
            r.record_sync();
        }
        Ok(self.pool.purge(&token, what)?.bytes)
    }
}

/// The ubatch's GEMM workspace (`cublas_workspace` in a trace), if it has one.
fn take_workspace(
    pool: &Arc<dyn Pool>,
    bytes: usize,
) -> Result<Option<PoolBuffer<u8>>, RuntimeError> {
    if bytes == 0 {
        return Ok(None);
    }
    Ok(Some(label::with("cublas_workspace", || {
        PoolBuffer::alloc(pool, bytes)
    })?))
}
