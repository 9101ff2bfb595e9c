//! The runtime running a real engine's profile instead of its own layers
//! (`EngineKind::Profile`): the profile says what each op takes from the pool, in the engine's
//! order, and this takes it (the dry-run executor computes nothing). The planner asks it too,
//! for one layer's requests, without an engine.

use crate::config::RunConfig;
use crate::engine_kind::EngineKind;
use crate::error::RuntimeError;
use crate::fast_forward::FastForward;
use crate::held::{take_call, Held};
use cupool_pool::Pool;
use cupool_profiles::{Device, EngineModel, OpCall, Profile, Setup, UbatchShape};
use std::sync::Arc;

mod around;
pub(crate) use around::Around;
use around::Keep;

/// An engine profile's requests, op by op (the dry-run executor computes nothing): each op
/// takes its held buffers, its inner ones in turn, and returns them in reverse. In a dry
/// run, the layers between the first one that made no driver call and the last one repeat
/// it exactly and are skipped; the last layer (output rows only) and the output matrix run.
/// A dry run passes `around`, where the ops around each kind of layer's attention are kept
/// for the sizes of ubatch asked: it asks the profile for the attention alone (the only part
/// that changes with the KV length, from one ubatch to the next). `labels`: whether `pool`
/// records the requests' names (a trace).
pub(crate) fn take_ubatch<P: Pool + ?Sized>(
    (pool, labels): (&P, bool),
    u: UbatchShape,
    (profile, s): (Profile, Setup),
    ff: &FastForward,
    mut around: Option<&mut Around>,
) -> Result<(), RuntimeError> {
    let m = &s.model;
    let mut held = Held::new(pool, labels);
    // The attention, asked first: it refuses what a layer refuses.
    let attention = match around.as_deref_mut() {
        Some(around) => around.attention(profile, &s, u)?,
        None => Arc::from([]),
    };
    let mut l = 0;
    while l < m.n_layer {
        let mark = ff.mark();
        match around.as_deref_mut() {
            Some(around) => {
                let (before, after) = around.get(profile, &s, u, l);
                for c in before.iter().chain(attention.iter()).chain(after) {
                    take_call(&mut held, c, ff)?;
                }
            }
            None => {
                for c in &profile.layer(&s, u, l)? {
                    take_call(&mut held, c, ff)?;
                }
            }
        }
        l += 1;
        if l + 1 < m.n_layer && ff.repeats(mark) {
            // The layers up to the next of another kind (the first expert layer after the
            // dense ones) or the last repeat the one that made no driver call.
            let next_kind = m.n_dense_lead;
            l = if m.moe.is_some() && l <= next_kind && next_kind < m.n_layer - 1 {
                next_kind
            } else {
                m.n_layer - 1
            };
        }
    }
    if let Some(c) = profile.output(&s, u) {
        take_call(&mut held, &c, ff)?;
    }
    Ok(())
}

/// Which kind layer `l` of `m` is: the dense layers before the experts, and the last (output
/// rows only), differ from the rest; layers of one kind make the same requests.
fn layer_kind(m: &EngineModel, l: usize) -> (bool, bool) {
    (m.moe.is_some() && l < m.n_dense_lead, l + 1 == m.n_layer)
}

/// What an auto purge keeps for the profile's ubatch `u`: the first layer's requests (every
/// layer of its kind repeats them), the first expert layer's after dense ones, the last
/// layer's and the output matrix's. A dry run passes `around` (see [`take_ubatch`]).
pub(crate) fn keep(
    u: UbatchShape,
    (profile, s): (Profile, Setup),
    around: Option<&mut Around>,
) -> Result<Vec<usize>, RuntimeError> {
    let m = &s.model;
    let layers = || {
        let mut layers = vec![0];
        if m.moe.is_some() && m.n_dense_lead > 0 && m.n_dense_lead < m.n_layer - 1 {
            layers.push(m.n_dense_lead);
        }
        layers.push(m.n_layer - 1);
        layers
    };
    let mut keep = Keep::default();
    match around {
        None => {
            for l in layers() {
                profile.layer(&s, u, l)?.iter().for_each(|c| keep.add(c));
            }
        }
        Some(around) => {
            // The same list for the same shape, whichever boundary asks.
            return around.keep(u, |around| {
                // The attention, asked first: it refuses what a layer refuses. What is kept
                // does not depend on the order of the ops (each counts on its own) nor on how
                // often one counts: the attention once, the ops around it as counted when
                // first asked.
                around
                    .attention(profile, &s, u)?
                    .iter()
                    .for_each(|c| keep.add(c));
                for l in layers() {
                    keep.merge(around.kept(profile, &s, u, l));
                }
                profile.output(&s, u).iter().for_each(|c| keep.add(c));
                Ok(keep.sizes())
            });
        }
    }
    profile.output(&s, u).iter().for_each(|c| keep.add(c));
    Ok(keep.sizes())
}

/// Whether no dry run of `cfg`, at any context, fails on a refusal of its engine profile: the
/// profile (if any: cupool's own engine refuses nothing) accepts every ubatch a run can ask,
/// 1 to `n_ubatch` tokens, with or without an output row, in its first and last layers. A
/// profile's refusals depend on the model, the types and the device and on the ubatch's tokens
/// and output rows; on the KV length only where it is shorter than the tokens, which a run
/// never asks (a property test below holds the profiles to that). Asking costs a call per size:
/// beyond 4,096 tokens per ubatch this answers no.
pub(crate) fn refuses_no_ubatch(cfg: &RunConfig) -> bool {
    let (profile, s) = match setup(cfg) {
        Ok(Some(p)) => p,
        Ok(None) => return true,
        Err(_) => return false,
    };
    let layers = [0, s.model.n_layer.saturating_sub(1)];
    cfg.n_ubatch <= 4096
        && (1..=cfg.n_ubatch).all(|n_tokens| {
            (0..=1).all(|n_outputs| {
                let u = UbatchShape {
                    n_tokens,
                    n_kv: n_tokens,
                    n_outputs,
                };
                layers.iter().all(|&l| profile.layer(&s, u, l).is_ok())
            })
        })
}

