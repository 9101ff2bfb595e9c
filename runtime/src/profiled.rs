//! The runtime running a real engine's profile instead of its own layers
//! (`EngineKind::Profile`): the profile says what each op takes from the pool, in the engine's
//! order, and this takes it (the dry-run executor computes nothing). The planner asks it too,
//! for one layer's requests, without an engine.

use crate::config::RunConfig;
use crate::engine_kind::EngineKind;
use crate::error::RuntimeError;
use crate::fast_forward::FastForward;
use cupool_pool::adaptors::label;
use cupool_pool::{Pool, PoolBuffer};
use cupool_profiles::{Device, EngineModel, OpCall, Profile, Setup, UbatchShape};
use std::sync::Arc;

/// An engine profile's requests, op by op (the dry-run executor computes nothing): each op
/// takes its held buffers, its inner ones in turn, and returns them in reverse. In a dry
/// run, the layers between the first one that made no driver call and the last one repeat
/// it exactly and are skipped; the last layer (output rows only) and the output matrix run.
pub(crate) fn take_ubatch(
    pool: &Arc<dyn Pool>,
    u: UbatchShape,
    (profile, s): (Profile, Setup),
    ff: FastForward,
) -> Result<(), RuntimeError> {
    let m = &s.model;
    let mut l = 0;
    while l < m.n_layer {
        let mark = ff.mark(pool.as_ref());
        for c in profile.layer(&s, u, l)? {
            take_call(pool, &c, ff)?;
        }
        l += 1;
        if l + 1 < m.n_layer && ff.repeats(pool.as_ref(), mark) {
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
        take_call(pool, &c, ff)?;
    }
    Ok(())
}

/// What an auto purge keeps for the profile's ubatch `u`: the first layer's requests (every
/// layer of its kind repeats them), the first expert layer's after dense ones, the last
/// layer's and the output matrix's.
pub(crate) fn keep(
    u: UbatchShape,
    (profile, s): (Profile, Setup),
) -> Result<Vec<usize>, RuntimeError> {
    let m = &s.model;
    let mut calls = profile.layer(&s, u, 0)?;
    if m.moe.is_some() && m.n_dense_lead > 0 && m.n_dense_lead < m.n_layer - 1 {
        calls.extend(profile.layer(&s, u, m.n_dense_lead)?);
    }
    calls.extend(profile.layer(&s, u, m.n_layer - 1)?);
    calls.extend(profile.output(&s, u));
    Ok(keep_for(&calls))
}

/// What the engine profile of `cfg` asks of the pool in the first layer of a ubatch of
/// `n_tokens` over `n_kv` positions, in bytes (the sum of its requests): `None` without a
/// profile, an error where the profile refuses that ubatch.
pub(crate) fn layer_bytes(
    cfg: &RunConfig,
    n_tokens: usize,
    n_kv: usize,
) -> Result<Option<usize>, RuntimeError> {
    let Some((profile, s)) = setup(cfg)? else {
        return Ok(None);
    };
    let u = UbatchShape {
        n_tokens,
        n_kv,
        n_outputs: 0,
    };
    let calls = profile.layer(&s, u, 0)?;
    Ok(Some(calls.iter().flat_map(OpCall::request_bytes).sum()))
}

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

/// Takes `c`'s requests from `pool`, `c.repeat` times. When fast-forwarding (dry runs), a run
/// that made no driver call left the pool as it found it, and the runs after it would repeat it
/// exactly: they are skipped.
fn take_call(pool: &Arc<dyn Pool>, c: &OpCall, ff: FastForward) -> Result<(), RuntimeError> {
    for _ in 0..c.repeat {
        let mark = ff.mark(pool.as_ref());
        let mut held = Vec::with_capacity(c.held.len());
        for r in &c.held {
            held.push(label::with(r.name, || {
                PoolBuffer::<u8>::alloc(pool, r.bytes)
            })?);
        }
        for r in &c.inner {
            drop(label::with(r.name, || {
                PoolBuffer::<u8>::alloc(pool, r.bytes)
            })?);
        }
        for n in &c.nested {
            take_call(pool, n, ff)?;
        }
        while let Some(b) = held.pop() {
            drop(b);
        }
        if ff.repeats(pool.as_ref(), mark) {
            break;
        }
    }
    Ok(())
}

/// What an auto purge keeps for a ubatch of `calls`: for each request size, as many buffers as
/// one op holds at once (ops run one after another), largest first.
fn keep_for(calls: &[OpCall]) -> Vec<usize> {
    let mut most: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for c in calls {
        let mut here: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for b in c.request_bytes() {
            *here.entry(b).or_default() += 1;
        }
        for (b, n) in here {
            let e = most.entry(b).or_default();
            *e = (*e).max(n);
        }
    }
    let mut keep: Vec<usize> = most
        .into_iter()
        .flat_map(|(b, n)| std::iter::repeat_n(b, n))
        .collect();
    keep.sort_unstable_by(|a, b| b.cmp(a));
    keep
}
