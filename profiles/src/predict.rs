//! What a real engine asks of its pool for a prefill, from its profile
//! ([`Profile`]), replayed through a pool on the simulated device: the peak
//! reserve, the driver traffic and, on a card of given free memory, the token where the engine
//! runs out.

use crate::error::ProfileError;
use crate::events::trace_events;
use crate::profile::Profile;
use crate::setup::{Setup, UbatchShape};
use crate::sweep::{sweep_step, KV_PADDING};
use cupool_pool::trace::{replay_on_card, Card, Op, ReplayReport, TraceError};
use cupool_pool::{PoolConfig, PurgePolicy};

/// Which requests, in which order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// A prompt of `tokens` tokens in batches of `batch` and ubatches of `ubatch`, logits for
    /// the last token of each batch (llama-cli and llama-bench; llama-server asks for the
    /// prompt's last token only).
    Prompt {
        /// Prompt tokens.
        tokens: usize,
        /// Batch size (`-b`).
        batch: usize,
        /// Ubatch size.
        ubatch: usize,
    },
    /// `llama-sweep-bench -n 1` over `steps` ubatches of `ubatch`.
    Sweep {
        /// Steps.
        steps: usize,
        /// Ubatch size.
        ubatch: usize,
    },
}

/// A prefill of a real engine: what runs, on what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRun {
    /// The engine.
    pub profile: Profile,
    /// The model, its weights, the cache and the GPU.
    pub setup: Setup,
    /// Which ubatches.
    pub schedule: Schedule,
    /// Whether the engine's warm-up decode runs first ([`Profile::warm_up`]; the engines'
    /// `--no-warmup` turns it off): a prompt's tools ask for its logits, sweep-bench does not.
    pub warm_up: bool,
}

/// The engine's requests as a trace, and per phase (prefill ubatch) its first event's index and
/// the first prompt token of its prefill.
#[derive(Clone, Debug)]
pub struct EngineTrace {
    /// Whose requests.
    pub profile: Profile,
    /// Trace events.
    pub ops: Vec<Op>,
    /// (first event, first token) of each phase.
    pub phases: Vec<(usize, usize)>,
}

/// The engine's requests as a trace: a phase per prefill ubatch (the decodes of a sweep share
/// their step's phase), each ending at the engine's ubatch boundary.
pub fn engine_trace(run: &EngineRun) -> Result<EngineTrace, ProfileError> {
    let EngineRun {
        profile,
        setup,
        schedule,
        warm_up,
    } = run;
    let (profile, schedule) = (*profile, *schedule);
    let mut ops = Vec::new();
    let mut phases = Vec::new();
    let mut id = 0;
    let pad = |n: usize| n.div_ceil(KV_PADDING) * KV_PADDING;
    let (count, ubatch) = match schedule {
        Schedule::Prompt {
            tokens,
            batch,
            ubatch,
        } => {
            if batch == 0 || batch % ubatch.max(1) != 0 {
                return Err(ProfileError::Schedule(format!(
                    "batch {batch} with ubatch {ubatch}: accepted is a batch that is a whole number of ubatches"
                )));
            }
            (tokens.div_ceil(ubatch.max(1)), ubatch)
        }
        Schedule::Sweep { steps, ubatch } => (steps, ubatch),
    };
    if ubatch == 0 || count == 0 {
        return Err(ProfileError::Schedule(format!(
            "{schedule:?}: accepted are 1 or more tokens (steps) and a ubatch of 1 or more"
        )));
    }
    for j in 0..count {
        phases.push((ops.len(), j * ubatch));
        ops.push(Op::PhaseBegin {
            name: format!("ubatch {j}"),
        });
        let mut calls = Vec::new();
        if j == 0 && *warm_up {
            // Its requests share the first ubatch's phase (one token marks no end).
            let outputs = usize::from(matches!(schedule, Schedule::Prompt { .. }));
            if let Some((s, u)) = profile.warm_up(setup, outputs) {
                calls.push(profile.ubatch(&s, u)?);
            }
        }
        match schedule {
            Schedule::Prompt { tokens, batch, .. } => {
                let end = tokens.min((j + 1) * ubatch);
                let last = end == tokens || end % batch == 0;
                let u = UbatchShape {
                    n_tokens: end - j * ubatch,
                    n_kv: pad(end),
                    n_outputs: usize::from(last),
                };
                calls.push(profile.ubatch(setup, u)?);
            }
            Schedule::Sweep { .. } => {
                let s = sweep_step(j, ubatch);
                let decode = UbatchShape {
                    n_tokens: 1,
                    n_kv: s.decode_n_kv,
                    n_outputs: 1,
                };
                let prefill = UbatchShape {
                    n_tokens: s.prefill_tokens,
                    n_kv: s.prefill_n_kv,
                    n_outputs: 1,
                };
                calls.push(profile.ubatch(setup, decode)?);
                calls.push(profile.ubatch(setup, prefill)?);
            }
        }
        for c in &calls {
            id = trace_events(c, id, &mut ops);
        }
        ops.push(Op::PhaseEnd {
            name: format!("ubatch {j}"),
            prefill: true,
        });
    }
    Ok(EngineTrace {
        profile,
        ops,
        phases,
    })
}