/// The most the engine profile of a run holds from the pool at once in the first layer of a
/// ubatch of `n_tokens` over `n_kv` positions, in bytes ([`OpCall::high_water`]: each op
/// returns what it took before the next), for the search's short last ubatches: the part
/// around the attention is kept by size, the same at every context the search tries, and only
/// the attention is asked each time. The search's choice of the short last ubatch to check
/// starts from it (`planner/tail.rs`): the sum of the requests misleads there (in ik_llama.cpp
/// a ubatch of 257-384 tokens holds more at once than one of 511 whose requests add up to
/// more, and its prompt needed 4 MiB more of the pool).
pub(crate) struct LayerBytes {
    /// The profile (`None` without one), or `Err` where it cannot be set up.
    setup: Result<Option<(Profile, Setup)>, ()>,
    /// What the ops around the attention hold, by tokens: (the most at once, requests).
    around: Vec<Option<(usize, usize)>>,
}

impl LayerBytes {
    /// For `cfg`'s profile (its context aside: the bytes do not depend on it).
    pub fn new(cfg: &RunConfig) -> Self {
        Self {
            setup: setup(cfg).map_err(|_| ()),
            around: Vec::new(),
        }
    }

    /// Whether the run has a profile to ask.
    pub fn profiled(&self) -> bool {
        matches!(self.setup, Ok(Some(_)))
    }

    /// What the layer holds: `Some(None)` without a profile, `None` where the profile refuses
    /// that ubatch (or cannot be set up).
    pub fn of(&mut self, n_tokens: usize, n_kv: usize) -> Option<Option<LayerHeld>> {
        let Ok(setup) = &self.setup else {
            return None;
        };
        let Some((profile, s)) = setup else {
            return Some(None);
        };
        let u = UbatchShape {
            n_tokens,
            n_kv,
            n_outputs: 0,
        };
        // Asked first: the attention refuses what the layer refuses.
        let attention = profile.attention(s, u).ok()?;
        // (the most held at once, requests)
        let held = |calls: &[OpCall]| {
            let most = calls.iter().map(|c| c.high_water(HIGH_WATER_ALIGN)).max();
            let requests = calls.iter().map(|c| c.request_count()).sum::<usize>();
            (most.unwrap_or(0), requests)
        };
        if self.around.len() <= n_tokens {
            self.around.resize(n_tokens + 1, None);
        }
        let around = *self.around[n_tokens].get_or_insert_with(|| {
            let (before, after) = profile.layer_around(s, n_tokens, 0, 0);
            let ((b, nb), (a, na)) = (held(&before), held(&after));
            (b.max(a), nb + na)
        });
        let (attention, n) = held(&attention);
        Some(Some(LayerHeld {
            most: around.0.max(attention),
            requests: around.1 + n,
        }))
    }
}

/// What a profile's layer holds from the pool in a ubatch ([`LayerBytes::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerHeld {
    /// The most bytes held at once.
    pub most: usize,
    /// How many requests the layer makes: where it changes, the profile computes the ubatch
    /// another way (a split of the KV range, another kernel).
    pub requests: usize,
}

/// What [`LayerBytes`] rounds each request up to: the pools' alignment.
const HIGH_WATER_ALIGN: usize = 256;

/// The engine profile of `cfg`, if any, with what it is asked about.
pub(crate) fn setup(cfg: &RunConfig) -> Result<Option<(Profile, Setup)>, RuntimeError> {
    let EngineKind::Profile { profile, cc } = cfg.engine else {
        return Ok(None);
    };
    let setup = Setup {
        // A model given whole (a GGUF file's) is the profile's as it is; a preset takes the
        // shape's overrides.
        model: match &cfg.engine_model {
            Some(m) => m.clone(),
            None => engine_model(&cfg.model)?,
        },
        weights: cfg.weight_type,
        kv: cfg.kv_type,
        dev: Device {
            cc,
            nsm: cfg.sms,
            occupancy: cfg.fa_occupancy,
        },
    };
    Ok(Some((profile, setup)))
}

fn engine_model(s: &crate::model::ModelShape) -> Result<EngineModel, RuntimeError> {
    let preset = EngineModel::preset(&s.name).ok_or_else(|| {
        RuntimeError::Invalid(format!(
            "engine profiles model the presets {:?}, not {:?}",
            EngineModel::PRESETS,
            s.name
        ))
    })?;
    if preset.mla.is_some() {
        // The shape describes MLA as flash attention sees it (576/512 over one cache head);
        // the profile takes the preset's latent ranks and heads, and the run's layers.
        let dense_lead = preset.n_dense_lead.min(s.n_layer.saturating_sub(1));
        return Ok(EngineModel {
            n_layer: s.n_layer,
            n_dense_lead: dense_lead,
            ..preset
        });
    }
    if s.head_dim_k != s.head_dim_v || s.v_is_k {
        return Err(RuntimeError::Invalid(format!(
            "engine profiles model K and V heads of one dimension, not {} and {}",
            s.head_dim_k, s.head_dim_v
        )));
    }
    Ok(EngineModel {
        n_layer: s.n_layer,
        n_embd: s.n_embd,
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim_k,
        n_ff: s.n_ff,
        ..preset
    })
}

#[cfg(test)]
#[path = "profiled_tests.rs"]
mod tests;