/// A prediction: the replay's report, and where the first allocation failed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Prediction {
    /// What the pool did.
    #[serde(flatten)]
    pub replay: ReplayReport,
    /// Ubatches (sweep steps).
    pub ubatches: usize,
    /// The first prompt token of the ubatch whose allocation failed first.
    pub oom_at_token: Option<usize>,
}

/// Replays the engine's requests through `pool` under `purge`, on a card with `vram` bytes
/// for the pool (unlimited when `None`).
pub fn predict(
    run: &EngineRun,
    pool: &PoolConfig,
    purge: PurgePolicy,
    vram: Option<usize>,
) -> Result<Prediction, PredictError> {
    Ok(engine_trace(run)?.replay(pool, purge, Card::of(vram))?)
}

impl EngineTrace {
    /// Replays the trace through `pool` under `purge` on `card` (a GPU's room for the pool:
    /// its bytes and the pages each allocation takes there). A legacy pool flushes and retries
    /// on OOM as the engine's does.
    pub fn replay(
        &self,
        pool: &PoolConfig,
        purge: PurgePolicy,
        card: Card,
    ) -> Result<Prediction, TraceError> {
        let mut pool = pool.clone();
        // Under a purge policy the pool is libcupool's, which trims and retries on OOM unless
        // CUPOOL_PURGE=never.
        pool.legacy.flush_and_retry =
            self.profile.legacy_flush_and_retry() || purge != PurgePolicy::Never;
        let report = replay_on_card(&self.ops, &pool, purge, card)?;
        let oom_at_token = report.first_oom_event.map(|e| {
            let at = self.phases.partition_point(|&(start, _)| start < e) - 1;
            self.phases[at].1
        });
        Ok(Prediction {
            replay: report,
            ubatches: self.phases.len(),
            oom_at_token,
        })
    }
}

/// Why a prediction failed.
#[derive(Debug)]
pub enum PredictError {
    /// The profile refused the model or schedule.
    Profile(ProfileError),
    /// The replay failed.
    Replay(TraceError),
}

impl std::fmt::Display for PredictError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Profile(e) => write!(f, "{e}"),
            Self::Replay(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for PredictError {}

impl From<ProfileError> for PredictError {
    fn from(e: ProfileError) -> Self {
        Self::Profile(e)
    }
}

impl From<TraceError> for PredictError {
    fn from(e: TraceError) -> Self {
        Self::Replay(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EngineModel;
    use crate::setup::{Device, Weights};
    use cupool_kernels::KvType;
    use cupool_pool::PoolKind;

    fn legacy() -> PoolConfig {
        PoolConfig::default().kind(PoolKind::Legacy)
    }

    fn run(model: &str, weights: Weights, tokens: usize) -> EngineRun {
        EngineRun {
            profile: Profile::IkLlama,
            setup: Setup {
                model: EngineModel::preset(model).unwrap(),
                weights,
                kv: KvType::Q8_0,
                dev: Device::H100_SXM,
            },
            schedule: Schedule::Prompt {
                tokens,
                batch: 2048,
                ubatch: 512,
            },
            warm_up: false,
        }
    }

    #[test]
    fn a_prompt_s_ubatches_have_one_output_and_the_last_may_be_short() {
        let t = engine_trace(&run("llama3-8b", Weights::Q8_0, 1000)).unwrap();
        assert_eq!(t.phases.iter().map(|p| p.1).collect::<Vec<_>>(), [0, 512]);
        // A batch that is not a whole number of ubatches is refused.
        let mut bad = run("llama3-8b", Weights::Q8_0, 1000);
        bad.schedule = Schedule::Prompt {
            tokens: 1000,
            batch: 700,
            ubatch: 512,
        };
        assert!(engine_trace(&bad).is_err());
        // The first ubatch has no output row: 3 ops fewer (fused up-gate, down, output).
        let allocs = |ops: &[Op]| ops.iter().filter(|o| matches!(o, Op::Alloc { .. })).count();
        let (first, second) = t.ops.split_at(t.phases[1].0);
        assert!(allocs(first) < allocs(second));
    }

    #[test]
    fn a_small_card_names_the_ubatch_that_runs_out() {
        let r = run("phi3-mini", Weights::F16, 20_000);
        let free = predict(&r, &legacy(), PurgePolicy::Never, None).unwrap();
        assert_eq!(free.oom_at_token, None);
        assert_eq!(free.ubatches, 40);
        // Half the unlimited run's peak: it dies on the way, at a ubatch start.
        let half = Some(free.replay.peak_reserved_bytes / 2);
        let p = predict(&r, &legacy(), PurgePolicy::Never, half).unwrap();
        let at = p.oom_at_token.expect("runs out");
        assert!(at > 0 && at < 20_000 && at % 512 == 0, "{at}");
        // Returning what is outgrown at each boundary gets further, or through.
        let auto = predict(&r, &legacy(), PurgePolicy::Auto, half).unwrap();
        assert!(auto.oom_at_token.is_none_or(|t| t > at), "{auto:?}");
        // Bad schedules are refused.
        assert!(predict(
            &run("phi3-mini", Weights::F16, 0),
            &legacy(),
            PurgePolicy::Never,
            None
        )
        .is_err());
    }

    #[test]
    fn mainline_s_pool_no_longer_grows_with_the_context() {
        // The 12 GiB-card scenario's shape (Phi-3-mini, q8_0 cache, 20k prompt): before PR #23907 the
        // K/V copies come from the pool and its legacy reserve grows ubatch by ubatch; after it
        // the pool holds only what the matrix multiplies and stream-k take.
        let peak = |profile: Profile, tokens: usize| {
            let mut r = run("phi3-mini", Weights::Q8_0, tokens);
            r.profile = profile;
            predict(&r, &legacy(), PurgePolicy::Never, None)
                .unwrap()
                .replay
                .peak_reserved_bytes
        };
        let (old_short, old_long) = (
            peak(Profile::LlamaB8833, 4096),
            peak(Profile::LlamaB8833, 20_000),
        );
        let (new_short, new_long) = (peak(Profile::Llama, 4096), peak(Profile::Llama, 20_000));
        assert!(old_long > 3 * old_short, "{old_short} → {old_long}");
        assert_eq!(new_short, new_long);
        assert!(new_long * 20 < old_long, "{new_long} vs {old_long}");
        // b8833 and ik_llama.cpp take the same K/V copies: the same order of magnitude.
        let ik = peak(Profile::IkLlama, 20_000);
        assert!(ik / 2 < old_long && old_long < 2 * ik, "{ik} vs {old_long}");
    }
}
